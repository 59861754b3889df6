//! The cost meter every evaluation is charged to, the error an evaluation stops with, and the
//! shared cache of compiled regular expressions.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;

/// Why an evaluation failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct EvalError {
    pub(crate) message: String,
    /// Fatal errors (the cost limit) are never absorbed by `&&`, `||` or macros.
    pub(crate) fatal: bool,
}

impl EvalError {
    pub(crate) fn msg(message: impl Into<String>) -> EvalError {
        EvalError {
            message: message.into(),
            fatal: false,
        }
    }
}

/// Counts evaluation cost and stops at the limit.
#[derive(Debug)]
pub(crate) struct Meter {
    pub(crate) cost: u64,
    pub(crate) limit: u64,
}

static REGEX_CACHE: Mutex<Option<HashMap<String, Arc<regex::Regex>>>> = Mutex::new(None);
const REGEX_CACHE_MAX: usize = 1024;

/// Compiles a regular expression of `matches`, `find` or `findAll` under the size limits every
/// evaluation uses; the error says in one line what is wrong with the pattern.
pub(crate) fn build_regex(pattern: &str) -> Result<regex::Regex, String> {
    regex::RegexBuilder::new(pattern)
        .size_limit(1 << 20)
        .dfa_size_limit(1 << 20)
        .build()
        .map_err(|e| {
            // A syntax error shows the pattern with a caret, then `error: <what>`.
            let text = kubedev_core::echo::chain(&e);
            text.lines()
                .find_map(|l| l.strip_prefix("error: "))
                .map_or_else(|| text.replace('\n', " "), str::to_owned)
        })
}

impl Meter {
    #[inline]
    pub(crate) fn charge(&mut self, units: u64) -> Result<(), EvalError> {
        self.cost = self.cost.saturating_add(units);
        if self.cost > self.limit {
            return Err(EvalError {
                message: format!(
                    "operation cancelled: actual cost limit exceeded (limit {})",
                    self.limit
                ),
                fatal: true,
            });
        }
        Ok(())
    }

    /// A compiled regular expression, shared across evaluations. Size limits keep hostile
    /// patterns from taking much memory.
    pub(crate) fn regex(&mut self, pattern: &str) -> Result<Arc<regex::Regex>, EvalError> {
        let mut guard = REGEX_CACHE.lock();
        let cache = guard.get_or_insert_with(HashMap::new);
        if let Some(re) = cache.get(pattern) {
            return Ok(re.clone());
        }
        let re = build_regex(pattern)
            .map_err(|e| EvalError::msg(format!("invalid regular expression {pattern:?}: {e}")))?;
        let re = Arc::new(re);
        if cache.len() >= REGEX_CACHE_MAX {
            cache.clear();
        }
        cache.insert(pattern.to_string(), re.clone());
        Ok(re)
    }
}
