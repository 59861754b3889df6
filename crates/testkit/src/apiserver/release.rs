//! The Kubernetes releases the emulator can behave like, and their feature gates.
//!
//! Each release has its own default for every `resource.k8s.io` feature gate the emulator
//! models (stage and default as the release's `kube_features.go` declares them); a test may
//! override any of them, as `--feature-gates` would, except a gate locked to its default.

use std::collections::BTreeMap;
use std::fmt;

/// Names of the feature gates the emulator models.
pub mod gate {
    /// Shared counters, counter consumption and per-device node selection (KEP-4815).
    pub const DRA_PARTITIONABLE_DEVICES: &str = "DRAPartitionableDevices";
    /// Device taints (KEP-5055).
    pub const DRA_DEVICE_TAINTS: &str = "DRADeviceTaints";
    /// Binding conditions of devices (KEP-5007); needs [`DRA_RESOURCE_CLAIM_DEVICE_STATUS`] too.
    pub const DRA_DEVICE_BINDING_CONDITIONS: &str = "DRADeviceBindingConditions";
    /// `status.devices` of ResourceClaims (KEP-4817).
    pub const DRA_RESOURCE_CLAIM_DEVICE_STATUS: &str = "DRAResourceClaimDeviceStatus";
    /// Devices allocatable to several claims and capacity request policies (KEP-5075).
    pub const DRA_CONSUMABLE_CAPACITY: &str = "DRAConsumableCapacity";
    /// List-valued device attributes (KEP-5491); exists from 1.36.
    pub const DRA_LIST_TYPE_ATTRIBUTES: &str = "DRAListTypeAttributes";
    /// DeviceClasses requestable as extended resources (KEP-5004).
    pub const DRA_EXTENDED_RESOURCE: &str = "DRAExtendedResource";
}

/// A Kubernetes minor release whose API server the emulator imitates.
///
/// 1.38 (due 2026-12-16) follows its candidate v1.38.0-beta.0; it may still change before the
/// release.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
#[non_exhaustive]
pub enum KubeRelease {
    /// Kubernetes 1.34: `resource.k8s.io/v1` arrives; shared counters live in the slice of
    /// the devices that consume them.
    V1_34,
    /// Kubernetes 1.35: shared counters move to slices of their own in the pool.
    V1_35,
    /// Kubernetes 1.36: most DRA features reach beta and are on by default; list attributes
    /// arrive (alpha, off).
    V1_36,
    /// Kubernetes 1.37 (released 2026-08-26): device taints, extended resources and claim
    /// device status reach GA.
    V1_37,
    /// Kubernetes 1.38 (as v1.38.0-beta.0 has it): binding conditions, partitionable devices
    /// and consumable capacity reach GA; list-type attributes stay alpha.
    #[default]
    V1_38,
}

impl KubeRelease {
    /// Every supported release, oldest first.
    pub const ALL: [KubeRelease; 5] = [
        KubeRelease::V1_34,
        KubeRelease::V1_35,
        KubeRelease::V1_36,
        KubeRelease::V1_37,
        KubeRelease::V1_38,
    ];

    /// The newest supported release, the emulator's default.
    pub const NEWEST: KubeRelease = KubeRelease::V1_38;

    /// The major version, always 1.
    pub fn major(self) -> u32 {
        1
    }

    /// The minor version, e.g. 34.
    pub fn minor(self) -> u32 {
        match self {
            KubeRelease::V1_34 => 34,
            KubeRelease::V1_35 => 35,
            KubeRelease::V1_36 => 36,
            KubeRelease::V1_37 => 37,
            KubeRelease::V1_38 => 38,
        }
    }

    /// The release with this minor version, if supported.
    pub fn from_minor(minor: u32) -> Option<KubeRelease> {
        KubeRelease::ALL.into_iter().find(|r| r.minor() == minor)
    }

    /// The `gitVersion` the emulator reports at `/version`, e.g. `v1.34.0-kubedev-emulator`.
    pub fn git_version(self) -> String {
        format!("v{}.{}.0-kubedev-emulator", self.major(), self.minor())
    }

    /// The feature gates of this release with their default values.
    pub fn default_feature_gates(self) -> FeatureGates {
        let values = GATES
            .iter()
            .filter_map(|spec| spec.at(self).map(|s| (spec.name, s.default)))
            .collect();
        FeatureGates {
            release: self,
            values,
        }
    }

    /// Resolves overrides (later ones win) against this release's defaults, refusing unknown
    /// gates and changes to locked ones as the API server refuses to start with them.
    pub(crate) fn resolve_gates(
        self,
        overrides: &[(String, bool)],
    ) -> Result<FeatureGates, String> {
        let mut gates = self.default_feature_gates();
        for (name, enabled) in overrides {
            let Some(spec) = GATES.iter().find(|g| g.name == name) else {
                let known: Vec<&str> = GATES.iter().map(|g| g.name).collect();
                return Err(format!(
                    "unrecognized feature gate: {name} (the emulator models {})",
                    known.join(", ")
                ));
            };
            let Some(stage) = spec.at(self) else {
                return Err(format!(
                    "unrecognized feature gate: {name} (it does not exist in Kubernetes {self})"
                ));
            };
            if stage.locked && *enabled != stage.default {
                return Err(format!(
                    "cannot set feature gate {name} to {enabled}, feature is locked to {}",
                    stage.default
                ));
            }
            gates.values.insert(spec.name, *enabled);
        }
        Ok(gates)
    }

    pub(crate) fn at_least(self, other: KubeRelease) -> bool {
        self >= other
    }
}

impl fmt::Display for KubeRelease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major(), self.minor())
    }
}

/// The maturity of a feature gate in a release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum FeatureStage {
    /// Alpha: off by default.
    Alpha,
    /// Beta.
    Beta,
    /// Generally available.
    Ga,
}

#[derive(Debug, Clone, Copy)]
struct Stage {
    since: u32,
    stage: FeatureStage,
    default: bool,
    locked: bool,
}

struct GateSpec {
    name: &'static str,
    /// Entries in ascending `since` order; the last one at or before a release applies.
    history: &'static [Stage],
}

impl GateSpec {
    fn at(&self, release: KubeRelease) -> Option<Stage> {
        self.history
            .iter()
            .rev()
            .find(|s| s.since <= release.minor())
            .copied()
    }
}

const fn stage(since: u32, stage: FeatureStage, default: bool, locked: bool) -> Stage {
    Stage {
        since,
        stage,
        default,
        locked,
    }
}

use FeatureStage::{Alpha, Beta, Ga};

/// The upstream versioned specs of the modelled gates, as each release's `kube_features.go`
/// declares them (1.38: v1.38.0-beta.0). `cargo xtask cluster gates` compares them with the
/// `k8s.io/kubernetes` module the real cluster is built from.
const GATES: &[GateSpec] = &[
    GateSpec {
        name: gate::DRA_CONSUMABLE_CAPACITY,
        history: &[
            stage(34, Alpha, false, false),
            stage(36, Beta, true, false),
            // KEP-5075: GA in v1.38.0-beta.0, not yet locked (locked in 1.39).
            stage(38, Ga, true, false),
        ],
    },
    GateSpec {
        name: gate::DRA_DEVICE_BINDING_CONDITIONS,
        history: &[
            stage(34, Alpha, false, false),
            stage(36, Beta, true, false),
            // KEP-5007: GA and locked in v1.38.0-beta.0.
            stage(38, Ga, true, true),
        ],
    },
    GateSpec {
        name: gate::DRA_DEVICE_TAINTS,
        history: &[
            stage(33, Alpha, false, false),
            stage(36, Beta, true, false),
            stage(37, Ga, true, false),
            // Locked in 1.38.
            stage(38, Ga, true, true),
        ],
    },
    GateSpec {
        name: gate::DRA_EXTENDED_RESOURCE,
        history: &[
            stage(34, Alpha, false, false),
            stage(36, Beta, true, false),
            stage(37, Ga, true, true),
        ],
    },
    GateSpec {
        name: gate::DRA_LIST_TYPE_ATTRIBUTES,
        // KEP-5491 planned beta for 1.38; v1.38.0-beta.0 keeps it alpha.
        history: &[stage(36, Alpha, false, false)],
    },
    GateSpec {
        name: gate::DRA_PARTITIONABLE_DEVICES,
        history: &[
            stage(33, Alpha, false, false),
            stage(36, Beta, true, false),
            // KEP-4815: GA and locked in v1.38.0-beta.0.
            stage(38, Ga, true, true),
        ],
    },
    GateSpec {
        name: gate::DRA_RESOURCE_CLAIM_DEVICE_STATUS,
        history: &[
            stage(32, Alpha, false, false),
            stage(33, Beta, true, false),
            stage(37, Ga, true, true),
        ],
    },
];

/// The feature gates an emulator runs with: each modelled gate of its release and whether it
/// is on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FeatureGates {
    release: KubeRelease,
    values: BTreeMap<&'static str, bool>,
}

impl FeatureGates {
    /// The release these gates belong to.
    pub fn release(&self) -> KubeRelease {
        self.release
    }

    /// Whether the gate is on; `false` for a gate the release does not have.
    pub fn enabled(&self, gate: &str) -> bool {
        self.values.get(gate).copied().unwrap_or(false)
    }

    /// The gate's value, or `None` if the release does not have it.
    pub fn get(&self, gate: &str) -> Option<bool> {
        self.values.get(gate).copied()
    }

    /// Whether the gate is locked to its default in this release (`--feature-gates` may not
    /// change it); `false` for a gate the release does not have.
    pub fn locked(&self, gate: &str) -> bool {
        GATES
            .iter()
            .find(|g| g.name == gate)
            .and_then(|g| g.at(self.release))
            .is_some_and(|s| s.locked)
    }

    /// Every gate the emulator models, in name order.
    pub fn modelled() -> Vec<&'static str> {
        let mut names: Vec<&'static str> = GATES.iter().map(|g| g.name).collect();
        names.sort_unstable();
        names
    }

    /// The gate's stage in this release, or `None` if the release does not have it.
    pub fn stage(&self, gate: &str) -> Option<FeatureStage> {
        GATES
            .iter()
            .find(|g| g.name == gate)
            .and_then(|g| g.at(self.release))
            .map(|s| s.stage)
    }

    /// Every gate of the release and its value, in name order.
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, bool)> + '_ {
        self.values.iter().map(|(k, v)| (*k, *v))
    }
}

impl fmt::Display for FeatureGates {
    /// The `--feature-gates` form: `DRAConsumableCapacity=true,DRADeviceTaints=false,...`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.iter().map(|(k, v)| format!("{k}={v}")).collect();
        f.write_str(&parts.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_follow_each_release() {
        let on = |r: KubeRelease, g: &str| r.default_feature_gates().get(g);
        for g in [
            gate::DRA_PARTITIONABLE_DEVICES,
            gate::DRA_DEVICE_TAINTS,
            gate::DRA_DEVICE_BINDING_CONDITIONS,
            gate::DRA_CONSUMABLE_CAPACITY,
            gate::DRA_EXTENDED_RESOURCE,
        ] {
            assert_eq!(on(KubeRelease::V1_34, g), Some(false), "{g}");
            assert_eq!(on(KubeRelease::V1_35, g), Some(false), "{g}");
            assert_eq!(on(KubeRelease::V1_36, g), Some(true), "{g}");
            assert_eq!(on(KubeRelease::V1_37, g), Some(true), "{g}");
        }
        let list = gate::DRA_LIST_TYPE_ATTRIBUTES;
        assert_eq!(on(KubeRelease::V1_35, list), None);
        assert_eq!(on(KubeRelease::V1_36, list), Some(false));
        assert_eq!(on(KubeRelease::V1_37, list), Some(false));
        assert_eq!(on(KubeRelease::V1_38, list), Some(false));
        for g in [
            gate::DRA_PARTITIONABLE_DEVICES,
            gate::DRA_DEVICE_BINDING_CONDITIONS,
        ] {
            let gates = KubeRelease::V1_38.default_feature_gates();
            assert_eq!(gates.get(g), Some(true), "{g}");
            assert_eq!(gates.stage(g), Some(FeatureStage::Ga), "{g}");
            assert!(
                KubeRelease::V1_38
                    .resolve_gates(&[(g.to_owned(), false)])
                    .is_err(),
                "{g} is locked in 1.38"
            );
        }
        // GA in 1.38, but not locked until 1.39.
        let capacity = gate::DRA_CONSUMABLE_CAPACITY;
        assert_eq!(
            KubeRelease::V1_38.default_feature_gates().stage(capacity),
            Some(FeatureStage::Ga)
        );
        assert!(
            KubeRelease::V1_38
                .resolve_gates(&[(capacity.to_owned(), false)])
                .is_ok()
        );
        for r in KubeRelease::ALL {
            assert_eq!(on(r, gate::DRA_RESOURCE_CLAIM_DEVICE_STATUS), Some(true));
        }
        assert_eq!(KubeRelease::default(), KubeRelease::NEWEST);
        assert_eq!(KubeRelease::V1_37.minor(), 37);
        assert_eq!(KubeRelease::NEWEST.minor(), 38);
        assert_eq!(KubeRelease::from_minor(35), Some(KubeRelease::V1_35));
        assert_eq!(
            KubeRelease::V1_36
                .default_feature_gates()
                .stage(gate::DRA_DEVICE_TAINTS),
            Some(FeatureStage::Beta)
        );
    }

    #[test]
    fn overrides_are_checked_like_the_api_server_flags() {
        let gates = KubeRelease::V1_34
            .resolve_gates(&[
                (gate::DRA_PARTITIONABLE_DEVICES.to_owned(), true),
                (gate::DRA_DEVICE_TAINTS.to_owned(), true),
                (gate::DRA_DEVICE_TAINTS.to_owned(), false),
            ])
            .expect("resolves");
        assert!(gates.enabled(gate::DRA_PARTITIONABLE_DEVICES));
        assert!(!gates.enabled(gate::DRA_DEVICE_TAINTS), "the last one wins");
        let err = KubeRelease::V1_35
            .resolve_gates(&[(gate::DRA_LIST_TYPE_ATTRIBUTES.to_owned(), true)])
            .expect_err("no such gate in 1.35");
        assert!(
            err.starts_with("unrecognized feature gate: DRAListTypeAttributes"),
            "{err}"
        );
        let err = KubeRelease::V1_37
            .resolve_gates(&[(gate::DRA_EXTENDED_RESOURCE.to_owned(), false)])
            .expect_err("locked");
        assert_eq!(
            err,
            "cannot set feature gate DRAExtendedResource to false, feature is locked to true"
        );
        KubeRelease::V1_37
            .resolve_gates(&[(gate::DRA_DEVICE_TAINTS.to_owned(), false)])
            .expect("GA but not locked in 1.37");
        assert!(
            KubeRelease::V1_36
                .resolve_gates(&[("NoSuchGate".to_owned(), true)])
                .is_err()
        );
    }
}
