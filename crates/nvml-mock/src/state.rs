//! The running mock: GPUs, MIG instances with placement accounting, event sets and the control
//! file. Pure Rust with NVML return codes as errors; the exported C functions translate pointers.

use std::collections::{BTreeMap, VecDeque};
use std::io::{Read, Seek, SeekFrom};
use std::path::PathBuf;

use serde::Deserialize;

use crate::codes::*;
use crate::machine::{
    GpuInstanceProfile, Machine, MigProfileSet, MigState, TopologyLevel, XidEvent, parse_bus_id,
    parse_cpu_list,
};

/// Result with an NVML return code as error.
pub(crate) type Nv<T> = Result<T, u32>;

/// Event types a GPU supports when the machine file does not say.
const DEFAULT_EVENT_TYPES: u64 =
    EVENT_SINGLE_BIT_ECC | EVENT_DOUBLE_BIT_ECC | EVENT_PSTATE | EVENT_XID | EVENT_CLOCK;

/// What an opaque NVML handle stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Handle {
    /// A whole GPU.
    Gpu(u32),
    /// A MIG device (a compute instance seen as a device).
    Mig { gpu: u32, gi: u32, ci: u32 },
    /// A GPU instance.
    Gi { gpu: u32, gi: u32 },
    /// A compute instance.
    Ci { gpu: u32, gi: u32, ci: u32 },
    /// An event set.
    EventSet(u32),
}

const MAGIC: u64 = 0x6e76;

impl Handle {
    /// The pointer value handed to callers; never null.
    pub(crate) fn encode(self) -> usize {
        let (kind, gpu, gi, ci): (u64, u64, u64, u64) = match self {
            Handle::Gpu(g) => (1, g.into(), 0, 0),
            Handle::Mig { gpu, gi, ci } => (2, gpu.into(), gi.into(), ci.into()),
            Handle::Gi { gpu, gi } => (3, gpu.into(), gi.into(), 0),
            Handle::Ci { gpu, gi, ci } => (4, gpu.into(), gi.into(), ci.into()),
            Handle::EventSet(id) => (5, 0, 0, id.into()),
        };
        let raw = (MAGIC << 48)
            | (kind << 44)
            | ((gpu & 0xfff) << 32)
            | ((gi & 0xffff) << 16)
            | (ci & 0xffff);
        // Handles are opaque: on 64-bit targets the value fits; the pointer is never dereferenced.
        raw as usize
    }

    /// The handle a pointer value stands for, if it is one of ours.
    pub(crate) fn decode(raw: usize) -> Option<Handle> {
        let raw = raw as u64;
        if raw >> 48 != MAGIC {
            return None;
        }
        let kind = (raw >> 44) & 0xf;
        let gpu = ((raw >> 32) & 0xfff) as u32;
        let gi = ((raw >> 16) & 0xffff) as u32;
        let ci = (raw & 0xffff) as u32;
        match kind {
            1 if gi == 0 && ci == 0 => Some(Handle::Gpu(gpu)),
            2 => Some(Handle::Mig { gpu, gi, ci }),
            3 if ci == 0 => Some(Handle::Gi { gpu, gi }),
            4 => Some(Handle::Ci { gpu, gi, ci }),
            5 if gpu == 0 && gi == 0 => Some(Handle::EventSet(ci)),
            _ => None,
        }
    }
}

/// A running GPU instance.
#[derive(Debug, Clone)]
pub(crate) struct Gi {
    pub(crate) id: u32,
    /// Index into the GPU's profile table.
    pub(crate) profile: usize,
    pub(crate) start: u32,
    pub(crate) size: u32,
    pub(crate) cis: BTreeMap<u32, Ci>,
}

/// A running compute instance.
#[derive(Debug, Clone)]
pub(crate) struct Ci {
    pub(crate) id: u32,
    pub(crate) slices: u32,
    pub(crate) start: u32,
    pub(crate) uuid: String,
}

/// The far end of an NVLink.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum LinkEnd {
    Gpu(u32),
    Switch(String),
}

/// MIG state of a MIG-capable GPU.
#[derive(Debug, Clone)]
pub(crate) struct MigRt {
    pub(crate) enabled: bool,
    pub(crate) pending: bool,
    pub(crate) table: MigProfileSet,
    pub(crate) gis: BTreeMap<u32, Gi>,
}

/// A running GPU.
#[derive(Debug, Clone)]
pub(crate) struct GpuRt {
    pub(crate) lost: bool,
    pub(crate) mig: Option<MigRt>,
    pub(crate) links: Vec<LinkEnd>,
}

/// A compute-instance profile derived from a GPU instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CiProfile {
    pub(crate) id: u32,
    pub(crate) slices: u32,
    pub(crate) instance_count: u32,
    pub(crate) multiprocessors: u32,
}

/// An event waiting in an event set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Delivered {
    pub(crate) gpu: u32,
    pub(crate) event_type: u64,
    pub(crate) data: u64,
    pub(crate) gi: u32,
    pub(crate) ci: u32,
}

/// What a wait on an event set found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WaitOutcome {
    Event(Delivered),
    GpuLost,
    Nothing,
}

#[derive(Debug, Default)]
struct EventSetRt {
    /// GPU index → registered event type bits.
    registered: BTreeMap<u32, u64>,
    queue: VecDeque<Delivered>,
    lost_notice: bool,
}

#[derive(Debug)]
struct ControlTail {
    path: PathBuf,
    offset: u64,
    partial: Vec<u8>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ControlLine {
    xid: Option<u64>,
    gpu: Option<u32>,
    gi: Option<u32>,
    ci: Option<u32>,
    lost: Option<u32>,
    restore: Option<u32>,
}

/// The whole running mock.
#[derive(Debug)]
pub(crate) struct Mock {
    pub(crate) machine: Machine,
    pub(crate) gpus: Vec<GpuRt>,
    event_sets: BTreeMap<u32, EventSetRt>,
    next_event_set: u32,
    pending: VecDeque<XidEvent>,
    control: Option<ControlTail>,
}

/// Compute-instance profile enum value for a slice count.
pub(crate) fn ci_profile_for_slices(slices: u32) -> Option<u32> {
    match slices {
        1 => Some(0),
        2 => Some(1),
        3 => Some(2),
        4 => Some(3),
        7 => Some(4),
        8 => Some(5),
        6 => Some(6),
        _ => None,
    }
}

fn slices_for_ci_profile(profile: u32) -> Option<u32> {
    match profile {
        0 => Some(1),
        1 => Some(2),
        2 => Some(3),
        3 => Some(4),
        4 => Some(7),
        5 => Some(8),
        6 => Some(6),
        _ => None,
    }
}

/// Compute-instance placements in a GPU instance of `gi_slices` slices.
pub(crate) fn ci_placements(gi_slices: u32, slices: u32) -> Vec<u32> {
    let align = slices.next_power_of_two();
    (0..gi_slices)
        .step_by(align as usize)
        .filter(|s| s + slices <= gi_slices)
        .collect()
}

fn overlaps(a: u32, a_size: u32, b: u32, b_size: u32) -> bool {
    a < b + b_size && b < a + a_size
}

/// 64-bit FNV-1a.
fn fnv(seed: u64, bytes: &[u8]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64 ^ seed;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// A stable `MIG-` UUID for a compute instance of a GPU.
pub(crate) fn derived_mig_uuid(parent: &str, gi: u32, ci: u32) -> String {
    let key = format!("{parent}/{gi}/{ci}");
    let a = fnv(1, key.as_bytes());
    let b = fnv(2, key.as_bytes());
    format!(
        "MIG-{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        (a & 0x0fff) | 0x5000,
        ((b >> 48) & 0x3fff) | 0x8000,
        b & 0xffff_ffff_ffff
    )
}

impl MigRt {
    fn profile_by_id(&self, id: u32) -> Option<(usize, &GpuInstanceProfile)> {
        self.table
            .gpu_instance_profiles
            .iter()
            .enumerate()
            .find(|(_, p)| p.id == id)
    }

    fn used_compute_slices(&self) -> u32 {
        self.gis
            .values()
            .map(|gi| self.table.gpu_instance_profiles[gi.profile].slice_count)
            .sum()
    }

    /// Creates a GPU instance of profile `id`, at `start` or the first free placement.
    pub(crate) fn create_gi(
        &mut self,
        id: u32,
        start: Option<(u32, u32)>,
        want_id: Option<u32>,
    ) -> Nv<u32> {
        if !self.enabled {
            return Err(ERROR_NOT_SUPPORTED);
        }
        let (index, profile) = self.profile_by_id(id).ok_or(ERROR_INVALID_ARGUMENT)?;
        let size = profile.placements.size;
        if let Some((s, sz)) = start
            && (sz != size || !profile.placements.starts.contains(&s))
        {
            return Err(ERROR_INVALID_ARGUMENT);
        }
        let existing = self.gis.values().filter(|g| g.profile == index).count() as u32;
        if existing >= profile.instance_count {
            return Err(ERROR_INSUFFICIENT_RESOURCES);
        }
        if self.used_compute_slices() + profile.slice_count > self.table.compute_slices {
            return Err(ERROR_INSUFFICIENT_RESOURCES);
        }
        let free = |s: u32| {
            self.gis
                .values()
                .all(|g| !overlaps(s, size, g.start, g.size))
        };
        let start = match start {
            Some((s, _)) if free(s) => s,
            Some(_) => return Err(ERROR_INSUFFICIENT_RESOURCES),
            None => profile
                .placements
                .starts
                .iter()
                .copied()
                .find(|&s| free(s))
                .ok_or(ERROR_INSUFFICIENT_RESOURCES)?,
        };
        let gi_id = match want_id {
            Some(want) if self.gis.contains_key(&want) => return Err(ERROR_INSUFFICIENT_RESOURCES),
            Some(want) => want,
            None => self.next_gi_id(start, size),
        };
        self.gis.insert(
            gi_id,
            Gi {
                id: gi_id,
                profile: index,
                start,
                size,
                cis: BTreeMap::new(),
            },
        );
        Ok(gi_id)
    }

    /// GPU-instance id as NVML assigns it: the heap index of the memory-slice range when the
    /// slices form a binary tree, else the smallest free id.
    fn next_gi_id(&self, start: u32, size: u32) -> u32 {
        let total = self.table.memory_slices;
        if total.is_power_of_two()
            && size.is_power_of_two()
            && size <= total
            && start.is_multiple_of(size)
        {
            let id = (total / size - 1) + start / size;
            if !self.gis.contains_key(&id) {
                return id;
            }
        }
        (0..)
            .find(|id| !self.gis.contains_key(id))
            .unwrap_or(u32::MAX)
    }

    /// How many more instances of profile `id` fit now.
    pub(crate) fn remaining(&self, id: u32) -> Nv<u32> {
        if !self.enabled {
            return Err(ERROR_NOT_SUPPORTED);
        }
        self.profile_by_id(id).ok_or(ERROR_INVALID_ARGUMENT)?;
        let mut trial = self.clone();
        let mut n = 0;
        while trial.create_gi(id, None, None).is_ok() {
            n += 1;
        }
        Ok(n)
    }

    /// Compute-instance profile `profile` (enum) of GPU instance `gi`.
    pub(crate) fn ci_profile(&self, gi: u32, profile: u32) -> Nv<CiProfile> {
        let gi = self.gis.get(&gi).ok_or(ERROR_INVALID_ARGUMENT)?;
        let gp = &self.table.gpu_instance_profiles[gi.profile];
        let slices = slices_for_ci_profile(profile).ok_or(ERROR_NOT_SUPPORTED)?;
        if slices > gp.slice_count || ci_placements(gp.slice_count, slices).is_empty() {
            return Err(ERROR_NOT_SUPPORTED);
        }
        Ok(CiProfile {
            id: profile,
            slices,
            instance_count: gp.slice_count / slices,
            multiprocessors: gp.multiprocessor_count * slices / gp.slice_count,
        })
    }

    /// Creates a compute instance; returns its id.
    pub(crate) fn create_ci(
        &mut self,
        parent_uuid: &str,
        gi_id: u32,
        profile: u32,
        want: Option<(u32, u32)>,
        want_id: Option<u32>,
        uuid: Option<String>,
    ) -> Nv<u32> {
        let cp = self.ci_profile(gi_id, profile)?;
        let gi = self.gis.get_mut(&gi_id).ok_or(ERROR_INVALID_ARGUMENT)?;
        let gi_slices = gi.cis.values().map(|c| c.slices).sum::<u32>();
        let same = gi.cis.values().filter(|c| c.slices == cp.slices).count() as u32;
        let total_slices = self.table.gpu_instance_profiles[gi.profile].slice_count;
        if same >= cp.instance_count || gi_slices + cp.slices > total_slices {
            return Err(ERROR_INSUFFICIENT_RESOURCES);
        }
        let placements = ci_placements(total_slices, cp.slices);
        if let Some((s, size)) = want
            && (size != cp.slices || !placements.contains(&s))
        {
            return Err(ERROR_INVALID_ARGUMENT);
        }
        let free = |s: u32| {
            gi.cis
                .values()
                .all(|c| !overlaps(s, cp.slices, c.start, c.slices))
        };
        let start = match want {
            Some((s, _)) if free(s) => s,
            Some(_) => return Err(ERROR_INSUFFICIENT_RESOURCES),
            None => placements
                .into_iter()
                .find(|&s| free(s))
                .ok_or(ERROR_INSUFFICIENT_RESOURCES)?,
        };
        let id = match want_id {
            Some(id) if gi.cis.contains_key(&id) => return Err(ERROR_INSUFFICIENT_RESOURCES),
            Some(id) => id,
            None => (0..)
                .find(|id| !gi.cis.contains_key(id))
                .unwrap_or(u32::MAX),
        };
        let uuid = uuid.unwrap_or_else(|| derived_mig_uuid(parent_uuid, gi_id, id));
        gi.cis.insert(
            id,
            Ci {
                id,
                slices: cp.slices,
                start,
                uuid,
            },
        );
        Ok(id)
    }

    /// MIG devices in index order: (GPU instance, compute instance).
    pub(crate) fn mig_devices(&self) -> Vec<(u32, u32)> {
        self.gis
            .values()
            .flat_map(|gi| gi.cis.keys().map(move |ci| (gi.id, *ci)))
            .collect()
    }
}

impl Mock {
    /// Builds the running mock from a validated machine; pre-existing MIG instances are created
    /// through the same accounting as runtime creation, so an impossible layout is refused.
    pub(crate) fn new(machine: Machine, control_override: Option<PathBuf>) -> Result<Mock, String> {
        let mut gpus = Vec::with_capacity(machine.gpus.len());
        for (pos, gpu) in machine.gpus.iter().enumerate() {
            let mig = match &gpu.mig {
                None => None,
                Some(m) => {
                    let table = machine
                        .mig_profile_sets
                        .get(&m.profiles)
                        .cloned()
                        .ok_or_else(|| {
                            format!("gpus[{pos}].mig.profiles: unknown {:?}", m.profiles)
                        })?;
                    let enabled = m.current == MigState::Enabled;
                    let mut rt = MigRt {
                        enabled,
                        pending: m.pending.map_or(enabled, |p| p == MigState::Enabled),
                        table,
                        gis: BTreeMap::new(),
                    };
                    for (i, inst) in m.instances.iter().enumerate() {
                        let at = format!("gpus[{pos}].mig.instances[{i}]");
                        let (_, profile) = rt
                            .table
                            .gpu_instance_profiles
                            .iter()
                            .enumerate()
                            .find(|(_, p)| p.name == inst.profile)
                            .ok_or_else(|| format!("{at}: unknown profile {:?}", inst.profile))?;
                        let (pid, size, gi_slices) =
                            (profile.id, profile.placements.size, profile.slice_count);
                        let gi = rt
                            .create_gi(pid, Some((inst.start, size)), inst.id)
                            .map_err(|code| {
                                format!(
                                    "{at}: {} at start {} cannot be created: {}",
                                    inst.profile,
                                    inst.start,
                                    error_string(code)
                                )
                            })?;
                        for (c, ci) in inst.compute_instances.iter().enumerate() {
                            let slices = ci.slices.unwrap_or(gi_slices);
                            let cprof = ci_profile_for_slices(slices).ok_or_else(|| {
                                format!(
                                    "{at}.computeInstances[{c}]: {slices} slices has no profile"
                                )
                            })?;
                            rt.create_ci(&gpu.uuid, gi, cprof, None, ci.id, ci.uuid.clone())
                                .map_err(|code| {
                                    format!(
                                        "{at}.computeInstances[{c}]: cannot be created: {}",
                                        error_string(code)
                                    )
                                })?;
                        }
                    }
                    Some(rt)
                }
            };
            gpus.push(GpuRt {
                lost: gpu.lost,
                mig,
                links: Vec::new(),
            });
        }
        if let Some(nvlink) = &machine.nvlink {
            if let Some(sw) = &nvlink.switched {
                for &g in &sw.gpus {
                    for l in 0..sw.links_per_gpu {
                        let bus = nvlink.switches[l as usize % nvlink.switches.len()].clone();
                        gpus[g as usize].links.push(LinkEnd::Switch(bus));
                    }
                }
            }
            for pair in &nvlink.pairs {
                let [a, b] = pair.gpus;
                for _ in 0..pair.links {
                    gpus[a as usize].links.push(LinkEnd::Gpu(b));
                    gpus[b as usize].links.push(LinkEnd::Gpu(a));
                }
            }
        }
        let control = control_override
            .or_else(|| machine.control.clone())
            .map(|path| ControlTail {
                path,
                offset: 0,
                partial: Vec::new(),
            });
        let pending = machine.events.iter().cloned().collect();
        Ok(Mock {
            machine,
            gpus,
            event_sets: BTreeMap::new(),
            next_event_set: 1,
            pending,
            control,
        })
    }

    /// The GPU at `index`, failing when it does not exist or is lost.
    pub(crate) fn gpu(&self, index: u32) -> Nv<(&crate::machine::Gpu, &GpuRt)> {
        let rt = self
            .gpus
            .get(index as usize)
            .ok_or(ERROR_INVALID_ARGUMENT)?;
        if rt.lost {
            return Err(ERROR_GPU_IS_LOST);
        }
        Ok((&self.machine.gpus[index as usize], rt))
    }

    /// Mutable MIG state of a GPU (not lost); NOT_SUPPORTED when it has no MIG.
    pub(crate) fn mig_mut(&mut self, index: u32) -> Nv<(&str, &mut MigRt)> {
        let rt = self
            .gpus
            .get_mut(index as usize)
            .ok_or(ERROR_INVALID_ARGUMENT)?;
        if rt.lost {
            return Err(ERROR_GPU_IS_LOST);
        }
        let uuid = self.machine.gpus[index as usize].uuid.as_str();
        Ok((uuid, rt.mig.as_mut().ok_or(ERROR_NOT_SUPPORTED)?))
    }

    /// MIG state of a GPU (not lost); NOT_SUPPORTED when it has no MIG.
    pub(crate) fn mig(&self, index: u32) -> Nv<&MigRt> {
        self.gpu(index)?.1.mig.as_ref().ok_or(ERROR_NOT_SUPPORTED)
    }

    /// Resolves a device handle (GPU or MIG device) that must still exist.
    pub(crate) fn device(&self, raw: usize) -> Nv<Handle> {
        match Handle::decode(raw) {
            Some(Handle::Gpu(g)) if (g as usize) < self.gpus.len() => Ok(Handle::Gpu(g)),
            Some(h @ Handle::Mig { gpu, gi, ci }) => {
                self.ci(gpu, gi, ci)?;
                Ok(h)
            }
            _ => Err(ERROR_INVALID_ARGUMENT),
        }
    }

    /// Resolves a whole-GPU handle; a MIG device handle gives `mig_error`.
    pub(crate) fn whole_gpu(&self, raw: usize, mig_error: u32) -> Nv<u32> {
        match self.device(raw)? {
            Handle::Gpu(g) => Ok(g),
            _ => Err(mig_error),
        }
    }

    /// A GPU instance that exists.
    pub(crate) fn gi(&self, gpu: u32, gi: u32) -> Nv<&Gi> {
        let mig = self.mig(gpu).map_err(|e| {
            if e == ERROR_NOT_SUPPORTED {
                ERROR_INVALID_ARGUMENT
            } else {
                e
            }
        })?;
        mig.gis.get(&gi).ok_or(ERROR_INVALID_ARGUMENT)
    }

    /// A compute instance that exists.
    pub(crate) fn ci(&self, gpu: u32, gi: u32, ci: u32) -> Nv<&Ci> {
        self.gi(gpu, gi)?.cis.get(&ci).ok_or(ERROR_INVALID_ARGUMENT)
    }

    /// Resolves a GPU-instance handle.
    pub(crate) fn gi_handle(&self, raw: usize) -> Nv<(u32, u32)> {
        match Handle::decode(raw) {
            Some(Handle::Gi { gpu, gi }) => {
                self.gi(gpu, gi)?;
                Ok((gpu, gi))
            }
            _ => Err(ERROR_INVALID_ARGUMENT),
        }
    }

    /// Resolves a compute-instance handle.
    pub(crate) fn ci_handle(&self, raw: usize) -> Nv<(u32, u32, u32)> {
        match Handle::decode(raw) {
            Some(Handle::Ci { gpu, gi, ci }) => {
                self.ci(gpu, gi, ci)?;
                Ok((gpu, gi, ci))
            }
            _ => Err(ERROR_INVALID_ARGUMENT),
        }
    }

    /// Common-ancestor level of two GPUs.
    pub(crate) fn topology(&self, a: u32, b: u32) -> TopologyLevel {
        if a == b {
            return TopologyLevel::Internal;
        }
        let topo = &self.machine.topology;
        topo.groups
            .iter()
            .rev()
            .find(|g| g.gpus.contains(&a) && g.gpus.contains(&b))
            .map_or(topo.default, |g| g.level)
    }

    /// Whether two GPUs reach each other over NVLink.
    pub(crate) fn nvlinked(&self, a: u32, b: u32) -> bool {
        let (Some(ga), Some(gb)) = (self.gpus.get(a as usize), self.gpus.get(b as usize)) else {
            return false;
        };
        let on_fabric = |g: &GpuRt| g.links.iter().any(|l| matches!(l, LinkEnd::Switch(_)));
        a != b && (ga.links.contains(&LinkEnd::Gpu(b)) || (on_fabric(ga) && on_fabric(gb)))
    }

    /// CPUs of a NUMA node, if the machine lists them.
    pub(crate) fn numa_cpus(&self, node: u32) -> Option<Vec<u32>> {
        self.machine
            .numa
            .iter()
            .find(|n| n.node == node)
            .and_then(|n| parse_cpu_list(&n.cpus))
    }

    /// The GPU with this PCI bus id.
    pub(crate) fn gpu_by_bus(&self, bus: &str) -> Option<u32> {
        let want = parse_bus_id(bus)?;
        self.machine
            .gpus
            .iter()
            .position(|g| parse_bus_id(&g.pci.bus_id) == Some(want))
            .map(|p| p as u32)
    }

    /// The device with this UUID (GPU or MIG device).
    pub(crate) fn device_by_uuid(&self, uuid: &str) -> Option<Handle> {
        for (g, gpu) in self.machine.gpus.iter().enumerate() {
            if gpu.uuid.eq_ignore_ascii_case(uuid) {
                return Some(Handle::Gpu(g as u32));
            }
            if let Some(mig) = &self.gpus[g].mig {
                for gi in mig.gis.values() {
                    for ci in gi.cis.values() {
                        if ci.uuid.eq_ignore_ascii_case(uuid) {
                            return Some(Handle::Mig {
                                gpu: g as u32,
                                gi: gi.id,
                                ci: ci.id,
                            });
                        }
                    }
                }
            }
        }
        None
    }

    /// Supported event types of a GPU.
    pub(crate) fn supported_events(&self, gpu: u32) -> u64 {
        self.machine.gpus[gpu as usize]
            .supported_event_types
            .unwrap_or(DEFAULT_EVENT_TYPES)
    }

    /// Creates an event set.
    pub(crate) fn create_event_set(&mut self) -> Nv<u32> {
        if self.next_event_set > 0xffff {
            return Err(ERROR_MEMORY);
        }
        let id = self.next_event_set;
        self.next_event_set += 1;
        self.event_sets.insert(id, EventSetRt::default());
        Ok(id)
    }

    /// Frees an event set.
    pub(crate) fn free_event_set(&mut self, id: u32) -> Nv<()> {
        self.event_sets
            .remove(&id)
            .map(|_| ())
            .ok_or(ERROR_INVALID_ARGUMENT)
    }

    /// Whether an event set exists.
    pub(crate) fn has_event_set(&self, id: u32) -> bool {
        self.event_sets.contains_key(&id)
    }

    /// Registers `types` of GPU `gpu` with event set `set`.
    pub(crate) fn register(&mut self, gpu: u32, types: u64, set: u32) -> Nv<()> {
        self.gpu(gpu)?;
        if types & !self.supported_events(gpu) != 0 {
            return Err(ERROR_NOT_SUPPORTED);
        }
        let es = self
            .event_sets
            .get_mut(&set)
            .ok_or(ERROR_INVALID_ARGUMENT)?;
        *es.registered.entry(gpu).or_insert(0) |= types;
        self.deliver();
        Ok(())
    }

    /// Moves pending Xid events to every event set that has their GPU registered for Xids;
    /// events nobody listens to yet stay pending.
    fn deliver(&mut self) {
        let mut keep = VecDeque::new();
        while let Some(ev) = self.pending.pop_front() {
            let mut taken = false;
            for es in self.event_sets.values_mut() {
                if es
                    .registered
                    .get(&ev.gpu)
                    .is_some_and(|t| t & EVENT_XID != 0)
                {
                    es.queue.push_back(Delivered {
                        gpu: ev.gpu,
                        event_type: EVENT_XID,
                        data: ev.xid,
                        gi: ev.gi.unwrap_or(u32::MAX),
                        ci: ev.ci.unwrap_or(u32::MAX),
                    });
                    taken = true;
                }
            }
            if !taken {
                keep.push_back(ev);
            }
        }
        self.pending = keep;
    }

    /// Takes the next event of a set (after reading the control file).
    pub(crate) fn take_event(&mut self, set: u32) -> Nv<WaitOutcome> {
        self.poll_control();
        let es = self
            .event_sets
            .get_mut(&set)
            .ok_or(ERROR_INVALID_ARGUMENT)?;
        if es.lost_notice {
            es.lost_notice = false;
            return Ok(WaitOutcome::GpuLost);
        }
        Ok(es
            .queue
            .pop_front()
            .map_or(WaitOutcome::Nothing, WaitOutcome::Event))
    }

    /// Reads new complete lines of the control file and applies them.
    pub(crate) fn poll_control(&mut self) {
        let Some(tail) = self.control.as_mut() else {
            return;
        };
        let Ok(mut file) = std::fs::File::open(&tail.path) else {
            return;
        };
        let Ok(len) = file.metadata().map(|m| m.len()) else {
            return;
        };
        if len < tail.offset {
            // Truncated or replaced: start over.
            tail.offset = 0;
            tail.partial.clear();
        }
        if len == tail.offset {
            return;
        }
        let mut buf = Vec::new();
        if file.seek(SeekFrom::Start(tail.offset)).is_err() || file.read_to_end(&mut buf).is_err() {
            return;
        }
        tail.offset += buf.len() as u64;
        tail.partial.extend_from_slice(&buf);
        let Some(last_newline) = tail.partial.iter().rposition(|&b| b == b'\n') else {
            return;
        };
        let complete: Vec<u8> = tail.partial.drain(..=last_newline).collect();
        let text = String::from_utf8_lossy(&complete).into_owned();
        for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
            if let Err(why) = self.apply_control(line) {
                eprintln!("nvml-mock: ignoring control line {line:?}: {why}");
            }
        }
        self.deliver();
    }

    fn apply_control(&mut self, line: &str) -> Result<(), String> {
        let c: ControlLine = serde_json::from_str(line).map_err(|e| e.to_string())?;
        let n = self.gpus.len() as u32;
        let check = |g: u32| {
            if g < n {
                Ok(g)
            } else {
                Err(format!("GPU {g} does not exist ({n} GPUs)"))
            }
        };
        match c {
            ControlLine {
                xid: Some(xid),
                gpu: Some(gpu),
                gi,
                ci,
                lost: None,
                restore: None,
            } => {
                check(gpu)?;
                self.pending.push_back(XidEvent { xid, gpu, gi, ci });
            }
            ControlLine {
                xid: None,
                gpu: None,
                gi: None,
                ci: None,
                lost: Some(g),
                restore: None,
            } => {
                check(g)?;
                if !self.gpus[g as usize].lost {
                    self.gpus[g as usize].lost = true;
                    for es in self.event_sets.values_mut() {
                        if es.registered.contains_key(&g) {
                            es.lost_notice = true;
                        }
                    }
                }
            }
            ControlLine {
                xid: None,
                gpu: None,
                gi: None,
                ci: None,
                lost: None,
                restore: Some(g),
            } => {
                check(g)?;
                self.gpus[g as usize].lost = false;
            }
            _ => {
                return Err(
                    "expected {\"xid\":N,\"gpu\":N}, {\"lost\":N} or {\"restore\":N}".to_string(),
                );
            }
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn handles_round_trip() {
        for h in [
            Handle::Gpu(0),
            Handle::Gpu(4095),
            Handle::Mig {
                gpu: 3,
                gi: 13,
                ci: 2,
            },
            Handle::Gi { gpu: 7, gi: 0 },
            Handle::Ci {
                gpu: 1,
                gi: 1,
                ci: 0,
            },
            Handle::EventSet(9),
        ] {
            assert_ne!(h.encode(), 0);
            assert_eq!(Handle::decode(h.encode()), Some(h));
        }
        assert_eq!(Handle::decode(0), None);
        assert_eq!(Handle::decode(0x1234), None);
    }

    #[test]
    fn ci_placements_follow_alignment() {
        assert_eq!(ci_placements(7, 1), vec![0, 1, 2, 3, 4, 5, 6]);
        assert_eq!(ci_placements(7, 2), vec![0, 2, 4]);
        assert_eq!(ci_placements(7, 3), vec![0, 4]);
        assert_eq!(ci_placements(7, 4), vec![0]);
        assert_eq!(ci_placements(7, 7), vec![0]);
        assert_eq!(ci_placements(3, 2), vec![0]);
    }

    fn load(name: &str) -> Mock {
        let machine = Machine::load(&crate::machine_path(name)).unwrap();
        Mock::new(machine, None).unwrap()
    }

    #[test]
    fn bundled_machines_build() {
        let dgx = load("dgx-a100");
        assert_eq!(dgx.gpus.len(), 8);
        let mig7 = dgx.gpus[7].mig.as_ref().unwrap();
        assert_eq!(mig7.gis.keys().copied().collect::<Vec<_>>(), vec![1, 5, 13]);
        assert_eq!(mig7.mig_devices(), vec![(1, 0), (5, 0), (5, 1), (13, 0)]);
        assert_eq!(dgx.gpus[0].links.len(), 12);
        assert!(dgx.nvlinked(0, 7));
        assert_eq!(dgx.topology(0, 1), TopologyLevel::Multiple);
        assert_eq!(dgx.topology(0, 2), TopologyLevel::Node);
        assert_eq!(dgx.topology(0, 4), TopologyLevel::System);
        let h100 = load("h100-mig");
        let mig = h100.gpus[0].mig.as_ref().unwrap();
        assert_eq!(
            mig.gis.keys().copied().collect::<Vec<_>>(),
            (7..14).collect::<Vec<_>>()
        );
        assert_eq!(mig.mig_devices().len(), 7);
        let ws = load("workstation");
        assert!(
            ws.gpus
                .iter()
                .all(|g| g.mig.is_none() && g.links.is_empty())
        );
        assert!(!ws.nvlinked(0, 1));
    }

    #[test]
    fn a100_placement_accounting() {
        let mut dgx = load("dgx-a100");
        let (_, mig) = dgx.mig_mut(6).unwrap();
        // 3g.20gb (id 9) at 0 and 4 → GI ids 1 and 2; a third does not fit.
        assert_eq!(mig.create_gi(9, None, None), Ok(1));
        assert_eq!(mig.remaining(9), Ok(1));
        assert_eq!(mig.create_gi(9, Some((4, 4)), None), Ok(2));
        assert_eq!(
            mig.create_gi(9, None, None),
            Err(ERROR_INSUFFICIENT_RESOURCES)
        );
        // Memory full: no 1g.5gb (id 19) anywhere.
        assert_eq!(mig.remaining(19), Ok(0));
        // A placement not in the table.
        assert_eq!(
            mig.create_gi(19, Some((7, 1)), None),
            Err(ERROR_INVALID_ARGUMENT)
        );
        mig.gis.remove(&2);
        // 4g.20gb (id 5) only at 0, which is taken.
        assert_eq!(
            mig.create_gi(5, None, None),
            Err(ERROR_INSUFFICIENT_RESOURCES)
        );
        // 2g.10gb (id 14) at 4 → GI 5, then 1g.5gb at 6 → GI 13; compute slices 3+2+1 = 6.
        assert_eq!(mig.create_gi(14, Some((4, 2)), None), Ok(5));
        assert_eq!(mig.create_gi(19, None, None), Ok(13));
        assert_eq!(mig.remaining(19), Ok(0));
        // Compute instances inside the 3g: 1c x3, then no more.
        let uuid = "GPU-x";
        assert_eq!(mig.create_ci(uuid, 1, 0, None, None, None), Ok(0));
        assert_eq!(
            mig.create_ci(uuid, 1, 1, None, None, None),
            Err(ERROR_INSUFFICIENT_RESOURCES)
        );
        assert_eq!(mig.create_ci(uuid, 1, 0, None, None, None), Ok(1));
        assert_eq!(mig.create_ci(uuid, 1, 0, None, None, None), Ok(2));
        assert_eq!(
            mig.create_ci(uuid, 1, 0, None, None, None),
            Err(ERROR_INSUFFICIENT_RESOURCES)
        );
        // 7-slice compute profile does not exist in a 3-slice GPU instance.
        assert_eq!(mig.ci_profile(1, 4), Err(ERROR_NOT_SUPPORTED));
    }

    #[test]
    fn impossible_layouts_are_refused_at_load() {
        let text = std::fs::read_to_string(crate::machine_path("h100-mig")).unwrap();
        let text = text.replace("start: 6", "start: 5");
        let machine = Machine::from_yaml(&text).unwrap();
        let err = Mock::new(machine, None).unwrap_err();
        assert!(
            err.contains("instances[6]") && err.contains("Insufficient resources"),
            "{err}"
        );
    }

    #[test]
    fn mig_uuids_are_stable_and_distinct() {
        let a = derived_mig_uuid("GPU-1", 7, 0);
        assert_eq!(a, derived_mig_uuid("GPU-1", 7, 0));
        assert_ne!(a, derived_mig_uuid("GPU-1", 8, 0));
        assert!(a.starts_with("MIG-") && a.len() == 40, "{a}");
    }
}
