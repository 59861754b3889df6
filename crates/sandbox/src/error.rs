//! [`PolicyError`]: every way a policy can fail, and the one place wasmtime's errors become it.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Why a policy could not be loaded or did not give an answer. Callers keep the default
/// order (or refuse, when they run fail-closed); nothing here is fatal to the host.
#[derive(Clone, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PolicyError {
    /// The call used up its fuel (the deterministic instruction budget).
    #[error("policy {policy}: ran out of fuel (limit {fuel} units)")]
    OutOfFuel {
        /// Policy name.
        policy: String,
        /// The fuel budget of one call.
        fuel: u64,
    },
    /// Linear memory would have grown past the limit.
    #[error(
        "policy {policy}: linear memory would grow to {requested} bytes, over the limit of {limit} bytes"
    )]
    MemoryLimit {
        /// Policy name.
        policy: String,
        /// The memory limit, bytes.
        limit: usize,
        /// The size the module asked for, bytes.
        requested: usize,
    },
    /// The module trapped (unreachable, out-of-bounds access, stack overflow, a panic, ...).
    #[error("policy {policy}: trapped: {message}")]
    Trap {
        /// Policy name.
        policy: String,
        /// What trapped.
        message: String,
    },
    /// The call ran past the wall-clock limit (a backstop: fuel normally stops it first).
    #[error("policy {policy}: ran longer than the wall-clock limit of {limit:?}")]
    Timeout {
        /// Policy name.
        policy: String,
        /// The wall-clock limit of one call.
        limit: Duration,
    },
    /// The module is not valid WebAssembly or does not keep the policy contract.
    #[error("policy {policy}: not a usable policy module: {reason}")]
    BadModule {
        /// Policy name.
        policy: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The policy file is not WebAssembly at all (it lacks the `\0asm` magic number).
    #[error("{} is not a WebAssembly module (it does not start with \\0asm)", path.display())]
    NotWasm {
        /// Policy name.
        policy: String,
        /// The file.
        path: PathBuf,
    },
    /// The module answered something that is not a valid output message.
    #[error("policy {policy}: bad output: {reason}")]
    BadOutput {
        /// Policy name.
        policy: String,
        /// What is wrong with the answer.
        reason: String,
    },
    /// The input message does not fit the policy's memory limit.
    #[error(
        "policy {policy}: input of {size} bytes does not fit the memory limit of {limit} bytes"
    )]
    InputTooLarge {
        /// Policy name.
        policy: String,
        /// Input size, bytes.
        size: usize,
        /// The memory limit, bytes.
        limit: usize,
    },
    /// Every instance slot of the sandbox is in use by concurrent calls.
    #[error("policy {policy}: all {limit} concurrent policy instances are in use")]
    Busy {
        /// Policy name.
        policy: String,
        /// The number of concurrent instances the sandbox allows.
        limit: u32,
    },
    /// Any other failure of the WebAssembly runtime while instantiating or calling.
    #[error("policy {policy}: runtime failure: {message}")]
    Runtime {
        /// Policy name.
        policy: String,
        /// The runtime's message.
        message: String,
    },
    /// A policy file or directory could not be read.
    #[error("read {path}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: Arc<std::io::Error>,
    },
    /// The WebAssembly engine could not be built with the requested limits.
    #[error("build the policy engine: {message}")]
    Engine {
        /// The runtime's message.
        message: String,
    },
}

impl PolicyError {
    /// The policy the error is about, if any.
    pub fn policy(&self) -> Option<&str> {
        match self {
            PolicyError::OutOfFuel { policy, .. }
            | PolicyError::MemoryLimit { policy, .. }
            | PolicyError::Trap { policy, .. }
            | PolicyError::Timeout { policy, .. }
            | PolicyError::BadModule { policy, .. }
            | PolicyError::NotWasm { policy, .. }
            | PolicyError::BadOutput { policy, .. }
            | PolicyError::InputTooLarge { policy, .. }
            | PolicyError::Busy { policy, .. }
            | PolicyError::Runtime { policy, .. } => Some(policy),
            PolicyError::Io { .. } | PolicyError::Engine { .. } => None,
        }
    }

    /// A short stable name of the variant (`out-of-fuel`, `memory-limit`, ...), for metrics
    /// and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            PolicyError::OutOfFuel { .. } => "out-of-fuel",
            PolicyError::MemoryLimit { .. } => "memory-limit",
            PolicyError::Trap { .. } => "trap",
            PolicyError::Timeout { .. } => "timeout",
            PolicyError::BadModule { .. } | PolicyError::NotWasm { .. } => "bad-module",
            PolicyError::BadOutput { .. } => "bad-output",
            PolicyError::InputTooLarge { .. } => "input-too-large",
            PolicyError::Busy { .. } => "busy",
            PolicyError::Runtime { .. } => "runtime",
            PolicyError::Io { .. } => "io",
            PolicyError::Engine { .. } => "engine",
        }
    }

    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        PolicyError::Io {
            path: path.into(),
            source: Arc::new(source),
        }
    }
}

/// A failure raised by our own host code inside a call (the log import, the memory limiter),
/// carried through wasmtime's error and turned back into a [`PolicyError`] by [`classify`].
#[derive(Debug)]
pub(crate) enum HostFault {
    /// The guest broke the contract of a host function.
    Contract(String),
    /// Memory growth past the limit.
    Memory { requested: usize },
}

impl std::fmt::Display for HostFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HostFault::Contract(m) => f.write_str(m),
            HostFault::Memory { requested } => {
                write!(f, "memory growth to {requested} bytes denied")
            }
        }
    }
}

impl std::error::Error for HostFault {}

/// What the sandbox knows about a failed call besides wasmtime's error.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CallContext {
    pub(crate) fuel: u64,
    pub(crate) memory_limit: usize,
    pub(crate) timeout: Duration,
    pub(crate) max_instances: u32,
    /// The limiter denied a growth to this many bytes.
    pub(crate) memory_denied: Option<usize>,
}

/// Whether `err` says every instance slot of the pool is taken.
pub(crate) fn is_busy(err: &wasmtime::Error) -> bool {
    err.is::<wasmtime::PoolConcurrencyLimitError>()
}

/// The crate edge: turns any wasmtime error from instantiating or calling a policy into our
/// own error. The only place that looks inside wasmtime's errors.
pub(crate) fn classify(policy: &str, err: &wasmtime::Error, cx: &CallContext) -> PolicyError {
    let policy = policy.to_string();
    if let Some(requested) = cx.memory_denied {
        return PolicyError::MemoryLimit {
            policy,
            limit: cx.memory_limit,
            requested,
        };
    }
    if let Some(fault) = err.downcast_ref::<HostFault>() {
        return match fault {
            HostFault::Memory { requested } => PolicyError::MemoryLimit {
                policy,
                limit: cx.memory_limit,
                requested: *requested,
            },
            HostFault::Contract(message) => PolicyError::Trap {
                policy,
                message: message.clone(),
            },
        };
    }
    if let Some(trap) = err.downcast_ref::<wasmtime::Trap>() {
        return match trap {
            wasmtime::Trap::OutOfFuel => PolicyError::OutOfFuel {
                policy,
                fuel: cx.fuel,
            },
            wasmtime::Trap::Interrupt => PolicyError::Timeout {
                policy,
                limit: cx.timeout,
            },
            other => PolicyError::Trap {
                policy,
                message: other.to_string(),
            },
        };
    }
    if is_busy(err) {
        return PolicyError::Busy {
            policy,
            limit: cx.max_instances,
        };
    }
    let message = err
        .chain()
        .map(|e| e.to_string())
        .collect::<Vec<_>>()
        .join(": ");
    PolicyError::Runtime { policy, message }
}
