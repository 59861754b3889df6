//! Hard allocation errors. "Nothing fits" is not an error; these are inputs the allocator
//! cannot judge, reported with the claim, class, selector and device involved. The messages
//! follow the Kubernetes scheduler's wording.

use crate::policy::PolicyFailure;

/// Who owns a selector: a DeviceClass or a claim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SelectorOwner {
    /// A DeviceClass selector.
    Class(String),
    /// A selector of a claim's request.
    Claim(String),
}

impl std::fmt::Display for SelectorOwner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SelectorOwner::Class(c) => write!(f, "class {c}"),
            SelectorOwner::Claim(c) => write!(f, "claim {c}"),
        }
    }
}

/// Why an allocation could not be judged.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AllocationError {
    /// A selector does not compile.
    #[error("{owner}: selector #{index}: CEL compile error: {message}")]
    SelectorCompile {
        /// Class or claim.
        owner: SelectorOwner,
        /// Index of the selector.
        index: usize,
        /// Compiler message.
        message: String,
    },
    /// A selector failed while evaluating it for a device.
    #[error("{owner}: selector #{index} on device {device}: CEL runtime error: {message}")]
    SelectorRuntime {
        /// Class or claim.
        owner: SelectorOwner,
        /// Index of the selector.
        index: usize,
        /// `driver/pool/device`.
        device: String,
        /// Evaluation message (a missing attribute, the cost limit, ...).
        message: String,
    },
    /// A selector without a CEL expression.
    #[error(
        "claim {claim}, request {request}, selector #{index}: CEL expression empty (unsupported selector type?)"
    )]
    EmptySelector {
        /// Claim (`namespace/name`).
        claim: String,
        /// Request.
        request: String,
        /// Selector index.
        index: usize,
    },
    /// A request without a DeviceClass name.
    #[error(
        "claim {claim}, request {request}: missing device class name (unsupported request type?)"
    )]
    MissingClassName {
        /// Claim.
        claim: String,
        /// Request.
        request: String,
    },
    /// A request names a DeviceClass that does not exist.
    #[error(
        "claim {claim}, request {request}: could not retrieve device class {class}: deviceclass \"{class}\" not found"
    )]
    ClassNotFound {
        /// Claim.
        claim: String,
        /// Request.
        request: String,
        /// The missing class.
        class: String,
    },
    /// A request that is neither `exactly` nor `firstAvailable`.
    #[error(
        "claim {claim}, request {request}: neither exactly nor firstAvailable is set (unsupported request type?)"
    )]
    EmptyRequest {
        /// Claim.
        claim: String,
        /// Request.
        request: String,
    },
    /// An allocation mode other than `ExactCount` and `All`.
    #[error("claim {claim}, request {request}: unsupported count mode {mode}")]
    UnsupportedMode {
        /// Claim.
        claim: String,
        /// Request.
        request: String,
        /// The mode as written.
        mode: String,
    },
    /// An invalid capacity request.
    #[error("claim {claim}, request {request}: {message}")]
    CapacityRequest {
        /// Claim.
        claim: String,
        /// Request.
        request: String,
        /// What is wrong.
        message: String,
    },
    /// A claim asks for more devices than an allocation result can hold.
    #[error(
        "claim {claim}: number of requested devices {count} exceeds the claim limit of {limit}"
    )]
    TooManyDevices {
        /// Claim.
        claim: String,
        /// Minimum number of devices asked for.
        count: usize,
        /// The limit (32).
        limit: usize,
    },
    /// A constraint without a known kind.
    #[error("claim {claim}, constraint #{index}: empty constraint (unsupported constraint type?)")]
    EmptyConstraint {
        /// Claim.
        claim: String,
        /// Constraint index.
        index: usize,
    },
    /// An `All` request over a pool that is being updated.
    #[error(
        "claim {claim}, request {request}: asks for all devices, but resource pool {pool} is currently being updated"
    )]
    AllIncompletePool {
        /// Claim.
        claim: String,
        /// Request.
        request: String,
        /// `driver/pool`.
        pool: String,
    },
    /// An `All` request over an invalid pool.
    #[error(
        "claim {claim}, request {request}: asks for all devices, but resource pool {pool} is currently invalid"
    )]
    AllInvalidPool {
        /// Claim.
        claim: String,
        /// Request.
        request: String,
        /// `driver/pool`.
        pool: String,
    },
    /// An `All` request whose devices break a claim constraint.
    #[error(
        "claim {claim}, request {request}: cannot add device {device} because a claim constraint would not be satisfied"
    )]
    AllConstraint {
        /// Claim.
        claim: String,
        /// Request.
        request: String,
        /// `driver/pool/device`.
        device: String,
    },
    /// Nothing could be allocated and some pool was invalid (duplicate device names, unknown
    /// counter sets, ...).
    #[error("invalid resource pools were encountered: {reasons}")]
    InvalidPools {
        /// `driver/pool: reason`, one per invalid pool.
        reasons: String,
    },
    /// A malformed node selector in a slice or device.
    #[error("gather pool information: {message}")]
    NodeSelection {
        /// What failed, naming the slice or device.
        message: String,
    },
    /// A device attribute the allocator cannot use in a constraint.
    #[error("claim {claim}: device {device}: attribute {attribute}: {message}")]
    Attribute {
        /// Claim.
        claim: String,
        /// `driver/pool/device`.
        device: String,
        /// Attribute name.
        attribute: String,
        /// What is wrong.
        message: String,
    },
    /// More claims than one allocation handles.
    #[error("{count} claims to allocate together, the limit is {limit}")]
    TooManyClaims {
        /// Number of claims.
        count: usize,
        /// The limit.
        limit: usize,
    },
    /// The selection policy gave no answer and the allocation runs fail-closed
    /// ([`AllocateOptions::fail_closed`](crate::AllocateOptions::fail_closed)).
    #[error("claim {claim}, request {request}: selection {failure}")]
    Policy {
        /// Claim.
        claim: String,
        /// Request (`request` or `request/subrequest`).
        request: String,
        /// The policy's name, the kind of failure and what went wrong.
        failure: Box<PolicyFailure>,
    },
    /// The search ran past its deadline.
    #[error("filter operation aborted: allocation took longer than {millis} ms")]
    Deadline {
        /// The deadline in milliseconds.
        millis: u128,
    },
}

impl AllocationError {
    /// Whether the error rules out only the node being allocated for, as the scheduler's
    /// per-node failures do (its pod stays unschedulable there and other nodes are tried),
    /// rather than the whole scheduling attempt: invalid pools, and an `All` request over an
    /// incomplete or invalid pool (per node from Kubernetes 1.38, kubernetes/kubernetes#141898;
    /// 1.37 aborted the attempt).
    pub fn only_this_node(&self) -> bool {
        matches!(
            self,
            AllocationError::InvalidPools { .. }
                | AllocationError::AllIncompletePool { .. }
                | AllocationError::AllInvalidPool { .. }
        )
    }
}
