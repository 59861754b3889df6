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

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

pub use compile::Program;
use numeric::{Quantity, Version};
use value::MapValue;
pub(crate) use value::Value;

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

/// Why an expression does not compile.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CompileError {
    /// Longer than [`MAX_CODE_POINTS`] (cel-go's words).
    #[error("expression code point size exceeds limit: size: {length}, limit {limit}")]
    TooLong {
        /// Length in code points.
        length: usize,
        /// The limit.
        limit: usize,
    },
    /// Longer than [`MAX_EXPRESSION_LENGTH`], refused by [`validate_new`] only.
    #[error(
        "expression is {length} bytes long; the API server accepts a new or changed selector of \
         at most {limit} bytes"
    )]
    TooLongToWrite {
        /// Length in bytes.
        length: usize,
        /// The limit.
        limit: usize,
    },
    /// Nested deeper than the parser's recursion limit (cel-go's words), or a parsed tree
    /// deeper than [`MAX_AST_DEPTH`].
    #[error("expression recursion limit exceeded: {limit} (it nests at least {depth} levels)")]
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
    /// A literal regular expression (of `matches`, `find` or `findAll`) that does not compile.
    #[error("invalid regular expression {0}: {message}", kubedev_core::echo::echo(.pattern))]
    Regex {
        /// The pattern as written.
        pattern: String,
        /// What is wrong with it.
        message: String,
    },
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
/// parsed tree recurse over its depth, which [`MAX_NESTING`] bounds. Unoptimised, the parser
/// takes about 250 KiB of stack per nested list (60 MiB at the limit): a driver's debug build
/// gets a stack that holds it, reserved but only touched as deep as an expression goes.
const COMPILE_STACK: usize = if cfg!(debug_assertions) {
    256 << 20
} else {
    16 << 20
};

/// Compiles `expression`, once per process: later calls return the cached program or error.
pub fn compile(expression: &str) -> Result<Arc<Program>, CompileError> {
    // This thread's recent programs first: no lock, and a short hash.
    let local = LOCAL_PROGRAMS.with(|l| l.borrow().get(expression).cloned());
    if let Some(program) = local {
        return Ok(program);
    }
    let result = compile_shared(expression);
    if let Ok(program) = &result {
        LOCAL_PROGRAMS.with(|l| {
            let mut l = l.borrow_mut();
            if l.len() >= LOCAL_PROGRAMS_MAX {
                l.clear();
            }
            l.insert(Box::from(expression), program.clone());
        });
    }
    result
}

/// Most programs one thread keeps in front of the process-wide cache.
const LOCAL_PROGRAMS_MAX: usize = 256;

thread_local! {
    static LOCAL_PROGRAMS: std::cell::RefCell<FastMap<Box<str>, Arc<Program>>> =
        std::cell::RefCell::new(FastMap::default());
}

/// [`compile`] through the process-wide cache.
fn compile_shared(expression: &str) -> Result<Arc<Program>, CompileError> {
    let cache = CACHE.get_or_init(|| Mutex::new(HashMap::new()));
    if let Some(hit) = cache.lock().get(expression) {
        return hit.clone();
    }
    let result = compile_uncached(expression);
    let mut guard = cache.lock();
    if guard.len() >= CACHE_MAX {
        guard.clear();
    }
    guard.insert(expression.to_string(), result.clone());
    result
}

/// Checks `expression` as the API server does when a selector is created or changed: at most
/// [`MAX_EXPRESSION_LENGTH`] bytes, then [`compile`]. For expressions kubedev writes (its
/// DeviceClasses); allocation reads stored expressions and uses [`compile`] alone.
pub fn validate_new(expression: &str) -> Result<Arc<Program>, CompileError> {
    if expression.len() > MAX_EXPRESSION_LENGTH {
        return Err(CompileError::TooLongToWrite {
            length: expression.len(),
            limit: MAX_EXPRESSION_LENGTH,
        });
    }
    compile(expression)
}

/// Compiles without the cache, on a thread with a known large stack.
pub fn compile_uncached(expression: &str) -> Result<Arc<Program>, CompileError> {
    if expression.len() > MAX_CODE_POINTS * 4 {
        // Too long whatever its characters: refused before any parsing.
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
///
/// Attribute and capacity entries are kept flat; the nested `domain -> id -> value` maps are
/// only built when an expression uses them as maps (iteration, `in`, `size`), since direct
/// lookups (`device.attributes["domain"].id`) read the flat entries.
#[derive(Debug)]
pub struct DeviceContext {
    driver: Value,
    attrs: Vec<(Arc<str>, Arc<str>, Value)>,
    caps: Vec<(Arc<str>, Arc<str>, Value)>,
    allow_multiple: bool,
    attributes: OnceLock<Value>,
    capacity: OnceLock<Value>,
}

/// Splits a qualified name into domain and id; bare names get the driver as domain.
pub fn split_qualified<'a>(name: &'a str, driver: &'a str) -> (&'a str, &'a str) {
    match name.find('/') {
        Some(i) => (&name[..i], &name[i + 1..]),
        None => (driver, name),
    }
}

/// A fast hasher for the interner's short keys (FNV-1a over 8-byte words). The keys come
/// from ResourceSlices published by drivers, which the cluster trusts.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct FastHasher(u64);

/// [`FastHasher`]'s mix of `bytes` into `seed` (FNV-1a over 8-byte words).
#[inline]
fn fast_mix(seed: u64, bytes: &[u8]) -> u64 {
    let mut h = seed ^ 0xcbf2_9ce4_8422_2325;
    let mut chunks = bytes.chunks_exact(8);
    for c in &mut chunks {
        let mut w = [0u8; 8];
        w.copy_from_slice(c);
        h = (h ^ u64::from_le_bytes(w))
            .wrapping_mul(0x0000_0100_0000_01b3)
            .rotate_left(29);
    }
    for &b in chunks.remainder() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// A fast hash of one string (as [`FastHasher`] mixes it, without `Hash`'s terminator).
#[inline]
pub(crate) fn fast_hash(s: &str) -> u64 {
    let h = fast_mix(0, s.as_bytes());
    h ^ (h >> 32)
}

/// `a == b` for strings, with short strings compared in registers rather than through a
/// `memcmp` call (names and amounts in slices are mostly short).
#[inline]
pub(crate) fn str_eq(a: &str, b: &str) -> bool {
    #[inline(always)]
    fn w8(s: &[u8], i: usize) -> u64 {
        let mut w = [0u8; 8];
        w.copy_from_slice(&s[i..i + 8]);
        u64::from_ne_bytes(w)
    }
    #[inline(always)]
    fn w4(s: &[u8], i: usize) -> u32 {
        let mut w = [0u8; 4];
        w.copy_from_slice(&s[i..i + 4]);
        u32::from_ne_bytes(w)
    }
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let n = a.len();
    if n != b.len() {
        return false;
    }
    match n {
        0 => true,
        1..=3 => a[0] == b[0] && a[n / 2] == b[n / 2] && a[n - 1] == b[n - 1],
        4..=7 => w4(a, 0) == w4(b, 0) && w4(a, n - 4) == w4(b, n - 4),
        8..=16 => w8(a, 0) == w8(b, 0) && w8(a, n - 8) == w8(b, n - 8),
        _ => a == b,
    }
}

impl std::hash::Hasher for FastHasher {
    fn write(&mut self, bytes: &[u8]) {
        self.0 = fast_mix(self.0, bytes);
    }

    fn finish(&self) -> u64 {
        self.0 ^ (self.0 >> 32)
    }
}

pub(crate) type FastMap<K, V> = HashMap<K, V, std::hash::BuildHasherDefault<FastHasher>>;

/// A set with [`FastHasher`].
pub(crate) type FastSet<K> =
    std::collections::HashSet<K, std::hash::BuildHasherDefault<FastHasher>>;

/// A name split for a driver: (driver, domain, id).
type SplitName = (Arc<str>, Arc<str>, Arc<str>);

/// Most entries one interner map keeps; past it values are built without sharing, so a
/// stream of distinct names cannot grow a thread's interner without bound.
const MAX_INTERNED: usize = 1 << 16;

thread_local! {
    static SHARED: std::cell::RefCell<Interner> = std::cell::RefCell::new(Interner::default());
}

/// Runs `f` with this thread's interner, which device contexts of every allocator on the
/// thread share (the names and values of a cluster's devices repeat across nodes and pods).
pub(crate) fn with_interner<R>(f: impl FnOnce(&mut Interner) -> R) -> R {
    SHARED.with(|shared| match shared.try_borrow_mut() {
        Ok(mut interner) => f(&mut interner),
        Err(_) => f(&mut Interner::default()),
    })
}

/// Shares the strings and values of device contexts (names, domains, string values,
/// versions and quantities repeat across the devices of a node and of a cluster).
#[derive(Debug, Default)]
pub(crate) struct Interner {
    strings: FastMap<Box<str>, Arc<str>>,
    /// Name -> (driver it was split for, domain, id).
    names: FastMap<Box<str>, SplitName>,
    versions: FastMap<Box<str>, Value>,
    quantities: FastMap<Quantity, Value>,
}

impl Interner {
    /// Domain and id of an attribute or capacity name (bare names belong to `driver`).
    pub(crate) fn name(&mut self, name: &str, driver: &str) -> (Arc<str>, Arc<str>) {
        if let Some((d, domain, id)) = self.names.get(name)
            && (name.contains('/') || &**d == driver)
        {
            return (domain.clone(), id.clone());
        }
        let (domain, id) = split_qualified(name, driver);
        let entry = (self.str(driver), self.str(domain), self.str(id));
        let pair = (entry.1.clone(), entry.2.clone());
        if self.names.len() < MAX_INTERNED {
            self.names.insert(Box::from(name), entry);
        }
        pair
    }

    pub(crate) fn str(&mut self, s: &str) -> Arc<str> {
        if let Some(a) = self.strings.get(s) {
            return a.clone();
        }
        let a: Arc<str> = Arc::from(s);
        if self.strings.len() < MAX_INTERNED {
            self.strings.insert(Box::from(s), a.clone());
        }
        a
    }

    pub(crate) fn version(&mut self, text: &str) -> Result<Value, String> {
        if let Some(v) = self.versions.get(text) {
            return Ok(v.clone());
        }
        let v = Value::Semver(Arc::new(
            Version::parse(text).map_err(|e| kubedev_core::echo::chain(&e))?,
        ));
        if self.versions.len() < MAX_INTERNED {
            self.versions.insert(Box::from(text), v.clone());
        }
        Ok(v)
    }

    pub(crate) fn quantity(&mut self, q: Quantity) -> Value {
        if let Some(v) = self.quantities.get(&q) {
            return v.clone();
        }
        let v = Value::Quantity(Arc::new(q));
        if self.quantities.len() < MAX_INTERNED {
            self.quantities.insert(q, v.clone());
        }
        v
    }
}

fn materialize(entries: &[(Arc<str>, Arc<str>, Value)]) -> Value {
    let mut domains: Vec<(Arc<str>, MapValue)> = Vec::new();
    for (domain, id, value) in entries {
        let pos = match domains.iter().position(|(d, _)| d == domain) {
            Some(p) => p,
            None => {
                domains.push((domain.clone(), MapValue::default()));
                domains.len() - 1
            }
        };
        let inner = &mut domains[pos].1;
        if inner.get_str(id).is_none() {
            inner
                .entries
                .push((Value::String(id.clone()), value.clone()));
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
        let mut interner = Interner::default();
        let mut ctx =
            DeviceContext::empty(&mut interner, driver, allow_multiple_allocations, (0, 0));
        for (name, a) in attributes {
            let value = match a {
                AttributeValue::Int(i) => Value::Int(i),
                AttributeValue::Bool(b) => Value::Bool(b),
                AttributeValue::String(s) => Value::String(interner.str(&s)),
                AttributeValue::Version(v) => Value::Semver(Arc::new(v)),
                // Future attribute types are not visible to selectors.
                _ => Value::Null,
            };
            ctx.push_attribute(&mut interner, driver, &name, value);
        }
        for (name, q) in capacity {
            ctx.push_capacity(&mut interner, driver, &name, q);
        }
        ctx
    }

    /// A context without attributes and capacities, with room for as many as given.
    pub(crate) fn empty(
        interner: &mut Interner,
        driver: &str,
        allow_multiple: bool,
        room: (usize, usize),
    ) -> DeviceContext {
        DeviceContext {
            driver: Value::String(interner.str(driver)),
            attrs: Vec::with_capacity(room.0),
            caps: Vec::with_capacity(room.1),
            allow_multiple,
            attributes: OnceLock::new(),
            capacity: OnceLock::new(),
        }
    }

    pub(crate) fn push_attribute(
        &mut self,
        interner: &mut Interner,
        driver: &str,
        name: &str,
        value: Value,
    ) {
        let (domain, id) = interner.name(name, driver);
        self.attrs.push((domain, id, value));
    }

    pub(crate) fn push_capacity(
        &mut self,
        interner: &mut Interner,
        driver: &str,
        name: &str,
        q: Quantity,
    ) {
        let (domain, id) = interner.name(name, driver);
        let value = interner.quantity(q);
        self.caps.push((domain, id, value));
    }

    pub(crate) fn attributes(&self) -> &Value {
        self.attributes.get_or_init(|| materialize(&self.attrs))
    }

    pub(crate) fn capacity(&self) -> &Value {
        self.capacity.get_or_init(|| materialize(&self.caps))
    }

    /// `device.attributes[domain][id]` (or capacity) without building maps; `None` when the
    /// id is missing.
    pub(crate) fn entry(&self, capacity: bool, domain: &str, id: &str) -> Option<&Value> {
        let list = if capacity { &self.caps } else { &self.attrs };
        list.iter()
            .find(|(d, i, _)| &**d == domain && &**i == id)
            .map(|(_, _, v)| v)
    }
}

/// What an evaluation reads of the `device` variable: a [`DeviceContext`] built up front, or
/// a device read from its slice as the expression asks.
pub(crate) trait DeviceVars {
    /// `device.driver`.
    fn driver(&self) -> Value;
    /// `device.allowMultipleAllocations`.
    fn allow_multiple(&self) -> bool;
    /// `device.attributes` as a map of maps.
    fn attributes(&self) -> Value;
    /// `device.capacity` as a map of maps.
    fn capacity(&self) -> Value;
    /// `device.attributes[domain][id]` (or capacity) without building maps; `None` when the
    /// id is missing.
    fn entry(&self, capacity: bool, domain: &str, id: &str) -> Option<Value>;
    /// [`DeviceVars::entry`], with a string borrowed rather than made a value (selectors
    /// mostly compare string attributes with literals).
    fn entry_ref(&self, capacity: bool, domain: &str, id: &str) -> Option<EntryRef<'_>> {
        self.entry(capacity, domain, id).map(EntryRef::Value)
    }
}

/// A device entry as [`DeviceVars::entry_ref`] reads it.
pub(crate) enum EntryRef<'x> {
    Str(&'x str),
    Value(Value),
}

impl DeviceVars for DeviceContext {
    fn driver(&self) -> Value {
        self.driver.clone()
    }

    fn allow_multiple(&self) -> bool {
        self.allow_multiple
    }

    fn attributes(&self) -> Value {
        DeviceContext::attributes(self).clone()
    }

    fn capacity(&self) -> Value {
        DeviceContext::capacity(self).clone()
    }

    fn entry(&self, capacity: bool, domain: &str, id: &str) -> Option<Value> {
        DeviceContext::entry(self, capacity, domain, id).cloned()
    }

    fn entry_ref(&self, capacity: bool, domain: &str, id: &str) -> Option<EntryRef<'_>> {
        DeviceContext::entry(self, capacity, domain, id).map(|v| match v {
            Value::String(s) => EntryRef::Str(s),
            other => EntryRef::Value(other.clone()),
        })
    }
}

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
        Err(e) => Err(RuntimeError {
            message: e.message,
            cost_limit: e.fatal,
        }),
    }
}

#[cfg(test)]
mod tests;
