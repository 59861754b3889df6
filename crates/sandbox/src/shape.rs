//! A module's shape, checked before it is compiled: compile time grows faster than linearly
//! with some shapes (100 000 nested blocks in 300 KB take minutes), so a module over the limits
//! is refused in milliseconds instead.

use wasmparser::{Operator, Parser, Payload};

use crate::limits::Limits;

/// Checks that `wasm` defines at most `limits.max_functions` functions and that no function
/// nests blocks deeper than `limits.max_nesting`. The error says which limit, and the value
/// found. Malformed bytes pass: the compiler reports them with its own message.
pub(crate) fn check(wasm: &[u8], limits: &Limits) -> Result<(), String> {
    let mut functions: u64 = 0;
    for payload in Parser::new(0).parse_all(wasm) {
        let Ok(payload) = payload else {
            return Ok(());
        };
        match payload {
            Payload::FunctionSection(reader) => {
                functions += u64::from(reader.count());
                if functions > u64::from(limits.max_functions) {
                    return Err(format!(
                        "it defines {functions} functions, more than the {} allowed",
                        limits.max_functions
                    ));
                }
            }
            Payload::CodeSectionEntry(body) => {
                let Ok(mut ops) = body.get_operators_reader() else {
                    return Ok(());
                };
                let (mut depth, mut deepest) = (0u32, 0u32);
                while !ops.eof() {
                    let Ok(op) = ops.read() else {
                        return Ok(());
                    };
                    match op {
                        Operator::Block { .. }
                        | Operator::Loop { .. }
                        | Operator::If { .. }
                        | Operator::Try { .. }
                        | Operator::TryTable { .. } => {
                            depth += 1;
                            deepest = deepest.max(depth);
                            if depth > limits.max_nesting {
                                return Err(format!(
                                    "a function nests blocks more than {} deep, the most allowed",
                                    limits.max_nesting
                                ));
                            }
                        }
                        Operator::End => depth = depth.saturating_sub(1),
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    Ok(())
}
