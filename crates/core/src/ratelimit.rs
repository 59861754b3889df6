//! Rate limiting: one token bucket for everything kubedev paces or keeps from flooding its log.
//!
//! A [`TokenBucket`] holds up to `burst` tokens and gains `per_second` tokens every second; each
//! action takes one. Callers that must do the action wait for a token
//! ([`acquire`](TokenBucket::acquire), e.g. requests to the API server); callers that may skip
//! it ask whether there is one ([`take`](TokenBucket::take), e.g. a log line).
//!
//! ```
//! use kubedev_core::ratelimit::TokenBucket;
//!
//! // Three warnings at once, then one every ten seconds.
//! let mut warnings = TokenBucket::new(0.1, 3.0);
//! assert!(warnings.take() && warnings.take() && warnings.take());
//! assert!(!warnings.take());
//! ```

use std::time::Duration;

use tokio::time::Instant;

/// Allows `burst` actions at once and `per_second` on average.
///
/// The bucket starts full. Time is Tokio's clock ([`tokio::time::Instant`]), so tests with
/// paused time control it; outside a runtime it is the system's monotonic clock.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    /// Tokens gained per second; zero when the bucket never refills.
    per_second: f64,
    /// The most tokens the bucket holds.
    burst: f64,
    tokens: f64,
    last: Instant,
    /// Every action is allowed at once.
    unlimited: bool,
}

impl TokenBucket {
    /// A full bucket of `burst` tokens that gains `per_second` tokens a second.
    ///
    /// A `per_second` of zero (or less, or not a number) never refills: `burst` actions in all;
    /// an infinite one allows everything, like [`unlimited`](Self::unlimited). With a `burst`
    /// below one the bucket never holds a whole token and allows nothing.
    pub fn new(per_second: f64, burst: f64) -> Self {
        let per_second = if per_second > 0.0 { per_second } else { 0.0 };
        let burst = if burst > 0.0 { burst } else { 0.0 };
        TokenBucket {
            per_second,
            burst,
            tokens: burst,
            last: Instant::now(),
            unlimited: per_second.is_infinite(),
        }
    }

    /// A bucket that allows everything at once.
    pub fn unlimited() -> Self {
        TokenBucket {
            unlimited: true,
            ..TokenBucket::new(0.0, 0.0)
        }
    }

    /// Whether every action is allowed at once.
    pub fn is_unlimited(&self) -> bool {
        self.unlimited
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.per_second).min(self.burst);
        self.last = now;
    }

    /// Takes one token if there is one: true when the action may go ahead now.
    pub fn take(&mut self) -> bool {
        if self.unlimited {
            return true;
        }
        self.refill(Instant::now());
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// Waits until there is a token, and takes it. A bucket that never refills waits forever
    /// once it is empty.
    pub async fn acquire(&mut self) {
        if self.unlimited {
            return;
        }
        self.refill(Instant::now());
        if self.tokens < 1.0 {
            if self.per_second == 0.0 {
                std::future::pending::<()>().await;
            }
            let wait = Duration::from_secs_f64((1.0 - self.tokens) / self.per_second);
            tokio::time::sleep(wait).await;
            self.refill(Instant::now());
        }
        // After the wait the bucket holds (almost exactly) one token; rounding must not make
        // the next caller wait for a sliver.
        self.tokens = (self.tokens - 1.0).max(0.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn bursts_then_paces() {
        let mut bucket = TokenBucket::new(10.0, 3.0);
        let start = Instant::now();
        for _ in 0..3 {
            bucket.acquire().await;
        }
        assert_eq!(start.elapsed(), Duration::ZERO, "a burst of three is free");
        for _ in 0..10 {
            bucket.acquire().await;
        }
        let elapsed = start.elapsed();
        assert!(
            elapsed >= Duration::from_millis(999) && elapsed <= Duration::from_millis(1010),
            "ten more at 10/s take a second, took {elapsed:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn refills_while_idle_up_to_the_burst() {
        let mut bucket = TokenBucket::new(1.0, 2.0);
        bucket.acquire().await;
        bucket.acquire().await;
        tokio::time::sleep(Duration::from_secs(100)).await;
        let start = Instant::now();
        bucket.acquire().await;
        bucket.acquire().await;
        assert_eq!(start.elapsed(), Duration::ZERO);
        bucket.acquire().await;
        assert_eq!(start.elapsed(), Duration::from_secs(1));
    }

    #[test]
    fn allows_the_burst_then_refuses() {
        let mut b = TokenBucket::new(0.0, 3.0);
        assert!(b.take() && b.take() && b.take());
        assert!(!b.take());
    }

    #[tokio::test(start_paused = true)]
    async fn take_refills_with_time() {
        let mut b = TokenBucket::new(2.0, 1.0);
        assert!(b.take());
        assert!(!b.take());
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(b.take());
        assert!(!b.take());
    }

    #[tokio::test(start_paused = true)]
    async fn unlimited_allows_everything_at_once() {
        for mut bucket in [
            TokenBucket::unlimited(),
            TokenBucket::new(f64::INFINITY, 1.0),
        ] {
            let start = Instant::now();
            for _ in 0..1000 {
                assert!(bucket.take());
                bucket.acquire().await;
            }
            assert_eq!(start.elapsed(), Duration::ZERO);
        }
    }

    #[test]
    fn an_empty_bucket_allows_nothing() {
        let mut b = TokenBucket::new(0.0, 0.0);
        assert!(!b.take());
        assert!(!TokenBucket::new(f64::NAN, f64::NAN).take());
    }
}
