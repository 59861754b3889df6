//! When a long-running watch retries after failures, and which of those failures are logged.

use std::time::Duration;

use tokio::time::Instant;

/// Delays between attempts of a watch that keeps failing: `initial`, doubling up to `max`, each
/// spread by ±`jitter` (a fraction) so that many nodes do not retry in step.
///
/// The schedule starts over only when the watch has delivered data and then gone `healthy_after`
/// without a failure: a watch that lists and fails again at once keeps backing off.
#[derive(Debug, Clone)]
pub(crate) struct RetrySchedule {
    initial: Duration,
    max: Duration,
    jitter: f64,
    healthy_after: Duration,
    /// Failures since the schedule last started over.
    failures: u32,
    /// When the watch first delivered data after the last failure.
    healthy_since: Option<Instant>,
}

impl RetrySchedule {
    /// A schedule from `initial` doubling to `max`, spread by ±`jitter` (clamped to 0..=1),
    /// that starts over after `healthy_after` of health.
    pub(crate) fn new(
        initial: Duration,
        max: Duration,
        jitter: f64,
        healthy_after: Duration,
    ) -> Self {
        RetrySchedule {
            initial,
            max: max.max(initial),
            jitter: if jitter.is_finite() {
                jitter.clamp(0.0, 1.0)
            } else {
                0.0
            },
            healthy_after,
            failures: 0,
            healthy_since: None,
        }
    }

    /// The delay without jitter before the attempt that follows `failures` failures.
    fn base(&self, failures: u32) -> Duration {
        let factor = 2u32.saturating_pow(failures.min(31));
        self.initial.saturating_mul(factor).min(self.max)
    }

    /// Counts a failure at `now` and returns the delay before the next attempt. `unit`, in
    /// `0.0..1.0`, picks where in the jitter range the delay falls (0.5 is no jitter).
    pub(crate) fn failed(&mut self, now: Instant, unit: f64) -> Duration {
        if let Some(since) = self.healthy_since.take()
            && now.saturating_duration_since(since) >= self.healthy_after
        {
            self.failures = 0;
        }
        let base = self.base(self.failures);
        self.failures = self.failures.saturating_add(1);
        let unit = if unit.is_finite() {
            unit.clamp(0.0, 1.0)
        } else {
            0.5
        };
        base.mul_f64(1.0 + self.jitter * (2.0 * unit - 1.0))
    }

    /// Notes that the watch delivered data at `now`.
    pub(crate) fn delivered(&mut self, now: Instant) {
        if self.failures > 0 && self.healthy_since.is_none() {
            self.healthy_since = Some(now);
        }
    }
}

/// A number in `0.0..1.0` that differs from call to call, for jitter.
pub(crate) fn jitter_unit() -> f64 {
    use std::hash::{BuildHasher, Hasher};
    // Every `RandomState` is keyed afresh, so equal input hashes differently each time.
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default(),
    );
    (hasher.finish() >> 11) as f64 / (1u64 << 53) as f64
}

/// What to log about one failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FailureReport {
    /// The first failure after a success (or ever): log it.
    First,
    /// A later failure, the first for `every`: log a summary.
    Summary {
        /// Failures in a row, this one included.
        failures: u64,
        /// Failures since the last line that were not logged.
        suppressed: u64,
    },
    /// Not logged.
    Suppressed,
}

/// The end of a run of failures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Recovered {
    /// Failures in a row before the success.
    pub(crate) failures: u64,
    /// From the first failure to the success.
    pub(crate) outage: Duration,
}

/// Decides which failures of a run are logged: the first, then at most one summary line every
/// `every`, and one line when it works again.
#[derive(Debug, Clone)]
pub(crate) struct FailureLog {
    every: Duration,
    failures: u64,
    suppressed: u64,
    first_at: Option<Instant>,
    logged_at: Option<Instant>,
}

impl FailureLog {
    /// A log that writes at most one line every `every` while failures go on.
    pub(crate) fn new(every: Duration) -> Self {
        FailureLog {
            every,
            failures: 0,
            suppressed: 0,
            first_at: None,
            logged_at: None,
        }
    }

    /// Counts a failure at `now` and says what to log about it.
    pub(crate) fn failed(&mut self, now: Instant) -> FailureReport {
        self.failures += 1;
        match self.logged_at {
            None => {
                self.first_at = Some(now);
                self.logged_at = Some(now);
                FailureReport::First
            }
            Some(at) if now.saturating_duration_since(at) >= self.every => {
                self.logged_at = Some(now);
                FailureReport::Summary {
                    failures: self.failures,
                    suppressed: std::mem::take(&mut self.suppressed),
                }
            }
            Some(_) => {
                self.suppressed += 1;
                FailureReport::Suppressed
            }
        }
    }

    /// Notes a success at `now`; after failures, says how many there were and for how long.
    pub(crate) fn succeeded(&mut self, now: Instant) -> Option<Recovered> {
        let first = self.first_at.take()?;
        let recovered = Recovered {
            failures: self.failures,
            outage: now.saturating_duration_since(first),
        };
        self.failures = 0;
        self.suppressed = 0;
        self.logged_at = None;
        Some(recovered)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    fn schedule() -> RetrySchedule {
        RetrySchedule::new(Duration::from_millis(500), 30 * S, 0.25, 60 * S)
    }

    #[test]
    fn delays_double_to_the_cap_without_jitter_at_the_midpoint() {
        let mut s = schedule();
        let now = Instant::now();
        let delays: Vec<u128> = (0..10).map(|_| s.failed(now, 0.5).as_millis()).collect();
        assert_eq!(
            delays,
            [
                500, 1000, 2000, 4000, 8000, 16000, 30000, 30000, 30000, 30000
            ]
        );
    }

    #[test]
    fn jitter_stays_within_a_quarter_either_way() {
        let mut low = schedule();
        let mut high = schedule();
        let now = Instant::now();
        for _ in 0..8 {
            low.failed(now, 0.0);
            high.failed(now, 1.0);
        }
        assert_eq!(low.failed(now, 0.0), Duration::from_millis(22_500));
        assert_eq!(high.failed(now, 1.0), Duration::from_millis(37_500));
        let mut s = schedule();
        for _ in 0..1000 {
            let d = s.failed(now, jitter_unit());
            assert!(d >= Duration::from_millis(375) && d <= Duration::from_millis(37_500));
        }
    }

    #[test]
    fn data_alone_does_not_start_the_schedule_over() {
        let mut s = schedule();
        let start = Instant::now();
        s.failed(start, 0.5);
        s.failed(start, 0.5);
        // A list that works, and a watch that fails a second later: still backing off.
        s.delivered(start + S);
        assert_eq!(s.failed(start + 2 * S, 0.5), 2 * S);
        s.delivered(start + 3 * S);
        s.delivered(start + 50 * S);
        assert_eq!(s.failed(start + 62 * S, 0.5), 4 * S);
    }

    #[test]
    fn a_healthy_minute_starts_the_schedule_over() {
        let mut s = schedule();
        let start = Instant::now();
        for _ in 0..5 {
            s.failed(start, 0.5);
        }
        s.delivered(start + S);
        assert_eq!(
            s.failed(start + 61 * S, 0.5),
            Duration::from_millis(500),
            "healthy for 60 s: from the start"
        );
        assert_eq!(s.failed(start + 62 * S, 0.5), S);
    }

    #[test]
    fn odd_inputs_are_tamed() {
        let mut s = RetrySchedule::new(S, Duration::from_millis(1), f64::NAN, S);
        assert_eq!(
            s.failed(Instant::now(), f64::INFINITY),
            S,
            "max below initial"
        );
        let mut s = RetrySchedule::new(S, S, 7.0, S);
        assert_eq!(s.failed(Instant::now(), 2.0), 2 * S, "jitter at most 100%");
    }

    #[test]
    fn the_first_failure_is_logged_then_one_summary_a_minute() {
        let mut log = FailureLog::new(60 * S);
        let start = Instant::now();
        assert_eq!(log.failed(start), FailureReport::First);
        for t in [1, 3, 7, 15, 31] {
            assert_eq!(log.failed(start + t * S), FailureReport::Suppressed);
        }
        assert_eq!(
            log.failed(start + 61 * S),
            FailureReport::Summary {
                failures: 7,
                suppressed: 5
            }
        );
        assert_eq!(log.failed(start + 91 * S), FailureReport::Suppressed);
        assert_eq!(
            log.failed(start + 121 * S),
            FailureReport::Summary {
                failures: 9,
                suppressed: 1
            }
        );
        assert_eq!(
            log.succeeded(start + 130 * S),
            Some(Recovered {
                failures: 9,
                outage: 130 * S
            })
        );
        assert_eq!(log.succeeded(start + 131 * S), None, "said once");
        assert_eq!(log.failed(start + 140 * S), FailureReport::First);
    }
}
