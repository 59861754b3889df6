//! The DRA CEL environment: the `device` variable, the Kubernetes functions selectors use,
//! and the limits the API server and scheduler enforce.
//!
//! Expressions are parsed (and macros expanded) by the `cel` crate; kubedev evaluates the
//! parsed tree itself, so that every evaluation is metered against the runtime cost limit
//! (the crate has no cost accounting) and so that `&&`, `||` and the macros absorb errors the
//! way CEL specifies (`false && error` is `false`). See the crate docs for why.

mod compile;
mod eval;
mod library;
mod value;

pub(crate) mod numeric {
    //! The exact numeric types behind CEL quantities and semantic versions.
    pub(crate) use kubedev_core::{Quantity, Version};
}

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

pub use compile::Program;
use numeric::Quantity;
use value::{MapValue, Value};

/// Longest accepted expression, in bytes (the API server's limit for selectors).
pub const MAX_EXPRESSION_LENGTH: usize = 10 * 1024;
/// Runtime cost limit of one evaluation (the scheduler's limit for selectors).
pub const COST_LIMIT: u64 = 1_000_000;
/// Deepest bracket nesting accepted by the parser.
pub const MAX_NESTING: usize = 64;
/// Deepest parsed tree accepted; bounds the evaluator's recursion.
pub const MAX_AST_DEPTH: usize = 250;

/// Why an expression does not compile.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CompileError {
    /// Longer than [`MAX_EXPRESSION_LENGTH`].
    #[error("expression is {length} bytes long, the limit is {limit}")]
    TooLong {
        /// Length in bytes.
        length: usize,
        /// The limit.
        limit: usize,
    },
    /// Nested deeper than the structural limits.
    #[error("expression nests {depth} levels deep, the limit is {limit}")]
    TooDeep {
        /// Depth found (at least).
        depth: usize,
        /// The limit.
        limit: usize,
    },
    /// Not valid CEL syntax.
    #[error("syntax error: {0}")]
    Syntax(String),
    /// A variable or function that does not exist.
    #[error("undeclared reference to '{0}'")]
    Undeclared(String),
    /// A type error found without evaluating.
    #[error("{0}")]
    Type(String),
}

/// Why an evaluation failed: a runtime error such as a missing attribute, an invalid
/// quantity or semver string, a non-bool result, or the cost limit.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct RuntimeError {
    message: String,
    cost_limit: bool,
}

impl RuntimeError {
    /// True when the evaluation was stopped by the cost limit.
    pub fn is_cost_limit(&self) -> bool {
        self.cost_limit
    }

    pub(crate) fn new(message: impl Into<String>) -> RuntimeError {
        RuntimeError {
            message: message.into(),
            cost_limit: false,
        }
    }
}

type CompileCache = Mutex<HashMap<String, Result<Arc<Program>, CompileError>>>;

static CACHE: OnceLock<CompileCache> = OnceLock::new();
const CACHE_MAX: usize = 4096;
/// Stack of the thread that parses expressions; the parser and the conversion of the
/// parsed tree recurse over its depth, which the length limit bounds.
const COMPILE_STACK: usize = 16 << 20;

/// Compiles `expression`, once per process: later calls return the cached program or error.
pub fn compile(expression: &str) -> Result<Arc<Program>, CompileError> {
    let cache = CACHE.get_or_init(|| Mutex::new(HashMap::new()));
    if let Some(hit) = cache
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(expression)
    {
        return hit.clone();
    }
    let result = compile_uncached(expression);
    let mut guard = cache.lock().unwrap_or_else(|e| e.into_inner());
    if guard.len() >= CACHE_MAX {
        guard.clear();
    }
    guard.insert(expression.to_string(), result.clone());
    result
}

/// Compiles without the cache, on a thread with a known large stack.
pub fn compile_uncached(expression: &str) -> Result<Arc<Program>, CompileError> {
    if expression.len() > MAX_EXPRESSION_LENGTH {
        return compile::compile(expression).map(Arc::new);
    }
    let text = expression.to_string();
    let handle = std::thread::Builder::new()
        .name("kubedev-cel-compile".into())
        .stack_size(COMPILE_STACK)
        .spawn(move || compile::compile(&text).map(Arc::new));
    match handle {
        Ok(h) => h
            .join()
            .unwrap_or_else(|_| Err(CompileError::Syntax("the CEL parser failed".into()))),
        Err(_) => compile::compile(expression).map(Arc::new),
    }
}

pub use kubedev_core::AttributeValue;

/// The `device` variable of one device, built once and reused for every evaluation.
#[derive(Clone, Debug)]
pub struct DeviceContext {
    driver: Value,
    attributes: Value,
    capacity: Value,
    allow_multiple: bool,
}

/// Splits a qualified name into domain and id; bare names get the driver as domain.
pub fn split_qualified<'a>(name: &'a str, driver: &'a str) -> (&'a str, &'a str) {
    match name.find('/') {
        Some(i) => (&name[..i], &name[i + 1..]),
        None => (driver, name),
    }
}

fn nested_map<V>(
    driver: &str,
    items: impl IntoIterator<Item = (String, V)>,
    convert: impl Fn(V) -> Value,
) -> Value {
    let mut domains: Vec<(Arc<str>, MapValue)> = Vec::new();
    for (name, v) in items {
        let (domain, id) = split_qualified(&name, driver);
        let pos = match domains.iter().position(|(d, _)| &**d == domain) {
            Some(p) => p,
            None => {
                domains.push((Arc::from(domain), MapValue::default()));
                domains.len() - 1
            }
        };
        let inner = &mut domains[pos].1;
        let key = Value::str(id);
        let value = convert(v);
        match inner.entries.iter_mut().find(|(k, _)| k.equals(&key)) {
            Some(slot) => slot.1 = value,
            None => inner.entries.push((key, value)),
        }
    }
    Value::Map(Arc::new(MapValue {
        entries: domains
            .into_iter()
            .map(|(d, m)| (Value::String(d), Value::Map(Arc::new(m))))
            .collect(),
        missing_is_empty: true,
    }))
}

impl DeviceContext {
    /// Builds the `device` variable from typed attributes and capacities (names as in the
    /// ResourceSlice: bare or `domain/id`).
    pub fn new(
        driver: &str,
        attributes: impl IntoIterator<Item = (String, AttributeValue)>,
        capacity: impl IntoIterator<Item = (String, Quantity)>,
        allow_multiple_allocations: bool,
    ) -> DeviceContext {
        DeviceContext {
            driver: Value::str(driver),
            attributes: nested_map(driver, attributes, |a| match a {
                AttributeValue::Int(i) => Value::Int(i),
                AttributeValue::Bool(b) => Value::Bool(b),
                AttributeValue::String(s) => Value::str(&s),
                AttributeValue::Version(v) => Value::Semver(Arc::new(v)),
                // Future attribute types are not visible to selectors.
                _ => Value::Null,
            }),
            capacity: nested_map(driver, capacity, |q| Value::Quantity(Arc::new(q))),
            allow_multiple: allow_multiple_allocations,
        }
    }
}

/// Evaluates a compiled selector for one device with the scheduler's cost limit.
pub fn evaluate(program: &Program, device: &DeviceContext) -> Result<bool, RuntimeError> {
    evaluate_with_limit(program, device, COST_LIMIT).map(|(b, _)| b)
}

/// Evaluates with an explicit cost limit; returns the result and the cost spent.
pub fn evaluate_with_limit(
    program: &Program,
    device: &DeviceContext,
    limit: u64,
) -> Result<(bool, u64), RuntimeError> {
    let mut ev = eval::Evaluator::new(program, device, limit);
    match ev.eval(&program.root) {
        Ok(Value::Bool(b)) => Ok((b, ev.meter.cost)),
        Ok(other) => Err(RuntimeError::new(format!(
            "CEL result of type {} could not be converted to bool",
            other.type_name()
        ))),
        Err(e) => Err(RuntimeError {
            message: e.message,
            cost_limit: e.fatal,
        }),
    }
}

#[cfg(test)]
mod tests;
