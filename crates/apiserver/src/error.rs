//! The crate's error type.

use std::time::Duration;

/// What went wrong talking to the API server, or with what it holds.
///
/// Every variant names the object (slice, node, claim) and the operation. API failures keep the
/// kube-rs error in `error` for callers that need it (see [`Error::http_status`]); the message
/// shows a short form of it (HTTP code, reason and the server's message).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The node name given to the publisher is not a valid Kubernetes node name.
    #[error("invalid node name {0}: {reason}", kubedev_core::echo::echo(.node))]
    InvalidNodeName {
        /// The rejected name.
        node: String,
        /// The rule it broke.
        reason: String,
    },
    /// The inventory breaks a ResourceSlice rule and cannot be published as it is.
    #[error("pool {pool}: {message}")]
    InvalidInventory {
        /// The pool (empty when the inventory as a whole is wrong).
        pool: String,
        /// What was wrong, naming the device or counter set.
        message: String,
    },
    /// A ResourceSlice request failed.
    #[error("{operation} ResourceSlice {slice}: {}", brief(error))]
    Slice {
        /// What was being done: "creating", "updating", "deleting", "reading".
        operation: &'static str,
        /// The slice's name (or its generateName for a create).
        slice: String,
        /// The kube-rs error.
        error: Box<kube::Error>,
    },
    /// Watching our ResourceSlices failed (the watch is restarted with backoff).
    #[error("watching ResourceSlices of driver {driver} on node {node}: {message}")]
    Watch {
        /// The driver.
        driver: String,
        /// The node.
        node: String,
        /// The watcher's error.
        message: String,
    },
    /// Reading the Node object (for the owner reference) failed.
    #[error("reading Node {node}: {}", brief(error))]
    Node {
        /// The node.
        node: String,
        /// The kube-rs error.
        error: Box<kube::Error>,
    },
    /// The publisher did not converge within the time given to `wait_synced`.
    #[error("ResourceSlices not in sync after {timeout:?}{}", last_error.as_deref().map(|e| format!("; last error: {e}")).unwrap_or_default())]
    NotSynced {
        /// How long was waited.
        timeout: Duration,
        /// The last error the publisher saw, if any.
        last_error: Option<String>,
    },
    /// Reading the API server's version failed or gave no release.
    #[error("reading the API server's version: {message}")]
    Version {
        /// What went wrong.
        message: String,
    },
    /// The publisher's background task was already started.
    #[error("the ResourceSlice publisher for driver {driver} on node {node} was already started")]
    AlreadyStarted {
        /// The driver.
        driver: String,
        /// The node.
        node: String,
    },
    /// The publisher's background task was stopped; nothing more is published.
    #[error("the ResourceSlice publisher for driver {driver} on node {node} is stopped")]
    Stopped {
        /// The driver.
        driver: String,
        /// The node.
        node: String,
    },
    /// `start` was called outside a Tokio runtime.
    #[error("starting the ResourceSlice publisher needs a Tokio runtime")]
    NoRuntime,
    /// Applying a DeviceClass failed.
    #[error("applying DeviceClass {class}: {}", brief(error))]
    DeviceClass {
        /// The class.
        class: String,
        /// The kube-rs error.
        error: Box<kube::Error>,
    },
    /// A ResourceClaim request failed.
    #[error("{operation} ResourceClaim {namespace}/{name}: {}", brief(error))]
    Claim {
        /// What was being done: "reading", "writing the status of".
        operation: &'static str,
        /// The claim's namespace.
        namespace: String,
        /// The claim's name.
        name: String,
        /// The kube-rs error.
        error: Box<kube::Error>,
    },
    /// Reading the cluster for `kubedev explain` failed.
    #[error("reading {what}: {}", brief(error))]
    ExplainRead {
        /// What was read, e.g. `resourceslices.resource.k8s.io/v1`.
        what: String,
        /// The kube-rs error.
        error: Box<kube::Error>,
    },
    /// What the cluster returned for `kubedev explain` cannot be used.
    #[error("reading {what}: {message}")]
    Explain {
        /// What was read.
        what: String,
        /// What is wrong.
        message: String,
    },
    /// Listing the ResourceClaims of the cluster failed.
    #[error("listing ResourceClaims: {}", brief(error))]
    ListClaims {
        /// The kube-rs error.
        error: Box<kube::Error>,
    },
    /// Recording a Kubernetes Event failed.
    #[error("recording an Event about {object}: {}", brief(error))]
    Event {
        /// The object the Event is about, e.g. `Node node-a`.
        object: String,
        /// The kube-rs error.
        error: Box<kube::Error>,
    },
    /// The ResourceClaim does not exist.
    #[error("ResourceClaim {namespace}/{name} not found")]
    ClaimNotFound {
        /// The claim's namespace.
        namespace: String,
        /// The claim's name.
        name: String,
    },
    /// The ResourceClaim exists under another UID: the claim the kubelet asked for was deleted
    /// and a new one with the same name created.
    #[error("ResourceClaim {namespace}/{name} has UID {actual}, expected {expected}")]
    ClaimUidMismatch {
        /// The claim's namespace.
        namespace: String,
        /// The claim's name.
        name: String,
        /// The UID asked for.
        expected: String,
        /// The UID the API server has.
        actual: String,
    },
    /// The ResourceClaim has no `status.allocation`.
    #[error("ResourceClaim {namespace}/{name} ({uid}) is not allocated")]
    ClaimNotAllocated {
        /// The claim's namespace.
        namespace: String,
        /// The claim's name.
        name: String,
        /// The claim's UID.
        uid: String,
    },
    /// The ResourceClaim holds something this driver cannot use.
    #[error("ResourceClaim {claim}: {message}")]
    ClaimContent {
        /// The claim (`namespace/name (uid)`).
        claim: String,
        /// What was wrong, naming the value.
        message: String,
    },
    /// Writing the claim's device status kept conflicting with other writers.
    #[error("ResourceClaim {claim}: status update still conflicting after {attempts} attempts")]
    ClaimConflict {
        /// The claim (`namespace/name (uid)`).
        claim: String,
        /// How many times it was tried.
        attempts: u32,
    },
}

impl Error {
    /// Whether the same request can succeed later without anything changing in the claim: false
    /// for a claim that is gone, replaced, not allocated, badly named or holding something this
    /// driver cannot use, and for a claim request the API server refused as such (a 4xx answer
    /// other than timeout, conflict and throttling: invalid, forbidden); true for other failed
    /// requests and everything else.
    pub fn is_retryable(&self) -> bool {
        if let Error::Claim { error, .. } = self
            && api_code(error)
                .is_some_and(|c| (400..500).contains(&c) && ![408, 409, 429].contains(&c))
        {
            return false;
        }
        !matches!(
            self,
            Error::ClaimNotFound { .. }
                | Error::ClaimUidMismatch { .. }
                | Error::ClaimNotAllocated { .. }
                | Error::ClaimContent { .. }
                | Error::InvalidNodeName { .. }
                | Error::InvalidInventory { .. }
        )
    }

    /// The HTTP status code of the API server's answer, for API failures.
    pub fn http_status(&self) -> Option<u16> {
        match self {
            Error::Slice { error, .. } | Error::Node { error, .. } | Error::Claim { error, .. } => {
                api_code(error)
            }
            _ => None,
        }
    }
}

/// The HTTP code of a kube-rs API error.
pub(crate) fn api_code(error: &kube::Error) -> Option<u16> {
    match error {
        kube::Error::Api(status) => Some(status.code),
        _ => None,
    }
}

/// A one-line form of a kube-rs error: for API answers the code, reason and message.
pub(crate) fn brief(error: &kube::Error) -> String {
    match error {
        kube::Error::Api(status) => {
            let mut s = format!("HTTP {}", status.code);
            if !status.reason.is_empty() {
                s.push(' ');
                s.push_str(&status.reason);
            }
            if !status.message.is_empty() {
                s.push_str(": ");
                s.push_str(&status.message);
            }
            s
        }
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api_error(code: u16, reason: &str, message: &str) -> kube::Error {
        let mut status = kube::core::Status::failure(message, reason);
        status.code = code;
        kube::Error::Api(Box::new(status))
    }

    #[test]
    fn slice_errors_name_the_slice_and_the_answer() {
        let err = Error::Slice {
            operation: "updating",
            slice: "00000-gpu.example.com-node-a-x7k2p".into(),
            error: Box::new(api_error(409, "Conflict", "the object has been modified")),
        };
        assert_eq!(
            kubedev_core::echo::chain(&err),
            "updating ResourceSlice 00000-gpu.example.com-node-a-x7k2p: HTTP 409 Conflict: the object has been modified"
        );
        assert_eq!(err.http_status(), Some(409));
    }

    #[test]
    fn not_synced_mentions_the_last_error_only_when_there_is_one() {
        let quiet = Error::NotSynced {
            timeout: Duration::from_secs(2),
            last_error: None,
        };
        assert_eq!(quiet.to_string(), "ResourceSlices not in sync after 2s");
        let loud = Error::NotSynced {
            timeout: Duration::from_secs(2),
            last_error: Some("HTTP 500".into()),
        };
        assert_eq!(
            loud.to_string(),
            "ResourceSlices not in sync after 2s; last error: HTTP 500"
        );
    }
}
