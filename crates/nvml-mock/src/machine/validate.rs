//! Validation of a parsed machine: everything the library relies on, checked once at load, with
//! messages that name the field and value.

use std::collections::BTreeSet;

use super::{
    Gpu, Machine, Mig, MigProfileSet, MigState, NvLink, parse_bus_id, parse_compute_capability,
    parse_cpu_list,
};

/// Longest name NVML string buffers hold (leaving room for the NUL).
const MAX_STRING: usize = 79;

impl Machine {
    /// Checks everything the library relies on; the message names the field and value.
    pub fn validate(&self) -> Result<(), String> {
        check_string("driverVersion", &self.driver_version)?;
        check_string("nvmlVersion", &self.nvml_version_string())?;
        if self.gpus.len() > 4096 {
            return Err(format!("gpus: {} GPUs, at most 4096", self.gpus.len()));
        }
        let mut uuids = BTreeSet::new();
        let mut buses = BTreeSet::new();
        for (pos, gpu) in self.gpus.iter().enumerate() {
            self.validate_gpu(pos, gpu, &mut uuids, &mut buses)?;
        }
        for (name, set) in &self.mig_profile_sets {
            validate_profile_set(name, set)?;
        }
        for node in &self.numa {
            parse_cpu_list(&node.cpus).ok_or_else(|| {
                format!(
                    "numa node {}: cpus {:?} is not a CPU list",
                    node.node, node.cpus
                )
            })?;
        }
        for (i, group) in self.topology.groups.iter().enumerate() {
            for &g in &group.gpus {
                self.check_gpu(&format!("topology.groups[{i}]"), g)?;
            }
        }
        if let Some(nvlink) = &self.nvlink {
            self.validate_nvlink(nvlink)?;
        }
        for (i, event) in self.events.iter().enumerate() {
            self.check_gpu(&format!("events[{i}]"), event.gpu)?;
        }
        Ok(())
    }

    /// Checks the GPU at `pos`: its index, UUID and bus id (unique among those seen so far),
    /// strings, compute capability, memory, NUMA node and MIG section.
    fn validate_gpu(
        &self,
        pos: usize,
        gpu: &Gpu,
        uuids: &mut BTreeSet<String>,
        buses: &mut BTreeSet<(u32, u32, u32, u32)>,
    ) -> Result<(), String> {
        let at = format!("gpus[{pos}]");
        if let Some(index) = gpu.index
            && index as usize != pos
        {
            return Err(format!("{at}.index: {index} must equal the position {pos}"));
        }
        if !gpu.uuid.starts_with("GPU-") || gpu.uuid.len() > MAX_STRING {
            return Err(format!(
                "{at}.uuid: {:?} must start with GPU- and be at most {MAX_STRING} bytes",
                gpu.uuid
            ));
        }
        if !uuids.insert(gpu.uuid.to_ascii_lowercase()) {
            return Err(format!("{at}.uuid: {:?} is used twice", gpu.uuid));
        }
        check_string(&format!("{at}.name"), &gpu.name)?;
        parse_compute_capability(&gpu.compute_capability).ok_or_else(|| {
            format!(
                "{at}.computeCapability: {:?} is not major.minor",
                gpu.compute_capability
            )
        })?;
        if gpu.memory_reserved_mib + gpu.memory_used_mib > gpu.memory_mib {
            return Err(format!(
                "{at}: reserved {} MiB + used {} MiB exceed memoryMiB {}",
                gpu.memory_reserved_mib, gpu.memory_used_mib, gpu.memory_mib
            ));
        }
        let bus = parse_bus_id(&gpu.pci.bus_id)
            .ok_or_else(|| format!("{at}.pci.busId: {:?} is not dddd:bb:dd.f", gpu.pci.bus_id))?;
        if !buses.insert(bus) {
            return Err(format!(
                "{at}.pci.busId: {:?} is used twice",
                gpu.pci.bus_id
            ));
        }
        if let Some(node) = gpu.numa_node
            && node >= 1024
        {
            return Err(format!("{at}.numaNode: {node} is above 1023"));
        }
        if let Some(mig) = &gpu.mig {
            self.validate_gpu_mig(&at, mig)?;
        }
        Ok(())
    }

    /// Checks a GPU's MIG section: a known profile set, no instances while disabled, known
    /// instance profiles and `MIG-` UUIDs.
    fn validate_gpu_mig(&self, at: &str, mig: &Mig) -> Result<(), String> {
        let set = self.mig_profile_sets.get(&mig.profiles).ok_or_else(|| {
            format!(
                "{at}.mig.profiles: no migProfileSets entry {:?}",
                mig.profiles
            )
        })?;
        if mig.current == MigState::Disabled && !mig.instances.is_empty() {
            return Err(format!("{at}.mig.instances: MIG is disabled"));
        }
        for (i, instance) in mig.instances.iter().enumerate() {
            if !set
                .gpu_instance_profiles
                .iter()
                .any(|p| p.name == instance.profile)
            {
                return Err(format!(
                    "{at}.mig.instances[{i}].profile: {:?} is not in {:?}",
                    instance.profile, mig.profiles
                ));
            }
            for (c, ci) in instance.compute_instances.iter().enumerate() {
                if let Some(uuid) = &ci.uuid
                    && (!uuid.starts_with("MIG-") || uuid.len() > MAX_STRING)
                {
                    return Err(format!(
                        "{at}.mig.instances[{i}].computeInstances[{c}].uuid: {uuid:?} must start with MIG-"
                    ));
                }
            }
        }
        Ok(())
    }

    /// Checks NVLink wiring: link counts, switch bus ids, the GPUs linked and links per GPU.
    fn validate_nvlink(&self, nvlink: &NvLink) -> Result<(), String> {
        if nvlink.max_links > 18 {
            return Err(format!("nvlink.maxLinks: {} is above 18", nvlink.max_links));
        }
        for bus in &nvlink.switches {
            parse_bus_id(bus)
                .ok_or_else(|| format!("nvlink.switches: {bus:?} is not dddd:bb:dd.f"))?;
        }
        let mut used = vec![0u32; self.gpus.len()];
        if let Some(switched) = &nvlink.switched {
            if nvlink.switches.is_empty() {
                return Err("nvlink.switched: no nvlink.switches listed".to_string());
            }
            for &g in &switched.gpus {
                self.check_gpu("nvlink.switched", g)?;
                used[g as usize] += switched.links_per_gpu;
            }
        }
        for (i, pair) in nvlink.pairs.iter().enumerate() {
            for &g in &pair.gpus {
                self.check_gpu(&format!("nvlink.pairs[{i}]"), g)?;
                used[g as usize] += pair.links;
            }
            if pair.gpus[0] == pair.gpus[1] {
                return Err(format!(
                    "nvlink.pairs[{i}]: GPU {} linked to itself",
                    pair.gpus[0]
                ));
            }
        }
        for (g, n) in used.iter().enumerate() {
            if *n > nvlink.max_links {
                return Err(format!(
                    "nvlink: GPU {g} has {n} links, more than maxLinks {}",
                    nvlink.max_links
                ));
            }
        }
        Ok(())
    }

    /// Fails when GPU index `g` does not exist; `what` names the field.
    fn check_gpu(&self, what: &str, g: u32) -> Result<(), String> {
        let count = self.gpus.len() as u32;
        if g < count {
            Ok(())
        } else {
            Err(format!("{what}: GPU {g} does not exist ({count} GPUs)"))
        }
    }
}

fn check_string(what: &str, value: &str) -> Result<(), String> {
    if value.len() > MAX_STRING || value.contains('\0') {
        Err(format!(
            "{what}: {value:?} must be at most {MAX_STRING} bytes without NUL"
        ))
    } else {
        Ok(())
    }
}

fn validate_profile_set(name: &str, set: &MigProfileSet) -> Result<(), String> {
    let at = format!("migProfileSets.{name}");
    if set.memory_slices == 0 || set.memory_slices > 64 {
        return Err(format!(
            "{at}.memorySlices: {} not in 1..=64",
            set.memory_slices
        ));
    }
    if set.compute_slices == 0 || set.compute_slices > 64 {
        return Err(format!(
            "{at}.computeSlices: {} not in 1..=64",
            set.compute_slices
        ));
    }
    let mut enums = BTreeSet::new();
    let mut ids = BTreeSet::new();
    let mut names = BTreeSet::new();
    for p in &set.gpu_instance_profiles {
        let at = format!("{at} profile {:?}", p.name);
        check_string(&at, &format!("MIG {}", p.name))?;
        if p.profile >= nvml_wrapper_sys::bindings::NVML_GPU_INSTANCE_PROFILE_COUNT {
            return Err(format!(
                "{at}: profile {} is not an NVML_GPU_INSTANCE_PROFILE_* value",
                p.profile
            ));
        }
        if !enums.insert(p.profile) || !ids.insert(p.id) || !names.insert(p.name.clone()) {
            return Err(format!("{at}: profile, id or name used twice"));
        }
        if p.slice_count == 0 || p.slice_count > set.compute_slices {
            return Err(format!(
                "{at}: sliceCount {} not in 1..={}",
                p.slice_count, set.compute_slices
            ));
        }
        if p.placements.size == 0 {
            return Err(format!("{at}: placement size 0"));
        }
        for &start in &p.placements.starts {
            if start
                .checked_add(p.placements.size)
                .is_none_or(|end| end > set.memory_slices)
            {
                return Err(format!(
                    "{at}: placement {start}+{} exceeds {} memory slices",
                    p.placements.size, set.memory_slices
                ));
            }
        }
    }
    Ok(())
}
