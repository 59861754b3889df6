//! The device model: what NVML reported, turned into kubedev devices, counters and names.
//!
//! Pure: no NVML, no host access. The partition model (KEP-4815) is in `partition`.

mod partition;

use std::collections::BTreeMap;

use kubedev_core::{
    AttributeValue, CounterName, CounterSet, Device, DeviceName, Format, Health, Pool, PoolName,
    QualifiedName, Quantity,
};

use crate::config::{MigStrategy, NvidiaConfig};
use crate::snapshot::{GpuInfo, MachineInfo, MigInstance, MigProfile, Placement};
use crate::topology::Topology;
use partition::partitionable;

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
    #[error("GPU {gpu}: {what} {0} cannot be published: {reason}", kubedev_core::echo::echo(.value))]
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
        .unwrap_or_else(|e| unreachable_name(name, &kubedev_core::echo::chain(&e)))
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
        tracing::error!(name, error = %kubedev_core::echo::Chain(&e), "invalid counter name");
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
        reason: kubedev_core::echo::chain(&e),
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
            reason: kubedev_core::echo::chain(&e),
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
pub(crate) mod tests;
