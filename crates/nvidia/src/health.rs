//! GPU health as a small state machine over Xid events and NVML probes.
//!
//! - An Xid that is not ignored makes the GPU unhealthy with the Xid in the reason.
//! - A GPU whose probe reports "GPU lost" is unhealthy.
//! - A GPU that answers its probe again, and has had no Xid for the recheck period, is healthy
//!   again (a lost GPU that answers again recovers at once).
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
    /// Some other failure: not a health verdict, nothing changes.
    Failed(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Cause {
    Xid { last: Instant },
    Lost,
}

#[derive(Debug, Clone)]
struct GpuState {
    health: Health,
    cause: Option<Cause>,
}

/// Health of every GPU by UUID; GPUs never seen are healthy.
#[derive(Debug, Clone)]
pub(crate) struct HealthTracker {
    ignored: BTreeSet<u64>,
    recheck: Duration,
    gpus: BTreeMap<String, GpuState>,
}

/// The reason given for an Xid.
pub(crate) fn xid_reason(xid: Option<u64>) -> String {
    match xid {
        Some(x) => format!("Xid {x}: {}", xid_meaning(x)),
        None => "Xid unknown: NVML reported a critical error without a code".to_string(),
    }
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
        _ => "critical error reported by the driver",
    }
}

impl HealthTracker {
    /// A tracker that ignores `ignored` Xids and lets a GPU recover `recheck` after its last Xid.
    pub(crate) fn new(ignored: BTreeSet<u64>, recheck: Duration) -> Self {
        HealthTracker {
            ignored,
            recheck,
            gpus: BTreeMap::new(),
        }
    }

    /// The GPU's current health.
    pub(crate) fn health(&self, uuid: &str) -> Health {
        self.gpus
            .get(uuid)
            .map(|s| s.health.clone())
            .unwrap_or_default()
    }

    fn set(&mut self, uuid: &str, health: Health, cause: Option<Cause>) -> Option<Health> {
        let state = self.gpus.entry(uuid.to_owned()).or_insert(GpuState {
            health: Health::healthy(),
            cause: None,
        });
        state.cause = cause;
        if state.health == health {
            return None;
        }
        state.health = health.clone();
        Some(health)
    }

    /// An Xid arrived for the GPU (`None`: NVML did not say which). Returns the new health when
    /// it changed; an ignored Xid changes nothing.
    pub(crate) fn on_xid(&mut self, uuid: &str, xid: Option<u64>, now: Instant) -> Option<Health> {
        if let Some(x) = xid
            && self.ignored.contains(&x)
        {
            return None;
        }
        self.set(
            uuid,
            Health::unhealthy(xid_reason(xid)),
            Some(Cause::Xid { last: now }),
        )
    }

    /// The result of probing the GPU. Returns the new health when it changed.
    pub(crate) fn on_probe(&mut self, uuid: &str, probe: &Probe, now: Instant) -> Option<Health> {
        match probe {
            Probe::Lost(why) => self.set(
                uuid,
                Health::unhealthy(format!("GPU lost: {why}")),
                Some(Cause::Lost),
            ),
            Probe::Failed(_) => None,
            Probe::Answers => {
                let cause = self.gpus.get(uuid).and_then(|s| s.cause.clone());
                match cause {
                    None => None,
                    Some(Cause::Xid { last }) if now.duration_since(last) < self.recheck => None,
                    Some(_) => self.set(uuid, Health::healthy(), None),
                }
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
    fn xid_then_recovery_after_the_recheck_period() {
        let mut t = tracker();
        let t0 = Instant::now();
        assert!(t.health("GPU-a").is_healthy());
        let h = t.on_xid("GPU-a", Some(79), t0).expect("changed");
        assert!(!h.is_healthy());
        assert!(
            h.reason.as_deref().unwrap_or("").starts_with("Xid 79"),
            "{h:?}"
        );
        // The same Xid again restarts the clock but is no change; another Xid updates the reason.
        assert_eq!(
            t.on_xid("GPU-a", Some(79), t0 + Duration::from_secs(10)),
            None
        );
        let h = t
            .on_xid("GPU-a", Some(48), t0 + Duration::from_secs(30))
            .expect("new reason");
        assert!(
            h.reason.as_deref().unwrap_or("").starts_with("Xid 48"),
            "{h:?}"
        );
        assert_eq!(
            t.on_probe("GPU-a", &Probe::Answers, t0 + Duration::from_secs(61)),
            None,
            "only 31 s since the last Xid"
        );
        let h = t
            .on_probe("GPU-a", &Probe::Answers, t0 + Duration::from_secs(91))
            .expect("recovers");
        assert!(h.is_healthy());
        assert_eq!(
            t.on_probe("GPU-a", &Probe::Answers, t0 + Duration::from_secs(200)),
            None
        );
    }

    #[test]
    fn ignored_xids_change_nothing() {
        let mut t = tracker();
        assert_eq!(t.on_xid("GPU-a", Some(13), Instant::now()), None);
        assert!(t.health("GPU-a").is_healthy());
        assert!(
            t.on_xid("GPU-a", None, Instant::now()).is_some(),
            "unknown Xid counts"
        );
    }

    #[test]
    fn lost_gpus_are_unhealthy_until_they_answer() {
        let mut t = tracker();
        let now = Instant::now();
        let h = t
            .on_probe("GPU-b", &Probe::Lost("GPU is lost".into()), now)
            .expect("changed");
        assert!(h.reason.as_deref().unwrap_or("").contains("GPU lost"));
        assert_eq!(
            t.on_probe("GPU-b", &Probe::Failed("timeout".into()), now),
            None
        );
        assert!(!t.health("GPU-b").is_healthy());
        assert!(
            t.on_probe("GPU-b", &Probe::Answers, now)
                .expect("back")
                .is_healthy()
        );
    }
}
