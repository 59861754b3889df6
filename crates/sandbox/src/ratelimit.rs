//! How much the sandbox lets policies write to the host's log, on kubedev-core's token bucket.

pub(crate) use kubedev_core::ratelimit::TokenBucket;

/// Guest `kubedev.log` lines passed on to `tracing`, per policy: 20 at once, 5 a second.
pub(crate) fn guest_log_limit() -> TokenBucket {
    TokenBucket::new(5.0, 20.0)
}

/// Warnings about a policy's failed calls, per policy: 3 at once, one every 10 seconds.
pub(crate) fn failure_warning_limit() -> TokenBucket {
    TokenBucket::new(0.1, 3.0)
}
