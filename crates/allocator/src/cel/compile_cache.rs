//! Compiled programs kept per thread and per process, and the thread with a large stack
//! that parses an expression the first time it is seen.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use super::hashing::FastMap;
use super::{CompileError, MAX_CODE_POINTS, MAX_EXPRESSION_LENGTH, Program};

type CompileCache = Mutex<HashMap<String, Result<Arc<Program>, CompileError>>>;

static CACHE: OnceLock<CompileCache> = OnceLock::new();
const CACHE_MAX: usize = 4096;
/// Stack of the thread that parses expressions; the parser and the conversion of the
/// parsed tree recurse over its depth, which [`MAX_NESTING`](super::MAX_NESTING) bounds.
/// Unoptimised, the parser takes about 250 KiB of stack per nested list (60 MiB at the
/// limit): a driver's debug build gets a stack that holds it, reserved but only touched as
/// deep as an expression goes.
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
        return super::compile::compile(expression).map(Arc::new);
    }
    let text = expression.to_string();
    let handle = std::thread::Builder::new()
        .name("kubedev-cel-compile".into())
        .stack_size(COMPILE_STACK)
        .spawn(move || super::compile::compile(&text).map(Arc::new));
    match handle {
        Ok(h) => h
            .join()
            .unwrap_or_else(|_| Err(CompileError::Syntax("the CEL parser failed".into()))),
        Err(_) => super::compile::compile(expression).map(Arc::new),
    }
}
