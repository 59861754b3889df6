//! The partition model (KEP-4815) of a MIG-capable GPU: its counter set (memory slices,
//! engines, memory) and a placement device for every profile placement, each consuming its
//! share; instances kubedev did not create are offered as they are.

use std::collections::{BTreeMap, BTreeSet};

use kubedev_core::{
    AttributeValue, CounterConsumption, CounterName, CounterSet, Format, QualifiedName, Quantity,
};

use super::{
    BuildError, DeviceKind, GpuDevices, Owned, counter, counter_set_name, counters, mib_to_bytes,
    mig_base, mig_device_name, static_mig, whole_gpu,
};
use crate::snapshot::{GpuInfo, MigProfile, Placement};

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

pub(super) fn partitionable(
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
        whole
            .consumes_counters
            .push(CounterConsumption::new(set_name.clone(), totals.counters()));
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
            d.consumes_counters.push(CounterConsumption::new(
                set_name.clone(),
                totals.profile_consumption(profile, placement),
            ));
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
    let set = CounterSet::new(set_name, totals.counters());
    Ok((out, Some(set)))
}
