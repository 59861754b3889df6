//! kubedev host backend: plain character devices (`/dev/kvm`, `/dev/net/tun`,
//! `/dev/vhost-net`, `/dev/vhost-vsock`, any node) and Unix-socket devices, each offered as a
//! number of slots that share one node or socket.
//!
//! Each configured entry `<name>` becomes the devices `<name>-0` … `<name>-<N-1>` of the pool
//! `<node>-host`. N is fixed (`slots`, default [`DEFAULT_SLOTS`]) or read from the kernel
//! (`slotsFrom: {miscCapacity: tdx}` reads the root cgroup's `misc.capacity`, so a TDX socket is
//! offered exactly as many times as the host has TDX key IDs). `permanentDevices: true` adds kvm,
//! tun and vhost-net at once.
//!
//! With `consumableCapacity: true` an entry is instead one device `<name>` that several claims
//! share (DRA consumable capacity, Kubernetes 1.36 and later with `DRAConsumableCapacity`): it
//! allows multiple allocations and has the capacity `slots` (value N, request policy default 1,
//! range 1 … N in steps of 1), so the scheduler counts how many slots each claim took instead of
//! handing out numbered devices. Each allocation carries a share ID; each is prepared on its own
//! (its own CDI device) with the same edits, and unpreparing one leaves the others.
//!
//! # Attributes (domain `host.kubedev.io`)
//!
//! | attribute | type | value |
//! |---|---|---|
//! | `name` | string | the entry name, e.g. `kvm` |
//! | `kind` | string | `char` or `socket` |
//! | `path` | string | the node's or socket's host path (left out if longer than 64 bytes) |
//! | `slot` | int | the slot number, 0 … N-1 (not on a shared device) |
//!
//! # Health
//!
//! A character device's slots are healthy while its node exists; a socket device's while the
//! socket exists (always, when marked `optional`). The watcher uses inotify on the directory
//! holding each node or socket and on that directory's parent (so a re-created directory is
//! noticed), and re-checks every `resyncSeconds` as a safety net. Inotify rather than polling:
//! a change is seen at once, and an idle node costs nothing; the periodic re-check covers what
//! inotify cannot see (a directory that did not exist when the watch was set, a full event
//! queue, no inotify instances left).
//!
//! # Preparing
//!
//! - character device: the node with cgroup permissions `rw` (several slots in one container
//!   give the node once);
//! - socket device: a read-write bind mount of the socket's directory (at `containerDir`, default
//!   the same path), so a socket that its server re-creates stays reachable; the socket and its
//!   directory are given to `owner` and, where SELinux is enabled, labelled — see [`ownership`]
//!   for how symbolic links are refused. A required socket that is missing is an error; an
//!   optional one is mounted anyway (its server may create it later), but its directory must
//!   exist. A failed ownership change or relabel fails the prepare, naming the path.
//!
//! ```
//! use kubedev_host::{HostBackend, HostConfig};
//!
//! let config: HostConfig = serde_json::from_str(r#"{"permanentDevices": true, "permanentSlots": 4}"#)?;
//! let ctx = kubedev_core::BackendContext::new(kubedev_core::HostFs::new("/nonexistent-root"), "/nonexistent-state", "node-a");
//! let backend = HostBackend::new(config, &ctx)?;
//! assert_eq!(backend.pool_name().as_str(), "node-a-host");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![warn(missing_docs)]

mod config;
mod error;
pub mod factory;
mod misc;
pub mod ownership;

use parking_lot::{Mutex, MutexGuard};
use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use kubedev_core::factory::own_pool_name;
use kubedev_core::{
    AttributeValue, BackendContext, Capacity, ContainerEdits, Device, DeviceName, DeviceNode,
    DeviceRef, DeviceSource, Format, Health, HostFs, Mount, Pool, PoolName, PrepareError,
    QualifiedName, Quantity, RequestPolicy, SourceError, SourceEvent, StatelessPreparer,
    watch_by_rescan,
};
use rustix::fs::{Mode, OFlags};
use tokio::sync::mpsc;

pub use config::{
    CharDevice, DEFAULT_SELINUX_CONTEXT, DEFAULT_SLOTS, HostConfig, MAX_NAME_LEN, MAX_SLOTS, Owner,
    SlotsFrom, SocketDevice,
};
pub use error::HostError;
pub use misc::{MISC_CAPACITY, parse_misc_capacity};

use config::{Entry, Kind, Slots};

/// The backend's name in logs and configuration.
pub const BACKEND_NAME: &str = "host";

/// The attribute domain of host devices.
pub const ATTRIBUTE_DOMAIN: &str = "host.kubedev.io";

/// The cgroup permissions character devices are given.
pub const NODE_PERMISSIONS: &str = "rw";

/// What the last discovery offered and what has been reported since.
#[derive(Debug, Default)]
struct State {
    /// Slot counts of the last discovery, by entry index.
    slots: BTreeMap<usize, u32>,
    /// Health last reported per entry index.
    reported: BTreeMap<usize, Health>,
}

/// The host backend: implements [`DeviceSource`] and [`Preparer`](kubedev_core::Preparer).
#[derive(Debug, Clone)]
pub struct HostBackend {
    entries: Arc<Vec<Entry>>,
    host: HostFs,
    pool: PoolName,
    resync: Duration,
    state: Arc<Mutex<State>>,
}

impl HostBackend {
    /// A backend serving `config` from `ctx`'s host root, in the pool `<node>-host`. Fails when
    /// the configuration is invalid (the error names the field and the value). Nothing on the
    /// host is touched: the daemon calls [`pre_open`](Self::pre_open) when it serves.
    pub fn new(config: HostConfig, ctx: &BackendContext) -> Result<Self, HostError> {
        let entries = config.entries()?;
        let pool =
            own_pool_name(&ctx.node_name, BACKEND_NAME).map_err(|e| HostError::PoolName {
                pool: e.pool,
                reason: e.reason,
            })?;
        let backend = HostBackend {
            entries: Arc::new(entries),
            host: ctx.host.clone(),
            pool,
            resync: Duration::from_secs(config.resync_seconds.max(1)),
            state: Arc::default(),
        };
        Ok(backend)
    }

    /// The pool the devices are published in.
    pub fn pool_name(&self) -> &PoolName {
        &self.pool
    }

    /// Opens (and closes) every character device marked `preOpen`, so the kernel loads the
    /// module behind it; returns the failures (each names the node). The daemon calls it once
    /// when it starts serving.
    pub fn pre_open(&self) -> Vec<HostError> {
        let mut failures = Vec::new();
        for e in self.entries.iter() {
            if !matches!(e.kind, Kind::Char { pre_open: true }) {
                continue;
            }
            let opened = self
                .host
                .resolve(&e.path)
                .map_err(HostError::from)
                .and_then(|real| {
                    rustix::fs::open(
                        &real,
                        OFlags::RDWR | OFlags::NONBLOCK | OFlags::CLOEXEC | OFlags::NOCTTY,
                        Mode::empty(),
                    )
                    .map_err(|err| HostError::Io {
                        operation: "pre-opening",
                        path: e.path.clone(),
                        error: err.into(),
                    })
                });
            match opened {
                Ok(fd) => {
                    drop(fd);
                    tracing::debug!(path = %e.path.display(), "pre-opened");
                }
                Err(err) => failures.push(err),
            }
        }
        failures
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock()
    }

    fn health_of(&self, e: &Entry) -> Health {
        let path = e.path.display();
        match &e.kind {
            Kind::Char { .. } => match self.host.presence(&e.path) {
                Ok(true) => Health::healthy(),
                Ok(false) => Health::unhealthy(format!("device node {path} is missing")),
                Err(err) => Health::unknown(format!(
                    "cannot tell whether device node {path} exists: {err}"
                )),
            },
            Kind::Socket(s) => {
                if s.optional {
                    return Health::healthy();
                }
                let meta = match self.host.presence(&e.path) {
                    Ok(false) => None,
                    Ok(true) => match self
                        .host
                        .resolve(&e.path)
                        .map_err(|err| kubedev_core::echo::chain(&err))
                        .and_then(|real| {
                            std::fs::symlink_metadata(real)
                                .map_err(|err| kubedev_core::echo::chain(&err))
                        }) {
                        Ok(m) => Some(m),
                        Err(err) => {
                            return Health::unknown(format!(
                                "cannot tell whether socket {path} exists: {err}"
                            ));
                        }
                    },
                    Err(err) => {
                        return Health::unknown(format!(
                            "cannot tell whether socket {path} exists: {err}"
                        ));
                    }
                };
                match meta {
                    Some(m) if m.file_type().is_socket() => Health::healthy(),
                    Some(_) => Health::unhealthy(format!("{path} is not a socket")),
                    None => Health::unhealthy(format!("socket {path} is missing")),
                }
            }
        }
    }

    /// Slot counts for every entry; `misc.capacity` is read once, and only if an entry needs it.
    /// An entry whose count cannot be read is logged and offered with no slots.
    fn slot_counts(&self) -> BTreeMap<usize, u32> {
        let mut misc: Option<Result<BTreeMap<String, u64>, HostError>> = None;
        let mut out = BTreeMap::new();
        for (i, e) in self.entries.iter().enumerate() {
            let n = match &e.slots {
                Slots::Fixed(n) => *n,
                Slots::From(SlotsFrom::MiscCapacity(key)) => {
                    let table = misc.get_or_insert_with(|| self.read_misc_capacity());
                    match table {
                        Ok(t) => {
                            let count = t.get(key).copied().unwrap_or_else(|| {
                                tracing::info!(
                                    device = e.name,
                                    key,
                                    "{MISC_CAPACITY} does not list the resource; no slots"
                                );
                                0
                            });
                            if count > u64::from(MAX_SLOTS) {
                                tracing::warn!(
                                    device = e.name,
                                    count,
                                    "offering only {MAX_SLOTS} slots"
                                );
                            }
                            u32::try_from(count.min(u64::from(MAX_SLOTS))).unwrap_or(MAX_SLOTS)
                        }
                        Err(error) => {
                            tracing::warn!(device = e.name, %error, "no slots");
                            0
                        }
                    }
                }
            };
            out.insert(i, n);
        }
        out
    }

    fn read_misc_capacity(&self) -> Result<BTreeMap<String, u64>, HostError> {
        let text = self.host.read_to_string(MISC_CAPACITY)?;
        parse_misc_capacity(Path::new(MISC_CAPACITY), &text)
    }

    fn attr(id: &str) -> QualifiedName {
        QualifiedName::new(format!("{ATTRIBUTE_DOMAIN}/{id}"))
            .unwrap_or_else(|e| unreachable!("attribute names are constants: {e}"))
    }

    fn refresh(&self) -> Result<Pool, SourceError> {
        let counts = self.slot_counts();
        let mut devices = Vec::new();
        let mut reported = BTreeMap::new();
        for (i, e) in self.entries.iter().enumerate() {
            let health = self.health_of(e);
            let kind = match e.kind {
                Kind::Char { .. } => "char",
                Kind::Socket(_) => "socket",
            };
            let slots = counts.get(&i).copied().unwrap_or(0);
            let names: Vec<(String, Option<u32>)> = match e.shared {
                true if slots > 0 => vec![(e.name.clone(), None)],
                true => Vec::new(),
                false => (0..slots)
                    .map(|slot| (format!("{}-{slot}", e.name), Some(slot)))
                    .collect(),
            };
            for (name, slot) in names {
                let name = DeviceName::new(name).map_err(|err| SourceError::Config {
                    backend: BACKEND_NAME.into(),
                    message: kubedev_core::echo::chain(&err),
                })?;
                let mut d = Device::new(name)
                    .with_attribute(Self::attr("name"), AttributeValue::String(e.name.clone()))
                    .with_attribute(Self::attr("kind"), AttributeValue::String(kind.into()));
                match slot {
                    Some(slot) => {
                        d = d.with_attribute(
                            Self::attr("slot"),
                            AttributeValue::Int(i64::from(slot)),
                        );
                    }
                    None => {
                        // Each claim takes one slot unless its request asks for more.
                        let one = Quantity::from_i64(1, Format::DecimalSI);
                        let all = Quantity::from_i64(i64::from(slots), Format::DecimalSI);
                        let mut cap = Capacity::new(all);
                        cap.request_policy =
                            Some(RequestPolicy::range(one, one, Some(all), Some(one)));
                        d.capacity.insert(Self::capacity_name(), cap);
                        d.allow_multiple_allocations = true;
                    }
                }
                if let Ok(p) = AttributeValue::string(e.path.display().to_string()) {
                    d = d.with_attribute(Self::attr("path"), p);
                }
                d.health = health.clone();
                devices.push(d);
            }
            reported.insert(i, health);
        }
        let pool = Pool::new(self.pool.clone(), devices);
        pool.validate().map_err(|error| SourceError::Model {
            backend: BACKEND_NAME.into(),
            error,
        })?;
        let mut st = self.state();
        st.slots = counts;
        st.reported = reported;
        Ok(pool)
    }

    fn check(&self) -> Vec<SourceEvent> {
        let health: Vec<(usize, Health)> = self
            .entries
            .iter()
            .enumerate()
            .map(|(i, e)| (i, self.health_of(e)))
            .collect();
        let mut st = self.state();
        let mut out = Vec::new();
        for (i, h) in health {
            if st.reported.get(&i) == Some(&h) {
                continue;
            }
            st.reported.insert(i, h.clone());
            let slots = st.slots.get(&i).copied().unwrap_or(0);
            for slot in 0..slots {
                if let Ok(device) = DeviceName::new(format!("{}-{slot}", self.entries[i].name)) {
                    out.push(SourceEvent::Health {
                        device: DeviceRef::new(self.pool.clone(), device),
                        health: h.clone(),
                    });
                }
            }
        }
        out
    }

    /// The directories to watch: each entry's directory and that directory's parent.
    fn watch_dirs(&self) -> BTreeSet<PathBuf> {
        let mut dirs = BTreeSet::new();
        for e in self.entries.iter() {
            let dir = e.dir();
            dirs.insert(dir.to_path_buf());
            if let Some(p) = dir.parent() {
                dirs.insert(p.to_path_buf());
            }
        }
        dirs
    }

    /// The name of a shared device's capacity: `slots` in the driver's domain.
    fn capacity_name() -> QualifiedName {
        QualifiedName::new("slots")
            .unwrap_or_else(|e| unreachable!("capacity names are constants: {e}"))
    }

    /// The entry and slot a device name stands for, if the last discovery offered it (a shared
    /// device is slot 0 of its entry).
    fn lookup(&self, device: &DeviceRef) -> Option<(usize, u32)> {
        if device.pool != self.pool {
            return None;
        }
        if let Some(i) = self
            .entries
            .iter()
            .position(|e| e.shared && e.name == device.device.as_str())
        {
            let slots = self.state().slots.get(&i).copied()?;
            return (slots > 0).then_some((i, 0));
        }
        let (name, digits) = device.device.as_str().rsplit_once('-')?;
        let slot: u32 = digits.parse().ok()?;
        if slot.to_string() != digits {
            return None; // "kvm-01" is not slot 1
        }
        let i = self.entries.iter().position(|e| e.name == name)?;
        let slots = self.state().slots.get(&i).copied()?;
        (slot < slots).then_some((i, slot))
    }

    /// The edits for entry `i`; with `apply`, a socket's ownership and label are set first
    /// (prepare), without it the host is left as it is (planned edits).
    fn edits_for(
        &self,
        device: &DeviceRef,
        i: usize,
        apply: bool,
    ) -> Result<ContainerEdits, PrepareError> {
        let e = &self.entries[i];
        let health = self.health_of(e);
        let mut edits = ContainerEdits::default();
        match &e.kind {
            Kind::Char { .. } => {
                if !health.is_healthy() {
                    return Err(PrepareError::Unhealthy {
                        device: device.to_string(),
                        reason: health.reason.unwrap_or_default(),
                    });
                }
                edits.device_nodes.push(DeviceNode::new(
                    e.path.display().to_string(),
                    NODE_PERMISSIONS,
                ));
            }
            Kind::Socket(s) if !apply => {
                if !s.optional && !self.host.exists(&e.path) {
                    return Err(PrepareError::Unhealthy {
                        device: device.to_string(),
                        reason: format!("socket {} is missing", e.path.display()),
                    });
                }
                edits.mounts.push(socket_mount(e, s));
            }
            Kind::Socket(s) => {
                let selinux = ownership::selinux_enabled(&self.host).then(|| {
                    s.selinux_context
                        .as_deref()
                        .unwrap_or(DEFAULT_SELINUX_CONTEXT)
                });
                let present = ownership::set_socket_access(&self.host, &e.path, s.owner, selinux)
                    .map_err(|err| match err {
                    HostError::Io {
                        operation,
                        path,
                        error,
                    } => PrepareError::Host {
                        operation: format!("{operation} {}", path.display()),
                        device: device.to_string(),
                        error,
                    },
                    other => PrepareError::Other(format!("device {device}: {other}")),
                })?;
                if !present && !s.optional {
                    return Err(PrepareError::Unhealthy {
                        device: device.to_string(),
                        reason: format!("socket {} is missing", e.path.display()),
                    });
                }
                edits.mounts.push(socket_mount(e, s));
            }
        }
        Ok(edits)
    }

    /// Entry index of `device`, discovering again once when the last discovery did not offer it.
    fn find(&self, device: &DeviceRef) -> Result<usize, PrepareError> {
        let mut found = self.lookup(device);
        if found.is_none() && device.pool == self.pool {
            // Not offered by the last discovery (or none ran yet): look again once.
            self.refresh().map_err(|e| {
                PrepareError::Other(format!(
                    "rediscovering host devices: {}",
                    kubedev_core::echo::chain(&e)
                ))
            })?;
            found = self.lookup(device);
        }
        found
            .map(|(i, _slot)| i)
            .ok_or_else(|| PrepareError::UnknownDevice {
                device: device.to_string(),
            })
    }
}

/// The bind mount of a socket's directory into the container.
fn socket_mount(e: &Entry, s: &config::SocketDevice) -> Mount {
    let host_dir = e.dir().display().to_string();
    let container_dir = s
        .container_dir
        .as_ref()
        .map(|d| d.display().to_string())
        .unwrap_or_else(|| host_dir.clone());
    Mount::bind(host_dir, container_dir, false)
}

#[async_trait]
impl DeviceSource for HostBackend {
    fn name(&self) -> &str {
        BACKEND_NAME
    }

    async fn discover(&self) -> Result<Vec<Pool>, SourceError> {
        Ok(vec![self.refresh()?])
    }

    async fn watch(&self, events: mpsc::Sender<SourceEvent>) -> Result<(), SourceError> {
        if self.entries.is_empty() {
            return Ok(());
        }
        let dirs = self.watch_dirs();
        let real_dirs = || {
            dirs.iter()
                .filter_map(|d| self.host.resolve(d).ok())
                .collect()
        };
        watch_by_rescan(events, self.resync, real_dirs, || async { self.check() }).await
    }
}

/// `unprepare` has nothing to undo: a socket's ownership and label stay, since other
/// containers may share the socket.
impl StatelessPreparer for HostBackend {
    fn device_edits(&self, device: &DeviceRef) -> Result<ContainerEdits, PrepareError> {
        let i = self.find(device)?;
        self.edits_for(device, i, true)
    }

    /// The same edits, without setting a socket's ownership or label.
    fn planned_device_edits(&self, device: &DeviceRef) -> Result<ContainerEdits, PrepareError> {
        let i = self.find(device)?;
        self.edits_for(device, i, false)
    }
}
