//! GPU health as a small state machine over Xid events and NVML probes.
//!
//! - An Xid that is not ignored makes the GPU unhealthy with the Xid in the reason; an Xid after
//!   which the GPU needs a reset (see [`needs_reset`]) makes it unusable for the workloads already
//!   on it too ([`Health::unusable`], published as a `NoExecute` taint).
//! - A GPU whose probe reports "GPU lost" is unusable.
//! - A healthy GPU whose probe fails otherwise [`UNANSWERED_PROBES`] times in a row is of
//!   unknown health: NVML cannot tell (an unhealthy GPU stays unhealthy).
//! - A GPU that answers its probe again, and has had no Xid for the recheck period, is healthy
//!   again (a lost GPU, or one NVML could not tell about, that answers again recovers at once).
//!
//! Time is passed in, so the machine is tested without waiting.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use kubedev_core::Health;

/// What an NVML probe of one GPU said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Probe {
    /// The GPU answered.
    Answers,
    /// NVML says the GPU has fallen off the bus.
    Lost(String),
    /// Some other failure: not a health verdict by itself.
    Failed(String),
}

/// How many probes in a row must fail (other than "GPU lost") before a healthy GPU's health is
/// unknown.
pub(crate) const UNANSWERED_PROBES: u32 = 3;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Cause {
    Xid { last: Instant },
    Lost,
    Unanswered,
}

#[derive(Debug, Clone)]
struct State {
    health: Health,
    cause: Option<Cause>,
}

/// What health is tracked for: a whole GPU (`gi: None`) or one of its MIG GPU instances.
pub(crate) type Scope = (String, Option<u32>);

/// Health of every GPU and MIG GPU instance; anything never seen is healthy.
///
/// A MIG device is as healthy as the worse of its GPU and its GPU instance: an Xid NVML scopes
/// to a GPU instance affects only the MIG devices of that instance.
#[derive(Debug, Clone)]
pub(crate) struct HealthTracker {
    ignored: BTreeSet<u64>,
    recheck: Duration,
    states: BTreeMap<Scope, State>,
    /// GPU → probes failed in a row.
    unanswered: BTreeMap<String, u32>,
}

/// The reason given for an Xid.
pub(crate) fn xid_reason(xid: Option<u64>) -> String {
    match xid {
        Some(x) => format!("Xid {x}: {}", xid_meaning(x)),
        None => "Xid unknown: NVML reported a critical error without a code".to_string(),
    }
}

/// Whether the GPU needs a reset after Xid `x` before any workload can use it again (NVIDIA's
/// Xid catalog: double-bit and uncontained ECC errors, row-remapping and page-retirement
/// events, NVLink errors, a GPU that fell off the bus, GSP errors, unrecovered ECC errors). An
/// Xid without a code is not assumed to need one.
pub(crate) fn needs_reset(x: u64) -> bool {
    matches!(x, 48 | 63 | 64 | 74 | 79 | 95 | 119 | 120 | 140)
}

fn xid_meaning(x: u64) -> &'static str {
    match x {
        48 => "double-bit ECC error",
        61 | 62 => "internal micro-controller error",
        63 | 64 => "ECC page retirement or row remapping event",
        74 => "NVLink error",
        79 => "GPU has fallen off the bus",
        92 => "high single-bit ECC error rate",
        94 => "contained ECC error",
        95 => "uncontained ECC error",
        119 | 120 => "GSP error",
        140 => "unrecovered ECC error",
        _ => "critical error reported by the driver",
    }
}

impl HealthTracker {
    /// A tracker that ignores `ignored` Xids and lets a GPU recover `recheck` after its last Xid.
    pub(crate) fn new(ignored: BTreeSet<u64>, recheck: Duration) -> Self {
        HealthTracker {
            ignored,
            recheck,
            states: BTreeMap::new(),
            unanswered: BTreeMap::new(),
        }
    }

    fn get(&self, gpu: &str, gi: Option<u32>) -> Health {
        self.states
            .get(&(gpu.to_owned(), gi))
            .map(|s| s.health.clone())
            .unwrap_or_default()
    }

    /// The health of a device on GPU `gpu`: the whole GPU (`gi: None`) or a MIG device of GPU
    /// instance `gi` (the worse of the GPU's and the instance's; the GPU's reason first).
    pub(crate) fn health(&self, gpu: &str, gi: Option<u32>) -> Health {
        let whole = self.get(gpu, None);
        match gi {
            Some(_) if whole.is_healthy() => self.get(gpu, gi),
            _ => whole,
        }
    }

    fn set(&mut self, scope: Scope, health: Health, cause: Option<Cause>) -> bool {
        let state = self.states.entry(scope).or_insert(State {
            health: Health::healthy(),
            cause: None,
        });
        state.cause = cause;
        if state.health == health {
            return false;
        }
        state.health = health;
        true
    }

    /// An Xid arrived for GPU `gpu`, scoped to GPU instance `gi` when NVML said so (`xid`
    /// `None`: NVML did not give the code). Returns whether anything changed; an ignored Xid
    /// changes nothing.
    pub(crate) fn on_xid(
        &mut self,
        gpu: &str,
        gi: Option<u32>,
        xid: Option<u64>,
        now: Instant,
    ) -> bool {
        if let Some(x) = xid
            && self.ignored.contains(&x)
        {
            return false;
        }
        let mut reason = xid_reason(xid);
        if let Some(g) = gi {
            reason = format!("{reason} (GPU instance {g})");
        }
        let health = if xid.is_some_and(needs_reset) {
            Health::unusable(reason)
        } else {
            Health::unhealthy(reason)
        };
        self.set((gpu.to_owned(), gi), health, Some(Cause::Xid { last: now }))
    }

    /// The result of probing GPU `gpu`: lost marks the GPU unhealthy; an answer heals the GPU
    /// and its instances whose last Xid is older than the recheck period. Returns whether
    /// anything changed.
    pub(crate) fn on_probe(&mut self, gpu: &str, probe: &Probe, now: Instant) -> bool {
        if !matches!(probe, Probe::Failed(_)) {
            self.unanswered.remove(gpu);
        }
        match probe {
            Probe::Lost(why) => self.set(
                (gpu.to_owned(), None),
                Health::unusable(format!("GPU lost: {why}")),
                Some(Cause::Lost),
            ),
            Probe::Failed(why) => {
                let n = self.unanswered.entry(gpu.to_owned()).or_default();
                *n = n.saturating_add(1);
                if *n < UNANSWERED_PROBES || !self.get(gpu, None).is_healthy() {
                    return false;
                }
                self.set(
                    (gpu.to_owned(), None),
                    Health::unknown(format!(
                        "NVML cannot tell: the last {UNANSWERED_PROBES} probes of the GPU failed ({why})"
                    )),
                    Some(Cause::Unanswered),
                )
            }
            Probe::Answers => {
                let recheck = self.recheck;
                let mut changed = false;
                for ((g, _), state) in self.states.iter_mut() {
                    if g != gpu {
                        continue;
                    }
                    let heal = match state.cause {
                        None => false,
                        Some(Cause::Xid { last }) => now.duration_since(last) >= recheck,
                        Some(Cause::Lost | Cause::Unanswered) => true,
                    };
                    if heal {
                        state.cause = None;
                        changed |= !state.health.is_healthy();
                        state.health = Health::healthy();
                    }
                }
                changed
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tracker() -> HealthTracker {
        HealthTracker::new(BTreeSet::from([13, 31, 43]), Duration::from_secs(60))
    }

    #[test]
    fn xids_that_need_a_reset_make_the_gpu_unusable_for_running_work() {
        let mut t = tracker();
        let t0 = Instant::now();
        t.on_xid("GPU-a", None, Some(79), t0);
        let h = t.health("GPU-a", None);
        assert!(h.evict, "{h:?}");
        assert!(t.health("GPU-a", Some(1)).evict, "its MIG devices too");
        // A contained ECC error stops the applications it hit; the GPU itself goes on.
        t.on_xid("GPU-b", None, Some(94), t0);
        let h = t.health("GPU-b", None);
        assert!(!h.is_healthy() && !h.evict, "{h:?}");
        t.on_probe("GPU-c", &Probe::Lost("GPU is lost".into()), t0);
        assert!(t.health("GPU-c", None).evict);
        // Recovery clears it.
        t.on_probe("GPU-c", &Probe::Answers, t0);
        assert_eq!(t.health("GPU-c", None), Health::healthy());
    }

    #[test]
    fn xid_then_recovery_after_the_recheck_period() {
        let mut t = tracker();
        let t0 = Instant::now();
        assert!(t.health("GPU-a", None).is_healthy());
        assert!(t.on_xid("GPU-a", None, Some(79), t0));
        let h = t.health("GPU-a", None);
        assert!(!h.is_healthy());
        assert!(
            h.reason.as_deref().unwrap_or("").starts_with("Xid 79"),
            "{h:?}"
        );
        assert!(
            !t.health("GPU-a", Some(3)).is_healthy(),
            "its MIG devices too"
        );
        // The same Xid again restarts the clock but is no change; another Xid updates the reason.
        assert!(!t.on_xid("GPU-a", None, Some(79), t0 + Duration::from_secs(10)));
        assert!(t.on_xid("GPU-a", None, Some(48), t0 + Duration::from_secs(30)));
        assert!(
            t.health("GPU-a", None)
                .reason
                .as_deref()
                .unwrap_or("")
                .starts_with("Xid 48")
        );
        assert!(
            !t.on_probe("GPU-a", &Probe::Answers, t0 + Duration::from_secs(61)),
            "only 31 s since the last Xid"
        );
        assert!(t.on_probe("GPU-a", &Probe::Answers, t0 + Duration::from_secs(91)));
        assert!(t.health("GPU-a", None).is_healthy());
        assert!(!t.on_probe("GPU-a", &Probe::Answers, t0 + Duration::from_secs(200)));
    }

    #[test]
    fn instance_scoped_xids_affect_only_that_instance() {
        let mut t = tracker();
        let t0 = Instant::now();
        assert!(t.on_xid("GPU-a", Some(2), Some(94), t0));
        assert!(t.health("GPU-a", None).is_healthy());
        assert!(t.health("GPU-a", Some(1)).is_healthy());
        let h = t.health("GPU-a", Some(2));
        assert!(
            h.reason.as_deref().unwrap_or("").contains("GPU instance 2"),
            "{h:?}"
        );
        assert!(t.health("GPU-b", Some(2)).is_healthy());
        assert!(t.on_probe("GPU-a", &Probe::Answers, t0 + Duration::from_secs(60)));
        assert!(t.health("GPU-a", Some(2)).is_healthy());
    }

    #[test]
    fn ignored_xids_change_nothing() {
        let mut t = tracker();
        assert!(!t.on_xid("GPU-a", None, Some(13), Instant::now()));
        assert!(t.health("GPU-a", None).is_healthy());
        assert!(
            t.on_xid("GPU-a", None, None, Instant::now()),
            "unknown Xid counts"
        );
    }

    #[test]
    fn a_gpu_nvml_cannot_tell_about_is_unknown_until_it_answers() {
        let mut t = tracker();
        let now = Instant::now();
        let failed = Probe::Failed("Unknown Error".into());
        for _ in 1..UNANSWERED_PROBES {
            assert!(!t.on_probe("GPU-a", &failed, now));
        }
        // An answer in between starts the count again.
        assert!(!t.on_probe("GPU-a", &Probe::Answers, now));
        for _ in 1..UNANSWERED_PROBES {
            assert!(!t.on_probe("GPU-a", &failed, now));
        }
        assert!(t.on_probe("GPU-a", &failed, now));
        let h = t.health("GPU-a", None);
        assert_eq!(h.state, kubedev_core::HealthState::Unknown);
        assert!(
            h.reason.as_deref().unwrap_or("").contains("Unknown Error"),
            "{h:?}"
        );
        // Its MIG devices are unknown too.
        assert_eq!(
            t.health("GPU-a", Some(1)).state,
            kubedev_core::HealthState::Unknown
        );
        assert!(!t.on_probe("GPU-a", &failed, now), "no news");
        assert!(t.on_probe("GPU-a", &Probe::Answers, now));
        assert!(t.health("GPU-a", None).is_healthy());

        // An unhealthy GPU stays unhealthy whatever NVML fails to say.
        assert!(t.on_xid("GPU-b", None, Some(79), now));
        for _ in 0..UNANSWERED_PROBES * 2 {
            assert!(!t.on_probe("GPU-b", &failed, now));
        }
        assert_eq!(
            t.health("GPU-b", None).state,
            kubedev_core::HealthState::Unhealthy
        );
    }

    #[test]
    fn lost_gpus_are_unhealthy_until_they_answer() {
        let mut t = tracker();
        let now = Instant::now();
        assert!(t.on_probe("GPU-b", &Probe::Lost("GPU is lost".into()), now));
        let h = t.health("GPU-b", None);
        assert!(h.reason.as_deref().unwrap_or("").contains("GPU lost"));
        assert!(!t.on_probe("GPU-b", &Probe::Failed("timeout".into()), now));
        assert!(!t.health("GPU-b", None).is_healthy());
        assert!(t.on_probe("GPU-b", &Probe::Answers, now));
        assert!(t.health("GPU-b", None).is_healthy());
    }
}
