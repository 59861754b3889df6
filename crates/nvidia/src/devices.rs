//! The device model: what NVML reported, turned into kubedev devices, counters and names.
//!
//! Pure: no NVML, no host access. The partition model (KEP-4815) lives here too.

use std::collections::{BTreeMap, BTreeSet};

use kubedev_core::{
    AttributeValue, CounterConsumption, CounterName, CounterSet, Device, DeviceName, Format,
    Health, Pool, PoolName, QualifiedName, Quantity,
};

use crate::config::{MigStrategy, NvidiaConfig};
use crate::snapshot::{GpuInfo, MachineInfo, MigInstance, MigProfile, Placement};
use crate::topology::Topology;

/// The attribute domain of everything this backend publishes.
pub const DOMAIN: &str = "gpu.nvidia.com";

/// Attribute ids (in [`DOMAIN`]) the backend publishes.
pub mod attr {
    /// `gpu` for a whole GPU, `mig` for a MIG device or a MIG placement.
    pub const TYPE: &str = "type";
    /// `GPU-...` for GPUs, `MIG-...` for existing MIG devices.
    pub const UUID: &str = "uuid";
    /// NVML index of the GPU.
    pub const INDEX: &str = "index";
    /// Minor number of `/dev/nvidia<minor>`.
    pub const MINOR: &str = "minor";
    /// Product name, e.g. `NVIDIA A100-SXM4-40GB`.
    pub const PRODUCT_NAME: &str = "productName";
    /// Brand, e.g. `Nvidia`.
    pub const BRAND: &str = "brand";
    /// Architecture, e.g. `Ampere`.
    pub const ARCHITECTURE: &str = "architecture";
    /// CUDA compute capability as a version, e.g. `8.0.0`.
    pub const CUDA_COMPUTE_CAPABILITY: &str = "cudaComputeCapability";
    /// Kernel driver version, e.g. `550.54.15`.
    pub const DRIVER_VERSION: &str = "driverVersion";
    /// CUDA driver API version, e.g. `12.4.0`.
    pub const CUDA_DRIVER_VERSION: &str = "cudaDriverVersion";
    /// PCI address of the (parent) GPU, e.g. `0000:07:00.0`.
    pub const PCIE_BUS_ID: &str = "pcieBusID";
    /// Whether the GPU supports MIG.
    pub const MIG_CAPABLE: &str = "migCapable";
    /// Whether MIG mode is on.
    pub const MIG_ENABLED: &str = "migEnabled";
    /// Connected component of GPUs joined by NVLink: the smallest NVML index in it.
    pub const NVLINK_GROUP: &str = "nvlinkGroup";
    /// Number of GPUs with an NVLink to this GPU.
    pub const NVLINK_PEERS: &str = "nvlinkPeers";
    /// Connected component of GPUs behind shared PCIe switches: the smallest NVML index in it.
    pub const PCIE_SWITCH_GROUP: &str = "pcieSwitchGroup";
    /// UUID of the GPU a MIG device lives on.
    pub const PARENT_UUID: &str = "parentUUID";
    /// NVML index of the GPU a MIG device lives on.
    pub const PARENT_INDEX: &str = "parentIndex";
    /// MIG profile, e.g. `1g.10gb`.
    pub const PROFILE: &str = "profile";
    /// First memory slice of a MIG placement.
    pub const PLACEMENT_START: &str = "placementStart";
    /// Memory slices of a MIG placement.
    pub const PLACEMENT_SIZE: &str = "placementSize";
    /// GPU instance id of an existing MIG device.
    pub const GPU_INSTANCE_ID: &str = "gpuInstanceId";
    /// Compute instance id of an existing MIG device.
    pub const COMPUTE_INSTANCE_ID: &str = "computeInstanceId";
    /// Time-slicing replica number (present only when `replicas` > 1).
    pub const REPLICA: &str = "replica";
}

/// The standard, driver-independent PCI address attribute.
pub const STANDARD_PCI_BUS_ID: &str = "resource.kubernetes.io/pciBusID";
/// The standard PCIe root complex attribute (e.g. `pci0000:00`).
pub const STANDARD_PCIE_ROOT: &str = "resource.kubernetes.io/pcieRoot";

/// Device type values of the `type` attribute.
pub const TYPE_GPU: &str = "gpu";
/// A MIG device or placement.
pub const TYPE_MIG: &str = "mig";

/// What one published device stands for, so prepare knows what to do with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum DeviceKind {
    /// A whole GPU (`gpu` is the position in [`MachineInfo::gpus`]).
    Gpu { gpu: usize },
    /// An existing MIG device.
    Mig { gpu: usize, instance: MigInstance },
    /// A MIG placement that prepare creates (partitionable strategy).
    Placement {
        gpu: usize,
        profile: MigProfile,
        placement: Placement,
    },
}

impl DeviceKind {
    pub(crate) fn gpu(&self) -> usize {
        match self {
            DeviceKind::Gpu { gpu }
            | DeviceKind::Mig { gpu, .. }
            | DeviceKind::Placement { gpu, .. } => *gpu,
        }
    }
}

/// The result of one discovery: the pool and what each device is.
#[derive(Debug, Clone)]
pub(crate) struct Built {
    pub(crate) pool: Pool,
    pub(crate) kinds: BTreeMap<DeviceName, DeviceKind>,
}

/// Problems building the model; each names the offending value.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BuildError {
    #[error("GPU {gpu}: {what} {value:?} cannot be published: {reason}")]
    Value {
        gpu: u32,
        what: &'static str,
        value: String,
        reason: String,
    },
}

fn q(name: &str) -> QualifiedName {
    // Every name passed here is a constant of this module, checked by a test.
    QualifiedName::new(format!("{DOMAIN}/{name}"))
        .unwrap_or_else(|e| unreachable_name(name, &e.to_string()))
}

#[cold]
fn unreachable_name(name: &str, why: &str) -> QualifiedName {
    // Constants are checked by `attribute_names_are_valid`; should one ever be wrong, publish it
    // under a placeholder rather than panic in the daemon.
    tracing::error!(name, why, "invalid attribute name constant");
    QualifiedName::new("invalid").unwrap_or_else(|_| unreachable!("\"invalid\" is a valid name"))
}

fn counter(name: &str) -> CounterName {
    CounterName::new(name).unwrap_or_else(|e| {
        tracing::error!(name, error = %e, "invalid counter name");
        CounterName::new("invalid").unwrap_or_else(|_| unreachable!("\"invalid\" is a valid name"))
    })
}

/// A version attribute from a dotted numeric string such as `535.104.05`: leading zeros dropped,
/// missing parts filled with 0 (`560.28` → `560.28.0`).
pub(crate) fn loose_version(s: &str) -> Option<AttributeValue> {
    let mut parts: Vec<u64> = Vec::new();
    for p in s.trim().split('.') {
        parts.push(p.parse().ok()?);
    }
    if parts.is_empty() || parts.len() > 3 {
        return None;
    }
    parts.resize(3, 0);
    AttributeValue::version(&format!("{}.{}.{}", parts[0], parts[1], parts[2])).ok()
}

/// A DNS-label form of a MIG profile name: `1g.5gb` → `1g5gb`, `1g.5gb+me` → `1g5gb-me`.
pub(crate) fn profile_label(name: &str) -> String {
    let mut out = String::new();
    for c in name.chars() {
        match c {
            'a'..='z' | '0'..='9' => out.push(c),
            'A'..='Z' => out.push(c.to_ascii_lowercase()),
            '+' | '-' | '_' | ' ' if !out.ends_with('-') && !out.is_empty() => out.push('-'),
            _ => {}
        }
    }
    out.trim_end_matches('-').to_string()
}

/// The name of a whole GPU.
pub(crate) fn gpu_device_name(gpu: &GpuInfo) -> String {
    format!("gpu-{}", gpu.index)
}

/// The name of a MIG placement or of an existing MIG device at that placement:
/// `gpu-<index>-mig-<profile>-<start>`; a compute instance smaller than its GPU instance adds
/// `-c<slices>-<ci id>`.
pub(crate) fn mig_device_name(
    gpu: &GpuInfo,
    profile: &str,
    placement: Placement,
    partial_ci: Option<(u32, u32)>,
) -> String {
    let base = format!(
        "gpu-{}-mig-{}-{}",
        gpu.index,
        profile_label(profile),
        placement.start
    );
    match partial_ci {
        Some((slices, ci)) => format!("{base}-c{slices}-{ci}"),
        None => base,
    }
}

/// The counter set name of a GPU.
pub(crate) fn counter_set_name(gpu: &GpuInfo) -> String {
    format!("gpu-{}-counters", gpu.index)
}

/// Counter names of a GPU's counter set.
pub mod counters {
    /// Prefix of the per-memory-slice counters (`memory-slice-0` …): each is 1, so two
    /// placements sharing a slice can never both be allocated.
    pub const MEMORY_SLICE_PREFIX: &str = "memory-slice-";
    /// Streaming multiprocessors.
    pub const MULTIPROCESSORS: &str = "multiprocessors";
    /// Copy engines.
    pub const COPY_ENGINES: &str = "copy-engines";
    /// Video decoders.
    pub const DECODERS: &str = "decoders";
    /// Video encoders.
    pub const ENCODERS: &str = "encoders";
    /// JPEG engines.
    pub const JPEG_ENGINES: &str = "jpeg-engines";
    /// Optical flow accelerators.
    pub const OFA_ENGINES: &str = "ofa-engines";
    /// Memory in bytes.
    pub const MEMORY: &str = "memory";
}

/// A GPU's MIG resources in total: what its counter set offers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PartitionTotals {
    pub(crate) memory_slices: u32,
    pub(crate) multiprocessors: u32,
    pub(crate) copy_engines: u32,
    pub(crate) decoders: u32,
    pub(crate) encoders: u32,
    pub(crate) jpeg_engines: u32,
    pub(crate) ofa_engines: u32,
    pub(crate) memory_mib: u64,
}

impl PartitionTotals {
    /// The totals of a GPU: the memory slices all placements span, and for every engine and for
    /// memory the largest profile's figure (the full-GPU profile, e.g. `7g.40gb`, has them all).
    pub(crate) fn of(profiles: &[MigProfile]) -> Option<PartitionTotals> {
        let slices = profiles
            .iter()
            .flat_map(|p| p.placements.iter())
            .map(|pl| pl.start.saturating_add(pl.size))
            .max()?;
        let max = |f: fn(&MigProfile) -> u32| profiles.iter().map(f).max().unwrap_or(0);
        Some(PartitionTotals {
            memory_slices: slices,
            multiprocessors: max(|p| p.multiprocessors),
            copy_engines: max(|p| p.copy_engines),
            decoders: max(|p| p.decoders),
            encoders: max(|p| p.encoders),
            jpeg_engines: max(|p| p.jpeg_engines),
            ofa_engines: max(|p| p.ofa_engines),
            memory_mib: profiles.iter().map(|p| p.memory_mib).max().unwrap_or(0),
        })
    }

    fn counters(&self) -> BTreeMap<CounterName, Quantity> {
        self.consumption(
            Placement {
                start: 0,
                size: self.memory_slices,
            },
            &[
                self.multiprocessors,
                self.copy_engines,
                self.decoders,
                self.encoders,
                self.jpeg_engines,
                self.ofa_engines,
            ],
            self.memory_mib,
        )
    }

    fn consumption(
        &self,
        placement: Placement,
        engines: &[u32; 6],
        memory_mib: u64,
    ) -> BTreeMap<CounterName, Quantity> {
        let mut m = BTreeMap::new();
        for s in placement.slices() {
            m.insert(
                counter(&format!("{}{s}", counters::MEMORY_SLICE_PREFIX)),
                Quantity::from_i64(1, Format::DecimalSI),
            );
        }
        for (name, v) in [
            counters::MULTIPROCESSORS,
            counters::COPY_ENGINES,
            counters::DECODERS,
            counters::ENCODERS,
            counters::JPEG_ENGINES,
            counters::OFA_ENGINES,
        ]
        .into_iter()
        .zip(engines)
        {
            m.insert(
                counter(name),
                Quantity::from_i64(i64::from(*v), Format::DecimalSI),
            );
        }
        m.insert(
            counter(counters::MEMORY),
            Quantity::from_i64(mib_to_bytes(memory_mib), Format::BinarySI),
        );
        m
    }

    fn profile_consumption(
        &self,
        profile: &MigProfile,
        placement: Placement,
    ) -> BTreeMap<CounterName, Quantity> {
        self.consumption(
            placement,
            &[
                profile.multiprocessors,
                profile.copy_engines,
                profile.decoders,
                profile.encoders,
                profile.jpeg_engines,
                profile.ofa_engines,
            ],
            profile.memory_mib,
        )
    }
}

fn mib_to_bytes(mib: u64) -> i64 {
    i64::try_from(mib.saturating_mul(1 << 20)).unwrap_or(i64::MAX)
}

fn bytes(b: u64) -> Quantity {
    Quantity::from_i64(i64::try_from(b).unwrap_or(i64::MAX), Format::BinarySI)
}

fn string_attr(
    gpu: &GpuInfo,
    what: &'static str,
    value: &str,
) -> Result<AttributeValue, BuildError> {
    AttributeValue::string(value).map_err(|e| BuildError::Value {
        gpu: gpu.index,
        what,
        value: value.to_owned(),
        reason: e.to_string(),
    })
}

/// Attributes every device of a GPU shares (the GPU's identity and the machine's versions).
fn common_attributes(
    machine: &MachineInfo,
    topology: &Topology,
    pos: usize,
    gpu: &GpuInfo,
) -> Result<BTreeMap<QualifiedName, AttributeValue>, BuildError> {
    let mut a = BTreeMap::new();
    a.insert(
        q(attr::PRODUCT_NAME),
        string_attr(gpu, "product name", &gpu.product_name)?,
    );
    a.insert(q(attr::BRAND), string_attr(gpu, "brand", &gpu.brand)?);
    a.insert(
        q(attr::ARCHITECTURE),
        string_attr(gpu, "architecture", &gpu.architecture)?,
    );
    if let Some((major, minor)) = gpu.compute_capability
        && let Some(v) = loose_version(&format!("{major}.{minor}"))
    {
        a.insert(q(attr::CUDA_COMPUTE_CAPABILITY), v);
    }
    if let Some(d) = &machine.driver_version {
        match loose_version(d) {
            Some(v) => {
                a.insert(q(attr::DRIVER_VERSION), v);
            }
            None => {
                tracing::warn!(driver_version = %d, "driver version is not numeric; not published")
            }
        }
    }
    if let Some((major, minor)) = machine.cuda_driver_version
        && let Some(v) = loose_version(&format!("{major}.{minor}"))
    {
        a.insert(q(attr::CUDA_DRIVER_VERSION), v);
    }
    let bus = string_attr(gpu, "PCI bus id", &gpu.pci_bus_id)?;
    a.insert(q(attr::PCIE_BUS_ID), bus.clone());
    if let Ok(name) = QualifiedName::new(STANDARD_PCI_BUS_ID) {
        a.insert(name, bus);
    }
    if let Some(root) = &gpu.pcie_root
        && let Ok(name) = QualifiedName::new(STANDARD_PCIE_ROOT)
    {
        a.insert(name, string_attr(gpu, "PCIe root", root)?);
    }
    if let Some(&g) = topology.nvlink_group.get(pos) {
        a.insert(q(attr::NVLINK_GROUP), AttributeValue::Int(i64::from(g)));
        let peers = i64::try_from(topology.nvlink_peer_count(pos)).unwrap_or(i64::MAX);
        a.insert(q(attr::NVLINK_PEERS), AttributeValue::Int(peers));
    }
    if let Some(&g) = topology.pcie_switch_group.get(pos) {
        a.insert(
            q(attr::PCIE_SWITCH_GROUP),
            AttributeValue::Int(i64::from(g)),
        );
    }
    Ok(a)
}

fn device(name: &str) -> Result<Device, BuildError> {
    DeviceName::new(name)
        .map(Device::new)
        .map_err(|e| BuildError::Value {
            gpu: 0,
            what: "device name",
            value: name.to_owned(),
            reason: e.to_string(),
        })
}

fn whole_gpu(
    common: &BTreeMap<QualifiedName, AttributeValue>,
    gpu: &GpuInfo,
) -> Result<Device, BuildError> {
    let mut d = device(&gpu_device_name(gpu))?;
    d.attributes = common.clone();
    d.attributes
        .insert(q(attr::TYPE), AttributeValue::String(TYPE_GPU.to_string()));
    d.attributes
        .insert(q(attr::UUID), string_attr(gpu, "UUID", &gpu.uuid)?);
    d.attributes
        .insert(q(attr::INDEX), AttributeValue::Int(i64::from(gpu.index)));
    d.attributes
        .insert(q(attr::MINOR), AttributeValue::Int(i64::from(gpu.minor)));
    d.attributes
        .insert(q(attr::MIG_CAPABLE), AttributeValue::Bool(gpu.mig_capable));
    d.attributes
        .insert(q(attr::MIG_ENABLED), AttributeValue::Bool(gpu.mig_enabled));
    d = d.with_capacity(q("memory"), bytes(gpu.memory_bytes));
    d.numa_node = gpu.numa_node;
    Ok(d)
}

fn mig_base(
    common: &BTreeMap<QualifiedName, AttributeValue>,
    gpu: &GpuInfo,
    name: &str,
    profile: &MigProfile,
    placement: Placement,
) -> Result<Device, BuildError> {
    let mut d = device(name)?;
    d.attributes = common.clone();
    d.attributes
        .insert(q(attr::TYPE), AttributeValue::String(TYPE_MIG.to_string()));
    d.attributes
        .insert(q(attr::PARENT_UUID), string_attr(gpu, "UUID", &gpu.uuid)?);
    d.attributes.insert(
        q(attr::PARENT_INDEX),
        AttributeValue::Int(i64::from(gpu.index)),
    );
    d.attributes.insert(
        q(attr::PROFILE),
        string_attr(gpu, "MIG profile", &profile.name)?,
    );
    d.attributes.insert(
        q(attr::PLACEMENT_START),
        AttributeValue::Int(i64::from(placement.start)),
    );
    d.attributes.insert(
        q(attr::PLACEMENT_SIZE),
        AttributeValue::Int(i64::from(placement.size)),
    );
    for (cap, v) in [
        ("multiprocessors", profile.multiprocessors),
        ("copyEngines", profile.copy_engines),
        ("decoders", profile.decoders),
        ("encoders", profile.encoders),
        ("jpegEngines", profile.jpeg_engines),
        ("ofaEngines", profile.ofa_engines),
    ] {
        d = d.with_capacity(q(cap), Quantity::from_i64(i64::from(v), Format::DecimalSI));
    }
    d = d.with_capacity(
        q("memory"),
        Quantity::from_i64(mib_to_bytes(profile.memory_mib), Format::BinarySI),
    );
    d.numa_node = gpu.numa_node;
    Ok(d)
}

/// Builds the pool of one discovery.
///
/// `health` gives the health of a device by GPU UUID and, for MIG devices, GPU instance id;
/// `owned` lists the placements kubedev created for claims ((GPU UUID, placement) → GPU
/// instance id once created), which stay published as the placement devices they were prepared
/// for.
pub(crate) fn build_pool(
    pool: PoolName,
    config: &NvidiaConfig,
    machine: &MachineInfo,
    topology: &Topology,
    health: &dyn Fn(&str, Option<u32>) -> Health,
    owned: &Owned,
) -> (Built, Vec<BuildError>) {
    let mut devices = Vec::new();
    let mut kinds = BTreeMap::new();
    let mut sets = Vec::new();
    let mut errors = Vec::new();
    for (pos, gpu) in machine.gpus.iter().enumerate() {
        match gpu_devices(config, machine, topology, pos, gpu, owned) {
            Ok((devs, set)) => {
                for (mut d, kind) in devs {
                    d.health = health(&gpu.uuid, instance_of(&gpu.uuid, &kind, owned));
                    kinds.insert(d.name.clone(), kind);
                    devices.push(d);
                }
                sets.extend(set);
            }
            Err(e) => errors.push(e),
        }
    }
    let (devices, kinds) = replicate(devices, kinds, config.replicas);
    let mut pool = Pool::new(pool, devices);
    pool.shared_counters = sets;
    (Built { pool, kinds }, errors)
}

/// Placements kubedev created for claims: (GPU UUID, placement) → GPU instance id (once known).
pub(crate) type Owned = BTreeMap<(String, Placement), Option<u32>>;

/// The GPU instance a device runs on, if it is a MIG device whose instance exists.
pub(crate) fn instance_of(gpu_uuid: &str, kind: &DeviceKind, owned: &Owned) -> Option<u32> {
    match kind {
        DeviceKind::Gpu { .. } => None,
        DeviceKind::Mig { instance, .. } => Some(instance.gi_id),
        DeviceKind::Placement { placement, .. } => owned
            .get(&(gpu_uuid.to_owned(), *placement))
            .copied()
            .flatten(),
    }
}

type GpuDevices = (Vec<(Device, DeviceKind)>, Option<CounterSet>);

fn gpu_devices(
    config: &NvidiaConfig,
    machine: &MachineInfo,
    topology: &Topology,
    pos: usize,
    gpu: &GpuInfo,
    owned: &Owned,
) -> Result<GpuDevices, BuildError> {
    let common = common_attributes(machine, topology, pos, gpu)?;
    let mut out = Vec::new();
    let strategy = if gpu.mig_enabled {
        config.mig_strategy
    } else {
        MigStrategy::None
    };
    match strategy {
        MigStrategy::None => {
            out.push((whole_gpu(&common, gpu)?, DeviceKind::Gpu { gpu: pos }));
            Ok((out, None))
        }
        MigStrategy::Static => {
            for inst in &gpu.instances {
                out.push(static_mig(&common, gpu, pos, inst, true)?);
            }
            Ok((out, None))
        }
        MigStrategy::Partitionable => partitionable(&common, gpu, pos, owned),
    }
}

fn static_mig(
    common: &BTreeMap<QualifiedName, AttributeValue>,
    gpu: &GpuInfo,
    pos: usize,
    inst: &MigInstance,
    with_uuid: bool,
) -> Result<(Device, DeviceKind), BuildError> {
    let profile = gpu
        .profiles
        .iter()
        .find(|p| p.id == inst.profile_id)
        .cloned()
        .ok_or_else(|| BuildError::Value {
            gpu: gpu.index,
            what: "GPU instance profile id",
            value: inst.profile_id.to_string(),
            reason: format!(
                "GPU instance {} has a profile the GPU does not list",
                inst.gi_id
            ),
        })?;
    let partial =
        (inst.ci_slice_count != profile.slice_count).then_some((inst.ci_slice_count, inst.ci_id));
    let name = mig_device_name(gpu, &profile.name, inst.placement, partial);
    let mut d = mig_base(common, gpu, &name, &profile, inst.placement)?;
    if with_uuid && let Some(uuid) = &inst.uuid {
        d.attributes
            .insert(q(attr::UUID), string_attr(gpu, "MIG UUID", uuid)?);
    }
    d.attributes.insert(
        q(attr::GPU_INSTANCE_ID),
        AttributeValue::Int(i64::from(inst.gi_id)),
    );
    d.attributes.insert(
        q(attr::COMPUTE_INSTANCE_ID),
        AttributeValue::Int(i64::from(inst.ci_id)),
    );
    Ok((
        d,
        DeviceKind::Mig {
            gpu: pos,
            instance: inst.clone(),
        },
    ))
}

fn partitionable(
    common: &BTreeMap<QualifiedName, AttributeValue>,
    gpu: &GpuInfo,
    pos: usize,
    owned: &Owned,
) -> Result<GpuDevices, BuildError> {
    let mut out = Vec::new();
    let Some(totals) = PartitionTotals::of(&gpu.profiles) else {
        // MIG on, but no profile has a placement: the GPU can only be offered whole.
        out.push((whole_gpu(common, gpu)?, DeviceKind::Gpu { gpu: pos }));
        return Ok((out, None));
    };
    let set_name = counter(&counter_set_name(gpu));
    // Instances kubedev did not create are offered as they are (static MIG devices) and take
    // their slices out of the partition model.
    let mut foreign = Vec::new();
    let mut seen_gi = BTreeSet::new();
    for inst in &gpu.instances {
        if owned.contains_key(&(gpu.uuid.clone(), inst.placement)) {
            continue;
        }
        if seen_gi.insert(inst.gi_id) {
            foreign.push(inst.placement);
        }
        out.push(static_mig(common, gpu, pos, inst, true)?);
    }
    if foreign.is_empty() {
        let mut whole = whole_gpu(common, gpu)?;
        whole.consumes_counters.push(CounterConsumption {
            counter_set: set_name.clone(),
            counters: totals.counters(),
        });
        out.push((whole, DeviceKind::Gpu { gpu: pos }));
    }
    for profile in &gpu.profiles {
        for &placement in &profile.placements {
            if placement.start.saturating_add(placement.size) > totals.memory_slices
                || foreign.iter().any(|f| f.overlaps(&placement))
            {
                continue;
            }
            let name = mig_device_name(gpu, &profile.name, placement, None);
            let mut d = mig_base(common, gpu, &name, profile, placement)?;
            d.consumes_counters.push(CounterConsumption {
                counter_set: set_name.clone(),
                counters: totals.profile_consumption(profile, placement),
            });
            out.push((
                d,
                DeviceKind::Placement {
                    gpu: pos,
                    profile: profile.clone(),
                    placement,
                },
            ));
        }
    }
    let set = CounterSet {
        name: set_name,
        counters: totals.counters(),
    };
    Ok((out, Some(set)))
}

/// The name of replica `r` of a device.
pub(crate) fn replica_name(base: &str, r: u32) -> String {
    format!("{base}-replica-{r}")
}

fn replicate(
    devices: Vec<Device>,
    kinds: BTreeMap<DeviceName, DeviceKind>,
    replicas: u32,
) -> (Vec<Device>, BTreeMap<DeviceName, DeviceKind>) {
    if replicas <= 1 {
        return (devices, kinds);
    }
    let mut out = Vec::with_capacity(devices.len() * replicas as usize);
    let mut out_kinds = BTreeMap::new();
    for d in devices {
        let Some(kind) = kinds.get(&d.name) else {
            continue;
        };
        for r in 0..replicas {
            let Ok(name) = DeviceName::new(replica_name(d.name.as_str(), r)) else {
                tracing::warn!(device = %d.name, "replica name is too long; device not replicated");
                continue;
            };
            let mut copy = d.clone();
            copy.name = name.clone();
            copy.attributes
                .insert(q(attr::REPLICA), AttributeValue::Int(i64::from(r)));
            out_kinds.insert(name, kind.clone());
            out.push(copy);
        }
    }
    (out, out_kinds)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
pub(crate) mod tests {
    use super::*;
    use crate::topology::tests::gpu;

    /// The A100-40GB MIG profiles and placements as NVML reports them.
    pub(crate) fn a100_profiles() -> Vec<MigProfile> {
        let p = |index, id, name: &str, slices, mem, sm, ce, dec, jpg, ofa, pl: &[(u32, u32)]| {
            MigProfile {
                index,
                id,
                name: name.into(),
                slice_count: slices,
                memory_mib: mem,
                multiprocessors: sm,
                copy_engines: ce,
                decoders: dec,
                encoders: 0,
                jpeg_engines: jpg,
                ofa_engines: ofa,
                placements: pl
                    .iter()
                    .map(|&(start, size)| Placement { start, size })
                    .collect(),
            }
        };
        let ones: Vec<(u32, u32)> = (0..7).map(|s| (s, 1)).collect();
        vec![
            p(0, 19, "1g.5gb", 1, 4864, 14, 1, 0, 0, 0, &ones),
            p(
                1,
                14,
                "2g.10gb",
                2,
                9856,
                28,
                2,
                1,
                0,
                0,
                &[(0, 2), (2, 2), (4, 2)],
            ),
            p(2, 9, "3g.20gb", 3, 19968, 42, 3, 2, 0, 0, &[(0, 4), (4, 4)]),
            p(3, 5, "4g.20gb", 4, 19968, 56, 4, 2, 0, 0, &[(0, 4)]),
            p(4, 0, "7g.40gb", 7, 40192, 98, 7, 5, 1, 1, &[(0, 8)]),
            p(7, 20, "1g.5gb+me", 1, 4864, 14, 1, 1, 1, 1, &ones),
            p(
                9,
                15,
                "1g.10gb",
                1,
                9856,
                14,
                1,
                1,
                0,
                0,
                &[(0, 2), (2, 2), (4, 2), (6, 2)],
            ),
        ]
    }

    pub(crate) fn machine(n: u32, mig: bool) -> MachineInfo {
        let gpus = (0..n)
            .map(|i| {
                let mut g = gpu(i, &format!("0000:{:02x}:00.0", i + 1), &[]);
                g.mig_enabled = mig;
                g.profiles = if mig { a100_profiles() } else { vec![] };
                g
            })
            .collect();
        MachineInfo {
            driver_version: Some("535.104.05".into()),
            cuda_driver_version: Some((12, 2)),
            gpus,
            ancestor_levels: vec![],
        }
    }

    fn build(config: &NvidiaConfig, m: &MachineInfo) -> Built {
        let t = Topology::from_machine(m);
        let (built, errors) = build_pool(
            PoolName::new("node-a-nvidia").unwrap(),
            config,
            m,
            &t,
            &|_, _| Health::healthy(),
            &Owned::new(),
        );
        assert!(errors.is_empty(), "{errors:?}");
        built.pool.validate().unwrap();
        built
    }

    fn s(d: &Device, id: &str) -> Option<AttributeValue> {
        d.attribute(&format!("{DOMAIN}/{id}")).cloned()
    }

    #[test]
    fn attribute_names_are_valid() {
        for id in [
            attr::TYPE,
            attr::UUID,
            attr::INDEX,
            attr::MINOR,
            attr::PRODUCT_NAME,
            attr::BRAND,
            attr::ARCHITECTURE,
            attr::CUDA_COMPUTE_CAPABILITY,
            attr::DRIVER_VERSION,
            attr::CUDA_DRIVER_VERSION,
            attr::PCIE_BUS_ID,
            attr::MIG_CAPABLE,
            attr::MIG_ENABLED,
            attr::NVLINK_GROUP,
            attr::NVLINK_PEERS,
            attr::PCIE_SWITCH_GROUP,
            attr::PARENT_UUID,
            attr::PARENT_INDEX,
            attr::PROFILE,
            attr::PLACEMENT_START,
            attr::PLACEMENT_SIZE,
            attr::GPU_INSTANCE_ID,
            attr::COMPUTE_INSTANCE_ID,
            attr::REPLICA,
            "copyEngines",
            "jpegEngines",
            "ofaEngines",
        ] {
            QualifiedName::new(format!("{DOMAIN}/{id}")).unwrap();
        }
        QualifiedName::new(STANDARD_PCI_BUS_ID).unwrap();
        QualifiedName::new(STANDARD_PCIE_ROOT).unwrap();
        for c in [
            counters::MULTIPROCESSORS,
            counters::COPY_ENGINES,
            counters::DECODERS,
            counters::ENCODERS,
            counters::JPEG_ENGINES,
            counters::OFA_ENGINES,
            counters::MEMORY,
            "memory-slice-15",
            "gpu-63-counters",
        ] {
            CounterName::new(c).unwrap();
        }
    }

    #[test]
    fn versions_and_labels() {
        let v = |s| loose_version(s).map(|v| v.to_string());
        assert_eq!(v("535.104.05").as_deref(), Some("535.104.5"));
        assert_eq!(v("560.28").as_deref(), Some("560.28.0"));
        assert_eq!(v("8.0").as_deref(), Some("8.0.0"));
        assert_eq!(v("r550"), None);
        assert_eq!(v("1.2.3.4"), None);
        assert_eq!(profile_label("1g.5gb"), "1g5gb");
        assert_eq!(profile_label("1g.5gb+me"), "1g5gb-me");
        assert_eq!(profile_label("1c.3g.20gb"), "1c3g20gb");
        assert_eq!(profile_label("1g.24gb-me"), "1g24gb-me");
        assert_eq!(profile_label("1g.10gb+gfx"), "1g10gb-gfx");
    }

    #[test]
    fn whole_gpus_carry_identity_versions_and_memory() {
        let b = build(&NvidiaConfig::default(), &machine(2, false));
        assert_eq!(b.pool.devices.len(), 2);
        let d = &b.pool.devices[1];
        assert_eq!(d.name.as_str(), "gpu-1");
        assert_eq!(s(d, attr::TYPE), Some(AttributeValue::String("gpu".into())));
        assert_eq!(s(d, attr::INDEX), Some(AttributeValue::Int(1)));
        assert_eq!(
            s(d, attr::DRIVER_VERSION).map(|v| v.to_string()).as_deref(),
            Some("535.104.5")
        );
        assert_eq!(
            s(d, attr::CUDA_DRIVER_VERSION)
                .map(|v| v.to_string())
                .as_deref(),
            Some("12.2.0")
        );
        assert_eq!(
            d.attribute(STANDARD_PCI_BUS_ID),
            Some(&AttributeValue::String("0000:02:00.0".into()))
        );
        assert_eq!(s(d, attr::NVLINK_GROUP), Some(AttributeValue::Int(1)));
        assert_eq!(
            d.capacity[&q("memory")].value,
            Quantity::parse("40Gi").unwrap()
        );
        assert_eq!(d.numa_node, Some(0));
        assert!(d.consumes_counters.is_empty());
        assert!(b.pool.shared_counters.is_empty());
        // Kubernetes allows 32 attributes and capacities per device (the publisher adds the
        // NUMA node).
        assert!(d.attributes.len() + d.capacity.len() < 32);
    }

    #[test]
    fn replicas_advertise_each_gpu_n_times() {
        let config = NvidiaConfig {
            replicas: 3,
            ..NvidiaConfig::default()
        };
        let b = build(&config, &machine(2, false));
        let names: Vec<_> = b.pool.devices.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "gpu-0-replica-0",
                "gpu-0-replica-1",
                "gpu-0-replica-2",
                "gpu-1-replica-0",
                "gpu-1-replica-1",
                "gpu-1-replica-2"
            ]
        );
        assert_eq!(
            s(&b.pool.devices[4], attr::REPLICA),
            Some(AttributeValue::Int(1))
        );
        assert_eq!(b.kinds[&b.pool.devices[4].name], DeviceKind::Gpu { gpu: 1 });
    }

    fn consumption(d: &Device) -> BTreeMap<String, i64> {
        d.consumes_counters
            .iter()
            .flat_map(|c| c.counters.iter())
            .map(|(k, v)| (k.to_string(), v.as_i64().unwrap()))
            .collect()
    }

    #[test]
    fn partition_model_has_every_placement_and_consistent_counters() {
        let config = NvidiaConfig {
            mig_strategy: MigStrategy::Partitionable,
            ..NvidiaConfig::default()
        };
        let b = build(&config, &machine(1, true));
        let names: Vec<_> = b.pool.devices.iter().map(|d| d.name.as_str()).collect();
        // 1 whole GPU + 7 (1g.5gb) + 3 (2g.10gb) + 2 (3g.20gb) + 1 (4g.20gb) + 1 (7g.40gb)
        // + 7 (1g.5gb+me) + 4 (1g.10gb).
        assert_eq!(names.len(), 26, "{names:?}");
        assert!(names.contains(&"gpu-0-mig-1g5gb-6"));
        assert!(!names.contains(&"gpu-0-mig-1g5gb-7"));
        assert!(names.contains(&"gpu-0-mig-1g5gb-me-0"));
        assert!(names.contains(&"gpu-0-mig-3g20gb-4"));
        assert!(names.contains(&"gpu-0-mig-7g40gb-0"));
        assert_eq!(b.pool.shared_counters.len(), 1);
        let set = &b.pool.shared_counters[0];
        assert_eq!(set.name.as_str(), "gpu-0-counters");
        let totals: BTreeMap<String, i64> = set
            .counters
            .iter()
            .map(|(k, v)| (k.to_string(), v.as_i64().unwrap()))
            .collect();
        assert_eq!(totals["memory-slice-7"], 1);
        assert_eq!(totals["multiprocessors"], 98);
        assert_eq!(totals["memory"], 40192 << 20);
        // The whole GPU consumes exactly the totals.
        let whole = b.pool.device("gpu-0").unwrap();
        assert_eq!(consumption(whole), totals);
        // Each placement consumes its own slices and its profile's engines and memory.
        let p = b.pool.device("gpu-0-mig-3g20gb-4").unwrap();
        let c = consumption(p);
        let slices: Vec<_> = c
            .keys()
            .filter(|k| k.starts_with("memory-slice-"))
            .cloned()
            .collect();
        assert_eq!(
            slices,
            [
                "memory-slice-4",
                "memory-slice-5",
                "memory-slice-6",
                "memory-slice-7"
            ]
        );
        assert_eq!(c["multiprocessors"], 42);
        assert_eq!(c["memory"], 19968 << 20);
        for d in &b.pool.devices {
            for (k, v) in consumption(d) {
                assert!(v <= totals[&k], "{} consumes {k}={v}", d.name);
            }
        }
    }

    /// Every set of placements the counters admit is a set of disjoint placements, and every
    /// set of disjoint placements whose engines fit is admitted: checked over all pairs and
    /// triples of the A100 model.
    #[test]
    fn counters_admit_exactly_the_non_overlapping_placements() {
        let config = NvidiaConfig {
            mig_strategy: MigStrategy::Partitionable,
            ..NvidiaConfig::default()
        };
        let b = build(&config, &machine(1, true));
        let set = &b.pool.shared_counters[0];
        let fits = |devs: &[&Device]| {
            set.counters.iter().all(|(k, total)| {
                let used: i64 = devs
                    .iter()
                    .flat_map(|d| d.consumes_counters.iter())
                    .filter_map(|c| c.counters.get(k))
                    .map(|v| v.as_i64().unwrap())
                    .sum();
                used <= total.as_i64().unwrap()
            })
        };
        let placement = |d: &Device| match &b.kinds[&d.name] {
            DeviceKind::Placement { placement, .. } => Some(*placement),
            _ => None,
        };
        let parts: Vec<&Device> = b
            .pool
            .devices
            .iter()
            .filter(|d| placement(d).is_some())
            .collect();
        // Physically, two A100 instances coexist when their memory slices are disjoint and at
        // most one of them holds the media engines (`+me`).
        let media = |d: &Device| d.name.as_str().contains("-me-");
        let mut checked = 0;
        for i in 0..parts.len() {
            for j in i + 1..parts.len() {
                let (a, c) = (placement(parts[i]).unwrap(), placement(parts[j]).unwrap());
                let both_media = media(parts[i]) && media(parts[j]);
                let physical = !(a.overlaps(&c) || both_media);
                assert_eq!(
                    fits(&[parts[i], parts[j]]),
                    physical,
                    "{} with {}",
                    parts[i].name,
                    parts[j].name
                );
                checked += 1;
            }
        }
        assert_eq!(checked, 25 * 24 / 2);
        // Seven 1g.5gb fit; an eighth 1-slice placement of another profile does not.
        let sevens: Vec<&Device> = (0..7)
            .map(|s| b.pool.device(&format!("gpu-0-mig-1g5gb-{s}")).unwrap())
            .collect();
        assert!(fits(&sevens));
        let whole = b.pool.device("gpu-0").unwrap();
        assert!(!fits(&[whole, sevens[0]]));
        let mut more = sevens.clone();
        more.push(b.pool.device("gpu-0-mig-1g10gb-6").unwrap());
        assert!(!fits(&more));
        // 3g.20gb at 0 and 4 together fill the GPU.
        let halves = [
            b.pool.device("gpu-0-mig-3g20gb-0").unwrap(),
            b.pool.device("gpu-0-mig-3g20gb-4").unwrap(),
        ];
        assert!(fits(&halves));
        // 4g.20gb + 3g.20gb at 4 fits (7 compute slices).
        assert!(fits(&[
            b.pool.device("gpu-0-mig-4g20gb-0").unwrap(),
            b.pool.device("gpu-0-mig-3g20gb-4").unwrap()
        ]));
    }

    #[test]
    fn foreign_instances_are_static_devices_and_block_their_slices() {
        let config = NvidiaConfig {
            mig_strategy: MigStrategy::Partitionable,
            ..NvidiaConfig::default()
        };
        let mut m = machine(1, true);
        m.gpus[0].instances.push(MigInstance {
            gi_id: 1,
            ci_id: 0,
            profile_id: 9,
            placement: Placement { start: 0, size: 4 },
            ci_slice_count: 3,
            uuid: Some("MIG-aaaa".into()),
        });
        let b = build(&config, &m);
        assert!(b.pool.device("gpu-0").is_none(), "whole GPU is withheld");
        let st = b.pool.device("gpu-0-mig-3g20gb-0").unwrap();
        assert!(st.consumes_counters.is_empty());
        assert_eq!(
            s(st, attr::UUID),
            Some(AttributeValue::String("MIG-aaaa".into()))
        );
        assert!(b.pool.device("gpu-0-mig-1g5gb-3").is_none());
        assert!(b.pool.device("gpu-0-mig-1g5gb-4").is_some());
        assert!(b.pool.device("gpu-0-mig-3g20gb-4").is_some());
        // The same instance, created by kubedev for a claim, stays a placement device.
        let t = Topology::from_machine(&m);
        let owned = Owned::from([(
            (m.gpus[0].uuid.clone(), Placement { start: 0, size: 4 }),
            Some(1),
        )]);
        let (b, errors) = build_pool(
            PoolName::new("p").unwrap(),
            &config,
            &m,
            &t,
            &|_, _| Health::healthy(),
            &owned,
        );
        assert!(errors.is_empty());
        let d = b.pool.device("gpu-0-mig-3g20gb-0").unwrap();
        assert_eq!(d.consumes_counters.len(), 1);
        assert!(b.pool.device("gpu-0").is_some());
    }

    #[test]
    fn static_strategy_lists_instances_and_not_the_gpu() {
        let config = NvidiaConfig {
            mig_strategy: MigStrategy::Static,
            ..NvidiaConfig::default()
        };
        let mut m = machine(2, true);
        m.gpus[1].mig_enabled = false;
        for (i, s) in [0u32, 1].into_iter().enumerate() {
            m.gpus[0].instances.push(MigInstance {
                gi_id: 7 + i as u32,
                ci_id: 0,
                profile_id: 19,
                placement: Placement { start: s, size: 1 },
                ci_slice_count: 1,
                uuid: Some(format!("MIG-{i}")),
            });
        }
        let b = build(&config, &m);
        let names: Vec<_> = b.pool.devices.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, ["gpu-0-mig-1g5gb-0", "gpu-0-mig-1g5gb-1", "gpu-1"]);
        let d = &b.pool.devices[1];
        assert_eq!(s(d, attr::TYPE), Some(AttributeValue::String("mig".into())));
        assert_eq!(s(d, attr::GPU_INSTANCE_ID), Some(AttributeValue::Int(8)));
        assert_eq!(
            s(d, attr::PARENT_UUID),
            Some(AttributeValue::String(m.gpus[0].uuid.clone()))
        );
        assert_eq!(
            d.capacity[&q("memory")].value,
            Quantity::parse("4864Mi").unwrap()
        );
        assert!(d.attributes.len() + d.capacity.len() < 32);
    }

    #[test]
    fn health_applies_to_every_device_of_a_gpu() {
        let m = machine(2, false);
        let t = Topology::from_machine(&m);
        let bad = m.gpus[1].uuid.clone();
        let (b, _) = build_pool(
            PoolName::new("p").unwrap(),
            &NvidiaConfig::default(),
            &m,
            &t,
            &|u, _| {
                if u == bad {
                    Health::unhealthy("Xid 79")
                } else {
                    Health::healthy()
                }
            },
            &Owned::new(),
        );
        assert!(b.pool.devices[0].health.is_healthy());
        assert_eq!(b.pool.devices[1].health.reason.as_deref(), Some("Xid 79"));
    }
}
