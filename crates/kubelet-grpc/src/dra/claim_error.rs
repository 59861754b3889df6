//! Why one claim could not be prepared or unprepared, and whether asking again can help.

use std::fmt;

/// Whether a failed claim can succeed when the kubelet calls again.
///
/// The kubelet retries every failed claim on its next pod sync whatever the driver says; the
/// difference is what the message tells the person reading the pod's events, what the driver
/// logs, and what its metrics count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Retry {
    /// A condition that can pass on its own: an API server that did not answer, a device that
    /// is busy or unhealthy now, a write that failed. The kubelet's next call may succeed.
    Retryable,
    /// The claim cannot be prepared on this node as it is: it names a device this node does not
    /// have, it is no longer allocated, its configuration is invalid, or the request itself is
    /// malformed. Only a change to the claim (or the driver's configuration) helps.
    Permanent,
}

impl Retry {
    /// `Retryable` when `retryable` is true, else `Permanent`: from an error's own verdict,
    /// e.g. `PrepareError::is_retryable`.
    pub fn from_retryable(retryable: bool) -> Self {
        if retryable {
            Retry::Retryable
        } else {
            Retry::Permanent
        }
    }

    /// `retryable` or `permanent`, as metrics and logs label it.
    pub fn as_str(self) -> &'static str {
        match self {
            Retry::Retryable => "retryable",
            Retry::Permanent => "permanent",
        }
    }
}

impl fmt::Display for Retry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One claim's failure: a short reason for metrics, whether retrying can help, and the message.
///
/// The kubelet receives [`ClaimError::kubelet_message`] in that claim's entry of the response.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ClaimError {
    reason: &'static str,
    retry: Retry,
    message: String,
}

impl ClaimError {
    /// A failure that may pass if the kubelet calls again. `reason` is a short snake_case label
    /// (`checkpoint`, `claim_lookup`, …); `message` says what went wrong, naming the claim.
    pub fn retryable(reason: &'static str, message: impl Into<String>) -> Self {
        ClaimError {
            reason,
            retry: Retry::Retryable,
            message: message.into(),
        }
    }

    /// A failure that calling again cannot fix; see [`Retry::Permanent`].
    pub fn permanent(reason: &'static str, message: impl Into<String>) -> Self {
        ClaimError {
            reason,
            retry: Retry::Permanent,
            message: message.into(),
        }
    }

    /// A failure with `retry` decided by the caller.
    pub fn new(reason: &'static str, retry: Retry, message: impl Into<String>) -> Self {
        ClaimError {
            reason,
            retry,
            message: message.into(),
        }
    }

    /// The short reason, for metrics.
    pub fn reason(&self) -> &'static str {
        self.reason
    }

    /// Whether calling again can help.
    pub fn retry(&self) -> Retry {
        self.retry
    }

    /// Whether calling again can help.
    pub fn is_retryable(&self) -> bool {
        self.retry == Retry::Retryable
    }

    /// The message alone, without the retry advice.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// What the kubelet shows for this claim: the message, and for a permanent failure, that
    /// retrying will not help.
    pub fn kubelet_message(&self) -> String {
        match self.retry {
            Retry::Retryable => self.message.clone(),
            Retry::Permanent => format!(
                "{} (permanent: retrying cannot succeed until the claim or the driver's \
                 configuration changes)",
                self.message
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_permanent_failures_tell_the_kubelet_that_retrying_will_not_help() {
        let busy = ClaimError::retryable("device_in_use", "device gpu-0 is in use");
        assert!(busy.is_retryable());
        assert_eq!(busy.kubelet_message(), "device gpu-0 is in use");
        let gone = ClaimError::permanent("not_on_node", "device gpu-9 is not on this node");
        assert!(!gone.is_retryable());
        assert_eq!(gone.reason(), "not_on_node");
        assert!(
            gone.kubelet_message()
                .starts_with("device gpu-9 is not on this node (permanent: retrying cannot")
        );
        assert_eq!(gone.to_string(), "device gpu-9 is not on this node");
    }
}
