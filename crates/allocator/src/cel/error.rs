//! What compiling or evaluating an expression reports when it fails.

use super::meter::EvalError;

/// Why an expression does not compile.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CompileError {
    /// Longer than [`MAX_CODE_POINTS`](super::MAX_CODE_POINTS) (cel-go's words).
    #[error("expression code point size exceeds limit: size: {length}, limit {limit}")]
    TooLong {
        /// Length in code points.
        length: usize,
        /// The limit.
        limit: usize,
    },
    /// Longer than [`MAX_EXPRESSION_LENGTH`](super::MAX_EXPRESSION_LENGTH), refused by
    /// [`validate_new`](super::validate_new) only.
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
    /// deeper than [`MAX_AST_DEPTH`](super::MAX_AST_DEPTH).
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

    /// The error an evaluation stopped with; the cost limit stays recognisable.
    pub(super) fn from_eval(error: EvalError) -> RuntimeError {
        RuntimeError {
            message: error.message,
            cost_limit: error.fatal,
        }
    }
}
