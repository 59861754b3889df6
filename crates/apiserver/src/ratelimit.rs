//! A token bucket for API requests and an exponential backoff for failures.

use std::time::Duration;

use tokio::time::Instant;

/// Allows `rate` requests per second on average and bursts of up to `burst`.
#[derive(Debug)]
pub(crate) struct TokenBucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    /// A full bucket. A rate of zero or less (or not a number) means no limit.
    pub(crate) fn new(rate: f64, burst: u32) -> Self {
        let burst = f64::from(burst.max(1));
        TokenBucket {
            rate,
            burst,
            tokens: burst,
            last: Instant::now(),
        }
    }

    fn unlimited(&self) -> bool {
        self.rate.is_nan() || self.rate <= 0.0 || self.rate.is_infinite()
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.rate).min(self.burst);
        self.last = now;
    }

    /// Waits until a request may be made, and takes its token.
    pub(crate) async fn acquire(&mut self) {
        if self.unlimited() {
            return;
        }
        self.refill(Instant::now());
        if self.tokens < 1.0 {
            let wait = Duration::from_secs_f64((1.0 - self.tokens) / self.rate);
            tokio::time::sleep(wait).await;
            self.refill(Instant::now());
        }
        // After the wait the bucket holds (almost exactly) one token; rounding must not make
        // the next caller wait for a sliver.
        self.tokens = (self.tokens - 1.0).max(0.0);
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
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn bursts_then_paces() {
        let mut bucket = TokenBucket::new(10.0, 3);
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
        let mut bucket = TokenBucket::new(1.0, 2);
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

    #[tokio::test(start_paused = true)]
    async fn zero_rate_is_unlimited() {
        let mut bucket = TokenBucket::new(0.0, 1);
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
