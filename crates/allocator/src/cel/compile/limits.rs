//! The structural limits: bracket nesting checked on the text before the parser reads it,
//! and the depth of the parsed tree after.

use cel::common::ast::{EntryExpr, Expr, IdedExpr};

use crate::cel::{CompileError, MAX_NESTING};

/// Rejects bracket nesting deeper than the parser's limit before the parser sees it, so
/// the parser's own recursion stays small.
pub(super) fn check_lexical_nesting(expression: &str) -> Result<(), CompileError> {
    let mut depth = 0usize;
    let mut quote: Option<u8> = None;
    let bytes = expression.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        match quote {
            Some(q) => {
                if b == b'\\' {
                    i += 1;
                } else if b == q {
                    quote = None;
                }
            }
            None => match b {
                b'"' | b'\'' => quote = Some(b),
                b'(' | b'[' | b'{' => {
                    depth += 1;
                    if depth > MAX_NESTING {
                        return Err(CompileError::TooDeep {
                            depth,
                            limit: MAX_NESTING,
                        });
                    }
                }
                b')' | b']' | b'}' => depth = depth.saturating_sub(1),
                _ => {}
            },
        }
        i += 1;
    }
    Ok(())
}

/// Depth of the parsed tree, computed without recursion.
pub(super) fn ast_depth(root: &IdedExpr) -> usize {
    let mut max = 0;
    let mut stack: Vec<(&IdedExpr, usize)> = vec![(root, 1)];
    while let Some((e, d)) = stack.pop() {
        max = max.max(d);
        match &e.expr {
            Expr::Call(c) => {
                if let Some(t) = &c.target {
                    stack.push((t, d + 1));
                }
                stack.extend(c.args.iter().map(|a| (a, d + 1)));
            }
            Expr::Comprehension(c) => {
                for x in [
                    &c.iter_range,
                    &c.accu_init,
                    &c.loop_cond,
                    &c.loop_step,
                    &c.result,
                ] {
                    stack.push((x, d + 1));
                }
            }
            Expr::List(l) => stack.extend(l.elements.iter().map(|a| (a, d + 1))),
            Expr::Map(m) => {
                for entry in &m.entries {
                    if let EntryExpr::MapEntry(me) = &entry.expr {
                        stack.push((&me.key, d + 1));
                        stack.push((&me.value, d + 1));
                    }
                }
            }
            Expr::Struct(s) => {
                for entry in &s.entries {
                    if let EntryExpr::StructField(f) = &entry.expr {
                        stack.push((&f.value, d + 1));
                    }
                }
            }
            Expr::Select(s) => stack.push((&s.operand, d + 1)),
            Expr::Ident(_) | Expr::Literal(_) | Expr::Unspecified => {}
        }
    }
    max
}
