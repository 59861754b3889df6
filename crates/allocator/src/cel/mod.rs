//! The DRA CEL environment: the `device` variable, the Kubernetes functions selectors use,
//! and the limits the API server and scheduler enforce.
//!
//! Expressions are parsed (and macros expanded) by the `cel` crate; kubedev evaluates the
//! parsed tree itself, so that every evaluation is metered against the runtime cost limit
//! (the crate has no cost accounting) and so that `&&`, `||` and the macros absorb errors the
//! way CEL specifies (`false && error` is `false`). See the crate docs for why.

mod compile;
mod compile_cache;
mod device;
mod error;
mod eval;
mod hashing;
mod interner;
mod library;
mod meter;
mod tree;
mod value;

pub(crate) mod numeric {
    //! The exact numeric types behind CEL quantities and semantic versions.
    pub(crate) use kubedev_core::{Quantity, Version};
}

pub use compile_cache::{compile, compile_uncached, validate_new};
pub use device::DeviceContext;
pub(crate) use device::{DeviceVars, EntryRef};
pub use error::{CompileError, RuntimeError};
pub(crate) use hashing::{FastMap, FastSet, fast_hash, str_eq};
pub use interner::split_qualified;
pub(crate) use interner::{Interner, with_interner};
pub use kubedev_core::AttributeValue;
pub use tree::Program;
pub(crate) use value::Value;

// What the tests read through `super::*` besides the items above.
#[cfg(test)]
use {interner::MAX_INTERNED, numeric::Quantity, std::sync::Arc};

/// Longest expression the API server accepts when a selector is written (created or
/// changed), in bytes. Stored expressions stay valid, and the scheduler does not check it, so
/// allocation does not either; [`validate_new`] does, for expressions kubedev writes.
pub const MAX_EXPRESSION_LENGTH: usize = 10 * 1024;
/// Longest expression the parser reads, in code points (cel-go's default, which neither the
/// API server nor the scheduler changes).
pub const MAX_CODE_POINTS: usize = 100_000;
/// Runtime cost limit of one evaluation (the scheduler's limit for selectors).
pub const COST_LIMIT: u64 = 1_000_000;
/// Deepest bracket nesting accepted by the parser: cel-go's default recursion limit, which
/// neither the API server nor the scheduler changes (each nested parenthesis is one level).
pub const MAX_NESTING: usize = 250;
/// Deepest parsed tree accepted; bounds the evaluator's recursion.
pub const MAX_AST_DEPTH: usize = 250;

/// Evaluates a compiled selector for one device with the scheduler's cost limit.
pub fn evaluate(program: &Program, device: &DeviceContext) -> Result<bool, RuntimeError> {
    evaluate_vars(program, device)
}

/// [`evaluate`] for any [`DeviceVars`].
pub(crate) fn evaluate_vars(
    program: &Program,
    device: &dyn DeviceVars,
) -> Result<bool, RuntimeError> {
    evaluate_dyn(program, device, COST_LIMIT).map(|(b, _)| b)
}

/// Evaluates with an explicit cost limit; returns the result and the cost spent.
pub fn evaluate_with_limit(
    program: &Program,
    device: &DeviceContext,
    limit: u64,
) -> Result<(bool, u64), RuntimeError> {
    evaluate_dyn(program, device, limit)
}

/// Evaluates `program` for `device` under `limit`; a result that is not a bool is an error.
fn evaluate_dyn(
    program: &Program,
    device: &dyn DeviceVars,
    limit: u64,
) -> Result<(bool, u64), RuntimeError> {
    let mut ev = eval::Evaluator::new(program, device, limit);
    match ev.eval(&program.root) {
        Ok(Value::Bool(b)) => Ok((b, ev.meter.cost)),
        Ok(other) => Err(RuntimeError::new(format!(
            "CEL result of type {} could not be converted to bool",
            other.type_name()
        ))),
        Err(e) => Err(RuntimeError::from_eval(e)),
    }
}

#[cfg(test)]
mod tests;
