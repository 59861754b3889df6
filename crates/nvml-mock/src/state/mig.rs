//! MIG accounting of one GPU: GPU and compute instances, their profiles and placements, the ids
//! NVML assigns them and the UUIDs of MIG devices.

use std::collections::BTreeMap;

use super::Nv;
use crate::codes::*;
use crate::machine::{GpuInstanceProfile, MigProfileSet};

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

/// MIG state of a MIG-capable GPU.
#[derive(Debug, Clone)]
pub(crate) struct MigRt {
    pub(crate) enabled: bool,
    pub(crate) pending: bool,
    pub(crate) table: MigProfileSet,
    pub(crate) gis: BTreeMap<u32, Gi>,
}

/// A compute-instance profile derived from a GPU instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CiProfile {
    pub(crate) id: u32,
    pub(crate) slices: u32,
    pub(crate) instance_count: u32,
    pub(crate) multiprocessors: u32,
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
