//! What the API server keeps of what kubedev writes: its Kubernetes version, the layout of shared
//! counters that version accepts, and the gated `resource.k8s.io` fields it drops.
//!
//! A Kubernetes API server clears the fields of a feature whose gate is off when an object is
//! created (and on update, unless the stored object already used them) and answers with what
//! it stored, without an error. kubedev therefore never trusts a write: it learns the server's
//! version, asks the server with a dry-run create which fields it keeps before it publishes,
//! and compares every object the server returns with what it sent.

use parking_lot::{Mutex, RwLock};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::Arc;

use k8s_openapi::api::resource::v1 as res;
use tokio::sync::watch;

use crate::unhealthy::InUse;

/// A gated `resource.k8s.io` feature whose fields kubedev writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum ApiFeature {
    /// Shared counters and devices that consume them (KEP-4815, gate `DRAPartitionableDevices`):
    /// `sharedCounters` of a ResourceSlice and `consumesCounters` of a device.
    PartitionableDevices,
    /// Device taints (KEP-5055, gate `DRADeviceTaints`): `taints` of a device.
    DeviceTaints,
    /// Devices allocatable to several claims at once (KEP-5075, gate `DRAConsumableCapacity`):
    /// `allowMultipleAllocations` of a device.
    ConsumableCapacity,
    /// DeviceClasses requestable as extended resources (KEP-5004, gate `DRAExtendedResource`):
    /// `extendedResourceName` of a DeviceClass.
    ExtendedResource,
}

impl ApiFeature {
    /// Every feature, in a fixed order.
    pub const ALL: [ApiFeature; 4] = [
        ApiFeature::PartitionableDevices,
        ApiFeature::DeviceTaints,
        ApiFeature::ConsumableCapacity,
        ApiFeature::ExtendedResource,
    ];

    /// The features whose fields are in ResourceSlices (what the dry-run probe asks about).
    pub const IN_SLICES: [ApiFeature; 3] = [
        ApiFeature::PartitionableDevices,
        ApiFeature::DeviceTaints,
        ApiFeature::ConsumableCapacity,
    ];

    /// The Kubernetes feature gate that enables it.
    pub fn gate(self) -> &'static str {
        match self {
            ApiFeature::PartitionableDevices => "DRAPartitionableDevices",
            ApiFeature::DeviceTaints => "DRADeviceTaints",
            ApiFeature::ConsumableCapacity => "DRAConsumableCapacity",
            ApiFeature::ExtendedResource => "DRAExtendedResource",
        }
    }

    /// The fields the API server drops when the gate is off, as the API names them.
    pub fn fields(self) -> &'static str {
        match self {
            ApiFeature::PartitionableDevices => "sharedCounters and consumesCounters",
            ApiFeature::DeviceTaints => "device taints",
            ApiFeature::ConsumableCapacity => "allowMultipleAllocations",
            ApiFeature::ExtendedResource => "extendedResourceName",
        }
    }
}

impl fmt::Display for ApiFeature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.gate())
    }
}

/// The version an API server reports at `/version`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerVersion {
    /// The major version (1).
    pub major: u32,
    /// The minor version; managed clusters may report `34+`, read as 34.
    pub minor: u32,
    /// The full version string, e.g. `v1.34.2-gke.1000`.
    pub git_version: String,
}

impl ServerVersion {
    /// Reads a `/version` answer: the emulated release when the server names one
    /// (`emulationMajor`/`emulationMinor`), else `major` and `minor` when they parse (a trailing
    /// `+` is ignored), else the numbers of `gitVersion` (`v1.35.0-…`).
    pub fn from_info(info: &k8s_openapi::apimachinery::pkg::version::Info) -> Result<Self, String> {
        let number = |s: &str| -> Option<u32> {
            let digits: String = s.chars().take_while(char::is_ascii_digit).collect();
            digits.parse().ok()
        };
        // Started with `--emulated-version` (KEP-4330), a server reports its binary's release
        // in major/minor and the release it behaves as in emulationMajor/emulationMinor: what
        // it keeps and accepts is the emulated release's.
        let emulated = info
            .emulation_major
            .as_deref()
            .and_then(number)
            .zip(info.emulation_minor.as_deref().and_then(number));
        let from_fields = emulated.or_else(|| number(&info.major).zip(number(&info.minor)));
        let from_git = || {
            let v = info.git_version.strip_prefix('v')?;
            let mut parts = v.split('.');
            Some((number(parts.next()?)?, number(parts.next()?)?))
        };
        let (major, minor) = from_fields.or_else(from_git).ok_or_else(|| {
            format!(
                "the API server reported version major {:?}, minor {:?}, gitVersion {:?}, which \
                 name no Kubernetes release",
                info.major, info.minor, info.git_version
            )
        })?;
        Ok(ServerVersion {
            major,
            minor,
            git_version: info.git_version.clone(),
        })
    }

    /// A version from its numbers (in tests and the emulator).
    pub fn new(major: u32, minor: u32) -> Self {
        ServerVersion {
            major,
            minor,
            git_version: format!("v{major}.{minor}.0"),
        }
    }

    /// Where this release wants shared counters.
    pub fn counter_layout(&self) -> CounterLayout {
        if (self.major, self.minor) <= (1, 34) {
            CounterLayout::SameSlice
        } else {
            CounterLayout::SeparateSlices
        }
    }

    /// Whether the gates of [`ApiFeature::IN_SLICES`] are off by default in this release
    /// (alpha before 1.36).
    pub fn slice_gates_off_by_default(&self) -> bool {
        (self.major, self.minor) <= (1, 35)
    }

    /// Whether kubedev supports this release (1.34 and later: the first with
    /// `resource.k8s.io/v1`).
    pub fn supported(&self) -> bool {
        (self.major, self.minor) >= (1, 34)
    }
}

impl fmt::Display for ServerVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// Where shared counter sets go relative to the devices that consume them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CounterLayout {
    /// Kubernetes 1.34: in the same ResourceSlice as the devices consuming them, with a limit on
    /// the counters of all sets of a slice.
    SameSlice,
    /// Kubernetes 1.35 and later: in slices of their own (a slice has devices or counter sets,
    /// never both); devices reference sets anywhere in the pool.
    #[default]
    SeparateSlices,
}

/// What kubedev may write to the API server it talks to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiCapabilities {
    /// The layout of shared counters.
    pub layout: CounterLayout,
    /// Features whose fields the server drops.
    pub unavailable: BTreeSet<ApiFeature>,
}

impl Default for ApiCapabilities {
    /// Everything available, the 1.35+ layout: what a publisher assumes before it has asked.
    fn default() -> Self {
        ApiCapabilities {
            layout: CounterLayout::SeparateSlices,
            unavailable: BTreeSet::new(),
        }
    }
}

impl ApiCapabilities {
    /// Whether the server keeps `feature`'s fields.
    pub fn keeps(&self, feature: ApiFeature) -> bool {
        !self.unavailable.contains(&feature)
    }
}

/// What the API server and kubedev made of one gated feature kubedev needed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Degradation {
    /// What the server did, e.g. "the API server (1.34) dropped sharedCounters and
    /// consumesCounters from a dry-run ResourceSlice".
    pub found: String,
    /// What kubedev publishes instead.
    pub action: String,
}

/// The API server as kubedev found it: version, layout and the features it had to do without.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ApiReport {
    /// The version, once learned.
    pub version: Option<ServerVersion>,
    /// The counter layout written.
    pub layout: CounterLayout,
    /// Features the server does not keep and that kubedev needed, with what was done instead.
    pub degraded: BTreeMap<ApiFeature, Degradation>,
    /// Features the server does not keep that nothing published needs today.
    pub unavailable: BTreeSet<ApiFeature>,
}

/// The shared record of what the API server keeps, written by the ResourceSlice publisher and
/// the DeviceClass applier and read by the daemon to report it. Clones share the record.
#[derive(Clone)]
pub struct ApiStatus {
    inner: Arc<ApiInner>,
}

struct ApiInner {
    report: watch::Sender<ApiReport>,
    caps: Mutex<ApiCapabilities>,
    in_use: RwLock<Option<Arc<InUse>>>,
    /// How each unavailable feature was found out.
    found: Mutex<BTreeMap<ApiFeature, String>>,
    /// Degradations of DeviceClasses (kept apart: slices recompute theirs on every pass).
    classes: Mutex<BTreeMap<ApiFeature, Degradation>>,
    /// Degradations of ResourceSlices.
    slices: Mutex<BTreeMap<ApiFeature, Degradation>>,
}

impl fmt::Debug for ApiStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ApiStatus")
            .field("report", &*self.inner.report.borrow())
            .finish_non_exhaustive()
    }
}

impl Default for ApiStatus {
    fn default() -> Self {
        Self::new()
    }
}

impl ApiStatus {
    /// A record that has learned nothing yet.
    pub fn new() -> Self {
        let (report, _) = watch::channel(ApiReport::default());
        ApiStatus {
            inner: Arc::new(ApiInner {
                report,
                caps: Mutex::new(ApiCapabilities::default()),
                in_use: RwLock::new(None),
                found: Mutex::new(BTreeMap::new()),
                classes: Mutex::new(BTreeMap::new()),
                slices: Mutex::new(BTreeMap::new()),
            }),
        }
    }

    /// Follows the report; a new value arrives whenever it changes.
    pub fn subscribe(&self) -> watch::Receiver<ApiReport> {
        self.inner.report.subscribe()
    }

    /// The report now.
    pub fn report(&self) -> ApiReport {
        self.inner.report.borrow().clone()
    }

    /// Tells the publisher which devices are prepared for claims now (`(pool, device)`), so
    /// that what it publishes in place of a feature the server lacks never withdraws a device
    /// a running pod uses.
    pub fn set_in_use(&self, in_use: impl Fn(&str, &str) -> bool + Send + Sync + 'static) {
        *self.inner.in_use.write() = Some(Arc::new(in_use));
    }

    pub(crate) fn in_use(&self) -> Arc<InUse> {
        self.inner
            .in_use
            .read()
            .clone()
            .unwrap_or_else(|| Arc::new(|_: &str, _: &str| false))
    }

    pub(crate) fn caps(&self) -> ApiCapabilities {
        self.inner.caps.lock().clone()
    }

    /// Records what a probe learned of the server's ResourceSlices (`found` says how each
    /// unavailable feature showed); true when the capabilities changed. What DeviceClasses
    /// showed is kept.
    pub(crate) fn learned(
        &self,
        version: ServerVersion,
        mut caps: ApiCapabilities,
        found: BTreeMap<ApiFeature, String>,
    ) -> bool {
        let changed = {
            let mut current = self.inner.caps.lock();
            if current.unavailable.contains(&ApiFeature::ExtendedResource) {
                caps.unavailable.insert(ApiFeature::ExtendedResource);
            }
            let changed = *current != caps;
            *current = caps.clone();
            changed
        };
        {
            let mut known = self.inner.found.lock();
            known.retain(|f, _| *f == ApiFeature::ExtendedResource);
            known.extend(found);
        }
        self.inner.report.send_if_modified(|r| {
            let before = r.clone();
            r.version = Some(version);
            r.layout = caps.layout;
            *r != before
        });
        self.refresh();
        changed
    }

    /// Marks `feature` unavailable after a write showed it dropped (`found` says where); true
    /// when that is news.
    pub(crate) fn dropped(&self, feature: ApiFeature, found: String) -> bool {
        let news = self.inner.caps.lock().unavailable.insert(feature);
        if news {
            self.inner.found.lock().insert(feature, found);
            self.refresh();
        }
        news
    }

    /// Sets what publishing slices had to do without: for each feature, what was published
    /// instead.
    pub(crate) fn set_slice_actions(&self, actions: &BTreeMap<ApiFeature, String>) {
        let degraded = self.degradations(actions);
        *self.inner.slices.lock() = degraded;
        self.refresh();
    }

    /// Sets what applying DeviceClasses had to do without: for each feature, how it was found
    /// and what it means.
    pub(crate) fn set_class_actions(&self, found: BTreeMap<ApiFeature, (String, String)>) {
        {
            let mut caps = self.inner.caps.lock();
            let mut known = self.inner.found.lock();
            for (f, (how, _)) in &found {
                caps.unavailable.insert(*f);
                known.insert(*f, how.clone());
            }
        }
        *self.inner.classes.lock() = found
            .into_iter()
            .map(|(f, (found, action))| (f, Degradation { found, action }))
            .collect();
        self.refresh();
    }

    fn degradations(
        &self,
        actions: &BTreeMap<ApiFeature, String>,
    ) -> BTreeMap<ApiFeature, Degradation> {
        let found = self.inner.found.lock();
        actions
            .iter()
            .map(|(f, action)| {
                let how = found.get(f).cloned().unwrap_or_else(|| {
                    format!("the API server drops {} ({} is off)", f.fields(), f.gate())
                });
                (
                    *f,
                    Degradation {
                        found: how,
                        action: action.clone(),
                    },
                )
            })
            .collect()
    }

    fn refresh(&self) {
        let mut degraded = self.inner.slices.lock().clone();
        degraded.extend(self.inner.classes.lock().clone());
        let unavailable: BTreeSet<ApiFeature> = self
            .inner
            .caps
            .lock()
            .unavailable
            .iter()
            .copied()
            .filter(|f| !degraded.contains_key(f))
            .collect();
        self.inner.report.send_if_modified(|r| {
            let changed = r.degraded != degraded || r.unavailable != unavailable;
            r.degraded = degraded;
            r.unavailable = unavailable;
            changed
        });
    }
}

/// Which gated fields of `sent` the server left out of `stored`.
pub(crate) fn dropped_from_slice(
    sent: &res::ResourceSliceSpec,
    stored: &res::ResourceSliceSpec,
) -> BTreeSet<ApiFeature> {
    let mut dropped = BTreeSet::new();
    let nonempty = |v: &Option<Vec<res::CounterSet>>| v.as_ref().is_some_and(|v| !v.is_empty());
    if nonempty(&sent.shared_counters) && !nonempty(&stored.shared_counters) {
        dropped.insert(ApiFeature::PartitionableDevices);
    }
    let stored_devices: BTreeMap<&str, &res::Device> = stored
        .devices
        .iter()
        .flatten()
        .map(|d| (d.name.as_str(), d))
        .collect();
    for device in sent.devices.iter().flatten() {
        let Some(kept) = stored_devices.get(device.name.as_str()) else {
            continue;
        };
        let has = |v: &Option<Vec<_>>| v.as_ref().is_some_and(|v: &Vec<_>| !v.is_empty());
        if has(&device.consumes_counters) && !has(&kept.consumes_counters) {
            dropped.insert(ApiFeature::PartitionableDevices);
        }
        let tainted = |d: &res::Device| d.taints.as_ref().is_some_and(|t| !t.is_empty());
        if tainted(device) && !tainted(kept) {
            dropped.insert(ApiFeature::DeviceTaints);
        }
        if device.allow_multiple_allocations == Some(true)
            && kept.allow_multiple_allocations != Some(true)
        {
            dropped.insert(ApiFeature::ConsumableCapacity);
        }
    }
    dropped
}

/// Which gated fields of `sent` the server left out of `stored`.
pub(crate) fn dropped_from_class(
    sent: &res::DeviceClass,
    stored: &res::DeviceClass,
) -> BTreeSet<ApiFeature> {
    let name = |c: &res::DeviceClass| {
        c.spec
            .as_ref()
            .and_then(|s| s.extended_resource_name.clone())
    };
    let mut dropped = BTreeSet::new();
    if name(sent).is_some() && name(stored).is_none() {
        dropped.insert(ApiFeature::ExtendedResource);
    }
    dropped
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use k8s_openapi::apimachinery::pkg::version::Info;

    use super::*;

    fn info(major: &str, minor: &str, git: &str) -> Info {
        Info {
            major: major.into(),
            minor: minor.into(),
            git_version: git.into(),
            ..Default::default()
        }
    }

    #[test]
    fn versions_are_read_from_fields_or_git_version() {
        let v = ServerVersion::from_info(&info("1", "34", "v1.34.1")).unwrap();
        assert_eq!((v.major, v.minor), (1, 34));
        assert_eq!(v.counter_layout(), CounterLayout::SameSlice);
        // Managed clusters report "35+".
        let v = ServerVersion::from_info(&info("1", "35+", "v1.35.2-gke.100")).unwrap();
        assert_eq!(v.minor, 35);
        assert_eq!(v.counter_layout(), CounterLayout::SeparateSlices);
        // Empty fields: from gitVersion.
        let v = ServerVersion::from_info(&info("", "", "v1.37.0-rc.1")).unwrap();
        assert_eq!((v.major, v.minor), (1, 37));
        assert!(v.supported());
        assert!(!ServerVersion::new(1, 33).supported());
        let e = ServerVersion::from_info(&info("", "", "devel")).unwrap_err();
        assert!(e.contains("devel"), "{e}");
    }

    #[test]
    fn an_emulated_release_is_the_version() {
        // kube-apiserver v1.37.2 started with --emulated-version=1.34, as its /version says.
        let emulating = Info {
            emulation_major: Some("1".into()),
            emulation_minor: Some("34".into()),
            ..info("1", "37", "v1.37.2")
        };
        let v = ServerVersion::from_info(&emulating).unwrap();
        assert_eq!((v.major, v.minor), (1, 34));
        assert_eq!(v.counter_layout(), CounterLayout::SameSlice);
        assert_eq!(v.git_version, "v1.37.2");
    }

    #[test]
    fn dropped_fields_name_their_features() {
        let sent = res::ResourceSliceSpec {
            devices: Some(vec![res::Device {
                name: "gpu-0".into(),
                consumes_counters: Some(vec![res::DeviceCounterConsumption {
                    counter_set: "s".into(),
                    counters: BTreeMap::new(),
                    ..Default::default()
                }]),
                taints: Some(vec![res::DeviceTaint {
                    key: "k".into(),
                    effect: "NoSchedule".into(),
                    ..Default::default()
                }]),
                allow_multiple_allocations: Some(true),
                ..Default::default()
            }]),
            ..Default::default()
        };
        assert!(dropped_from_slice(&sent, &sent).is_empty());
        let mut stored = sent.clone();
        let d = &mut stored.devices.as_mut().unwrap()[0];
        d.taints = None;
        d.allow_multiple_allocations = None;
        assert_eq!(
            dropped_from_slice(&sent, &stored),
            [ApiFeature::DeviceTaints, ApiFeature::ConsumableCapacity].into()
        );
        stored.devices.as_mut().unwrap()[0].consumes_counters = None;
        assert!(dropped_from_slice(&sent, &stored).contains(&ApiFeature::PartitionableDevices));
    }
}
