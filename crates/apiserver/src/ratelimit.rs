//! The publisher's pacing: its request rate limit, on kubedev-core's token bucket, and an
//! exponential backoff for failures.

use std::time::Duration;

use kubedev_core::ratelimit::TokenBucket;

/// The limit on API requests: `qps` per second on average, bursts of up to `burst` (at least
/// one). A `qps` of zero or less (or not a number, or infinite) means no limit.
pub(crate) fn request_limit(qps: f64, burst: u32) -> TokenBucket {
    if qps.is_finite() && qps > 0.0 {
        TokenBucket::new(qps, f64::from(burst.max(1)))
    } else {
        TokenBucket::unlimited()
    }
}

/// Delays after consecutive failures: `initial`, doubling, capped at `max`; no jitter.
#[derive(Debug)]
pub(crate) struct Backoff {
    initial: Duration,
    max: Duration,
    failures: u32,
}

impl Backoff {
    pub(crate) fn new(initial: Duration, max: Duration) -> Self {
        Backoff {
            initial,
            max: max.max(initial),
            failures: 0,
        }
    }

    /// The delay before the next attempt, counting one more failure.
    pub(crate) fn next_delay(&mut self) -> Duration {
        let factor = 2u32.saturating_pow(self.failures.min(31));
        self.failures = self.failures.saturating_add(1);
        self.initial.saturating_mul(factor).min(self.max)
    }

    /// Forgets the failures after a success.
    pub(crate) fn reset(&mut self) {
        self.failures = 0;
    }

    /// True after at least one failure since the last success.
    pub(crate) fn failing(&self) -> bool {
        self.failures > 0
    }
}

#[cfg(test)]
mod tests {
    use tokio::time::Instant;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn zero_rate_is_unlimited() {
        let mut bucket = request_limit(0.0, 1);
        let start = Instant::now();
        for _ in 0..1000 {
            bucket.acquire().await;
        }
        assert_eq!(start.elapsed(), Duration::ZERO);
    }

    #[test]
    fn backoff_doubles_up_to_the_cap_and_resets() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
        let delays: Vec<u128> = (0..6).map(|_| b.next_delay().as_millis()).collect();
        assert_eq!(delays, vec![100, 200, 400, 800, 1000, 1000]);
        assert!(b.failing());
        b.reset();
        assert!(!b.failing());
        assert_eq!(b.next_delay(), Duration::from_millis(100));
        for _ in 0..100 {
            b.next_delay();
        }
        assert_eq!(b.next_delay(), Duration::from_secs(1));
    }
}
