//! Whether a module's state after a call can be put back exactly as instantiation left it,
//! so that one instance serves call after call, each starting from the state a fresh
//! instance starts in.
//!
//! An instance's state is its linear memory, its mutable globals, its tables, its dropped
//! segments and whatever its start function did. The host restores the memory (it can read
//! and write it) and the mutable globals; to reach globals the module does not export, the
//! module is rewritten before compiling with one more export per mutable global. Everything
//! else must not change, which is checked here: a module restorable in this sense has no
//! start function, no shared memory, no imported memory, table or global, only numeric
//! mutable globals, and no instruction that changes a table or drops a segment. Any other
//! module runs every call on a fresh instance.

use std::ops::Range;

use wasm_encoder::{ExportKind, ExportSection, RawSection};
use wasmparser::{ExternalKind, Operator, Parser, Payload, TypeRef, ValType};

/// The export name the rewritten module gives its mutable global number `index`.
fn global_export(index: u32) -> String {
    format!("{GLOBAL_EXPORT_PREFIX}{index}")
}

/// Prefix of the exports added for mutable globals; a module whose own exports already use
/// it is left alone.
const GLOBAL_EXPORT_PREFIX: &str = "kubedev:state:global:";

/// How to restore a module's instances: the module to compile, and the exports naming its
/// mutable globals in it.
#[derive(Debug, PartialEq)]
pub(crate) struct Restorable {
    /// The module with an export per mutable global (`None`: it has none, compile as is).
    pub(crate) rewritten: Option<Vec<u8>>,
    /// The exports naming the mutable globals.
    pub(crate) globals: Vec<String>,
}

/// The plan for `wasm`, or `None` when one of its instances cannot be restored after a call
/// (or the bytes do not parse: the compiler then says why).
pub(crate) fn plan(wasm: &[u8]) -> Option<Restorable> {
    let mut mutable = Vec::new();
    let mut export_section: Option<Range<usize>> = None;
    for payload in Parser::new(0).parse_all(wasm) {
        match payload.ok()? {
            Payload::ImportSection(reader) => {
                for import in reader.into_imports() {
                    if !matches!(import.ok()?.ty, TypeRef::Func(_)) {
                        return None;
                    }
                }
            }
            Payload::MemorySection(reader) => {
                for memory in reader {
                    if memory.ok()?.shared {
                        return None;
                    }
                }
            }
            Payload::GlobalSection(reader) => {
                for (index, global) in (0u32..).zip(reader) {
                    let ty = global.ok()?.ty;
                    if !ty.mutable {
                        continue;
                    }
                    if ty.shared
                        || !matches!(
                            ty.content_type,
                            ValType::I32 | ValType::I64 | ValType::F32 | ValType::F64
                        )
                    {
                        return None;
                    }
                    mutable.push(index);
                }
            }
            Payload::ExportSection(reader) => {
                for export in reader.clone() {
                    if export.ok()?.name.starts_with(GLOBAL_EXPORT_PREFIX) {
                        return None;
                    }
                }
                export_section = Some(reader.range());
            }
            Payload::StartSection { .. } => return None,
            Payload::CodeSectionEntry(body) => {
                let mut ops = body.get_operators_reader().ok()?;
                while !ops.eof() {
                    if changes_instance(&ops.read().ok()?) {
                        return None;
                    }
                }
            }
            _ => {}
        }
    }
    let export_section = export_section?;
    let globals: Vec<String> = mutable.iter().map(|&i| global_export(i)).collect();
    if mutable.is_empty() {
        return Some(Restorable {
            rewritten: None,
            globals,
        });
    }
    Some(Restorable {
        rewritten: Some(with_global_exports(wasm, &export_section, &mutable)?),
        globals,
    })
}

/// Whether `op` changes an instance's state other than its memory and globals.
fn changes_instance(op: &Operator<'_>) -> bool {
    matches!(
        op,
        Operator::TableSet { .. }
            | Operator::TableGrow { .. }
            | Operator::TableFill { .. }
            | Operator::TableCopy { .. }
            | Operator::TableInit { .. }
            | Operator::ElemDrop { .. }
            | Operator::DataDrop { .. }
    )
}

/// `wasm` with its export section (at `exports`) extended by an export of each global in
/// `mutable`; every other section is copied as it is.
fn with_global_exports(wasm: &[u8], exports: &Range<usize>, mutable: &[u32]) -> Option<Vec<u8>> {
    let mut module = wasm_encoder::Module::new();
    for payload in Parser::new(0).parse_all(wasm) {
        let payload = payload.ok()?;
        let Some((id, range)) = payload.as_section() else {
            continue;
        };
        if range != *exports {
            module.section(&RawSection {
                id,
                data: &wasm[range],
            });
            continue;
        }
        let Payload::ExportSection(reader) = payload else {
            return None;
        };
        let mut section = ExportSection::new();
        for export in reader {
            let export = export.ok()?;
            let kind = match export.kind {
                ExternalKind::Func | ExternalKind::FuncExact => ExportKind::Func,
                ExternalKind::Table => ExportKind::Table,
                ExternalKind::Memory => ExportKind::Memory,
                ExternalKind::Global => ExportKind::Global,
                ExternalKind::Tag => ExportKind::Tag,
            };
            section.export(export.name, kind, export.index);
        }
        for &index in mutable {
            section.export(&global_export(index), ExportKind::Global, index);
        }
        module.section(&section);
    }
    Some(module.finish())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn wasm(text: &str) -> Vec<u8> {
        wat::parse_str(text).unwrap()
    }

    #[test]
    fn a_module_with_mutable_globals_gets_an_export_for_each() {
        let plan = plan(&wasm(
            r#"(module
                (global $sp (mut i32) (i32.const 1024))
                (global $k i32 (i32.const 7))
                (global $n (mut i64) (i64.const 0))
                (memory (export "memory") 1)
                (func (export "f") (result i32) (global.get $sp)))"#,
        ))
        .expect("restorable");
        assert_eq!(
            plan.globals,
            ["kubedev:state:global:0", "kubedev:state:global:2"]
        );
        let rewritten = plan.rewritten.expect("rewritten");
        let mut exports = Vec::new();
        for payload in Parser::new(0).parse_all(&rewritten) {
            if let Payload::ExportSection(reader) = payload.unwrap() {
                for e in reader {
                    let e = e.unwrap();
                    exports.push((e.name.to_string(), e.kind, e.index));
                }
            }
        }
        assert_eq!(
            exports,
            [
                ("memory".to_string(), ExternalKind::Memory, 0),
                ("f".to_string(), ExternalKind::Func, 0),
                (
                    "kubedev:state:global:0".to_string(),
                    ExternalKind::Global,
                    0
                ),
                (
                    "kubedev:state:global:2".to_string(),
                    ExternalKind::Global,
                    2
                ),
            ]
        );
        wasmparser::Validator::new()
            .validate_all(&rewritten)
            .expect("the rewritten module is valid");
    }

    #[test]
    fn a_module_without_mutable_globals_is_compiled_as_it_is() {
        let plan = plan(&wasm(
            r#"(module (memory (export "memory") 1) (func (export "f")))"#,
        ))
        .expect("restorable");
        assert_eq!(
            plan,
            Restorable {
                rewritten: None,
                globals: vec![]
            }
        );
    }

    #[test]
    fn state_the_host_cannot_put_back_makes_a_module_not_restorable() {
        let refused = [
            // A start function runs once per instance.
            r#"(module (memory (export "memory") 1) (func $s) (start $s))"#,
            // Tables changed by instructions.
            r#"(module (memory (export "memory") 1) (table 1 funcref)
                (func (export "f") (drop (table.grow (ref.null func) (i32.const 1)))))"#,
            r#"(module (memory (export "memory") 1) (table 1 funcref)
                (func (export "f") (table.set (i32.const 0) (ref.null func))))"#,
            // A dropped data segment.
            r#"(module (memory (export "memory") 1) (data "x")
                (func (export "f") (data.drop 0)))"#,
            // A global of reference type.
            r#"(module (memory (export "memory") 1) (global (mut funcref) (ref.null func)))"#,
            // An imported global.
            r#"(module (import "env" "g" (global (mut i32))) (memory (export "memory") 1))"#,
            // Exports already named like the added ones.
            r#"(module (memory (export "memory") 1)
                (global (export "kubedev:state:global:0") (mut i32) (i32.const 0)))"#,
            // No exports at all.
            r#"(module (memory 1))"#,
        ];
        for text in refused {
            assert_eq!(plan(&wasm(text)), None, "{text}");
        }
        assert_eq!(
            plan(b"\0asm\x01\0\0\0\x07\xff"),
            None,
            "bytes that do not parse"
        );
    }
}
