//! The contract a policy module must keep: the imports it may make (only `kubedev.log`) and
//! the exports it must provide, with their types.

use wasmtime::{ExternType, Module, ModuleExport, ValType};

use crate::abi::{
    EXPORT_ALLOC, EXPORT_INPUTS, EXPORT_MEMORY, EXPORT_SELECT, EXPORT_VERSION, IMPORT_LOG,
    IMPORT_MODULE,
};
use crate::limits::Limits;

fn describe(ty: &ExternType) -> String {
    match ty {
        ExternType::Func(f) => format!(
            "function ({}) -> ({})",
            f.params()
                .map(|p| p.to_string())
                .collect::<Vec<_>>()
                .join(", "),
            f.results()
                .map(|p| p.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
        ExternType::Memory(_) => "memory".into(),
        ExternType::Table(_) => "table".into(),
        ExternType::Global(_) => "global".into(),
        ExternType::Tag(_) => "tag".into(),
    }
}

fn func_is(ty: &ExternType, params: &[ValType], results: &[ValType]) -> bool {
    let ExternType::Func(f) = ty else {
        return false;
    };
    let eq = |a: ValType, b: &ValType| {
        matches!(
            (a, b),
            (ValType::I32, ValType::I32) | (ValType::I64, ValType::I64)
        )
    };
    f.params().len() == params.len()
        && f.results().len() == results.len()
        && f.params().zip(params).all(|(a, b)| eq(a, b))
        && f.results().zip(results).all(|(a, b)| eq(a, b))
}

/// The export handles of the contract: memory, alloc, select, version.
type ContractExports = [ModuleExport; 4];

/// Checks imports and exports; returns the export handles, the optional input declaration
/// export and whether the module imports `kubedev.log`.
pub(super) fn check_contract(
    module: &Module,
    limits: &Limits,
) -> Result<(ContractExports, Option<ModuleExport>, bool), String> {
    let mut imports_log = false;
    for imp in module.imports() {
        let ty = imp.ty();
        if imp.module() == IMPORT_MODULE
            && imp.name() == IMPORT_LOG
            && func_is(&ty, &[ValType::I32, ValType::I32], &[])
        {
            imports_log = true;
            continue;
        }
        return Err(format!(
            "imports {}.{} ({}); a policy may import only {IMPORT_MODULE}.{IMPORT_LOG}: function (i32, i32) -> ()",
            imp.module(),
            imp.name(),
            describe(&ty)
        ));
    }
    let export_ty = |name: &str| module.exports().find(|e| e.name() == name).map(|e| e.ty());
    match export_ty(EXPORT_MEMORY) {
        Some(ExternType::Memory(m)) => {
            if m.is_64() || m.is_shared() {
                return Err("memory must be a 32-bit unshared memory".into());
            }
            let min = m.minimum().saturating_mul(m.page_size());
            if min > limits.memory_bytes as u64 {
                return Err(format!(
                    "memory starts at {min} bytes, over the limit of {} bytes",
                    limits.memory_bytes
                ));
            }
        }
        Some(other) => {
            return Err(format!(
                "export {EXPORT_MEMORY:?} is a {}, not a memory",
                describe(&other)
            ));
        }
        None => return Err(format!("does not export {EXPORT_MEMORY:?}")),
    }
    let funcs: [(&str, &[ValType], &[ValType], &str); 3] = [
        (
            EXPORT_ALLOC,
            &[ValType::I32],
            &[ValType::I32],
            "(i32) -> (i32)",
        ),
        (
            EXPORT_SELECT,
            &[ValType::I32, ValType::I32],
            &[ValType::I64],
            "(i32, i32) -> (i64)",
        ),
        (EXPORT_VERSION, &[], &[ValType::I32], "() -> (i32)"),
    ];
    for (name, params, results, sig) in funcs {
        match export_ty(name) {
            Some(ty) if func_is(&ty, params, results) => {}
            Some(ty) => {
                return Err(format!(
                    "export {name:?} is a {}, the contract wants function {sig}",
                    describe(&ty)
                ));
            }
            None => return Err(format!("does not export function {name:?} {sig}")),
        }
    }
    let declaration = match export_ty(EXPORT_INPUTS) {
        None => false,
        Some(ty) if func_is(&ty, &[], &[ValType::I64]) => true,
        Some(ty) => {
            return Err(format!(
                "export {EXPORT_INPUTS:?} is a {}, the contract wants function () -> (i64)",
                describe(&ty)
            ));
        }
    };
    let index = |name: &str| {
        module
            .get_export_index(name)
            .ok_or_else(|| format!("export {name:?} has no index"))
    };
    Ok((
        [
            index(EXPORT_MEMORY)?,
            index(EXPORT_ALLOC)?,
            index(EXPORT_SELECT)?,
            index(EXPORT_VERSION)?,
        ],
        if declaration {
            Some(index(EXPORT_INPUTS)?)
        } else {
            None
        },
        imports_log,
    ))
}
