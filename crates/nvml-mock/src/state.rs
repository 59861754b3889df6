//! The running mock: GPUs, MIG instances with placement accounting, event sets and the control
//! file. Pure Rust with NVML return codes as errors; the exported C functions translate pointers.

mod events;
mod mig;

use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;

use crate::codes::*;
use crate::machine::{Machine, MigState, TopologyLevel, XidEvent, parse_bus_id, parse_cpu_list};
use events::{ControlTail, EventSetRt};

pub(crate) use events::WaitOutcome;
pub(crate) use mig::{Ci, CiProfile, Gi, MigRt, ci_placements, ci_profile_for_slices};

/// Result with an NVML return code as error.
pub(crate) type Nv<T> = Result<T, u32>;

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

/// The far end of an NVLink.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum LinkEnd {
    Gpu(u32),
    Switch(String),
}

/// A running GPU.
#[derive(Debug, Clone)]
pub(crate) struct GpuRt {
    pub(crate) lost: bool,
    pub(crate) mig: Option<MigRt>,
    pub(crate) links: Vec<LinkEnd>,
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
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
