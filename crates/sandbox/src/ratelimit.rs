//! A token bucket that keeps guest logs and failure warnings from flooding the host's log.

use std::time::Instant;

/// Allows `burst` events at once and `per_second` on average.
#[derive(Debug)]
pub(crate) struct TokenBucket {
    tokens: f64,
    burst: f64,
    per_second: f64,
    last: Instant,
}

impl TokenBucket {
    pub(crate) fn new(burst: f64, per_second: f64) -> Self {
        TokenBucket {
            tokens: burst,
            burst,
            per_second,
            last: Instant::now(),
        }
    }

    /// Takes one token if there is one.
    pub(crate) fn take(&mut self) -> bool {
        let now = Instant::now();
        let elapsed = now.duration_since(self.last).as_secs_f64();
        self.last = now;
        self.tokens = (self.tokens + elapsed * self.per_second).min(self.burst);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::TokenBucket;

    #[test]
    fn allows_the_burst_then_refuses() {
        let mut b = TokenBucket::new(3.0, 0.0);
        assert!(b.take() && b.take() && b.take());
        assert!(!b.take());
    }
}
