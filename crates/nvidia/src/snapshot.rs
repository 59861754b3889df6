//! What NVML said about the machine, as plain data.
//!
//! The FFI layer ([`crate::ffi`]) fills these structs once per discovery; everything else (the
//! device model, the partition model, topology, edits) is pure code over them, tested without a
//! library.

/// One MIG placement: where on the GPU's memory slices an instance sits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct Placement {
    /// First memory slice.
    pub(crate) start: u32,
    /// Number of memory slices.
    pub(crate) size: u32,
}

impl Placement {
    /// The memory slices the placement covers.
    pub(crate) fn slices(&self) -> std::ops::Range<u32> {
        self.start..self.start.saturating_add(self.size)
    }

    /// True when the two placements share a memory slice.
    pub(crate) fn overlaps(&self, other: &Placement) -> bool {
        self.start < other.start.saturating_add(other.size)
            && other.start < self.start.saturating_add(self.size)
    }
}

/// One GPU instance profile a GPU supports (e.g. `1g.5gb`), with its possible placements.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MigProfile {
    /// NVML's profile index (`NVML_GPU_INSTANCE_PROFILE_*`), used to create instances.
    pub(crate) index: u32,
    /// NVML's profile id (what instances report).
    pub(crate) id: u32,
    /// The profile's name without the `MIG ` prefix, e.g. `1g.5gb` or `1g.5gb+me`.
    pub(crate) name: String,
    /// Compute slices.
    pub(crate) slice_count: u32,
    /// Memory in MiB.
    pub(crate) memory_mib: u64,
    /// Streaming multiprocessors.
    pub(crate) multiprocessors: u32,
    /// Copy engines.
    pub(crate) copy_engines: u32,
    /// Video decoders.
    pub(crate) decoders: u32,
    /// Video encoders.
    pub(crate) encoders: u32,
    /// JPEG engines.
    pub(crate) jpeg_engines: u32,
    /// Optical flow accelerators.
    pub(crate) ofa_engines: u32,
    /// Where instances of the profile can be created, in memory slices.
    pub(crate) placements: Vec<Placement>,
}

/// One existing MIG device: a compute instance inside a GPU instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MigInstance {
    /// The GPU instance id.
    pub(crate) gi_id: u32,
    /// The compute instance id.
    pub(crate) ci_id: u32,
    /// The GPU instance's profile id.
    pub(crate) profile_id: u32,
    /// The GPU instance's placement.
    pub(crate) placement: Placement,
    /// Compute slices of the compute instance (equal to the profile's when it spans the whole
    /// GPU instance).
    pub(crate) ci_slice_count: u32,
    /// The MIG device's UUID (`MIG-...`), if NVML lists a MIG device for it.
    pub(crate) uuid: Option<String>,
}

/// One physical GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GpuInfo {
    /// NVML index.
    pub(crate) index: u32,
    /// `GPU-...` UUID.
    pub(crate) uuid: String,
    /// Minor number of `/dev/nvidia<minor>`.
    pub(crate) minor: u32,
    /// Product name, e.g. `NVIDIA A100-SXM4-40GB`.
    pub(crate) product_name: String,
    /// Brand, e.g. `Nvidia`, `Tesla`.
    pub(crate) brand: String,
    /// Architecture, e.g. `Ampere`.
    pub(crate) architecture: String,
    /// CUDA compute capability (major, minor).
    pub(crate) compute_capability: Option<(i32, i32)>,
    /// Total memory in bytes.
    pub(crate) memory_bytes: u64,
    /// PCI address in sysfs form, e.g. `0000:07:00.0`.
    pub(crate) pci_bus_id: String,
    /// The PCIe root complex, e.g. `pci0000:00`, when sysfs shows it.
    pub(crate) pcie_root: Option<String>,
    /// NUMA node, when known.
    pub(crate) numa_node: Option<i64>,
    /// Whether the GPU supports MIG.
    pub(crate) mig_capable: bool,
    /// Whether MIG mode is currently enabled.
    pub(crate) mig_enabled: bool,
    /// MIG profiles (empty unless MIG is enabled and asked for).
    pub(crate) profiles: Vec<MigProfile>,
    /// Existing MIG devices (empty unless MIG is enabled and asked for).
    pub(crate) instances: Vec<MigInstance>,
    /// PCI addresses (sysfs form) of the GPUs at the other end of active NVLinks, one entry per
    /// active link.
    pub(crate) nvlink_remotes: Vec<String>,
    /// PCI addresses (sysfs form) of the NVSwitches at the other end of active NVLinks, one
    /// entry per active link.
    pub(crate) nvswitch_remotes: Vec<String>,
}

/// The whole machine as NVML reported it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct MachineInfo {
    /// Driver version as NVML prints it, e.g. `550.54.15`.
    pub(crate) driver_version: Option<String>,
    /// CUDA driver version (major, minor).
    pub(crate) cuda_driver_version: Option<(i32, i32)>,
    /// The GPUs, by NVML index.
    pub(crate) gpus: Vec<GpuInfo>,
    /// Common-ancestor level between GPU `i` and `j` (indices into `gpus`), NVML's
    /// `nvmlGpuTopologyLevel_t` value (0 internal, 10 single switch, 20 multiple switches,
    /// 30 host bridge, 40 NUMA node, 50 system); `None` when NVML could not tell.
    pub(crate) ancestor_levels: Vec<Vec<Option<u32>>>,
}

/// Turns NVML's PCI bus id (`00000000:07:00.0`) into the sysfs form (`0000:07:00.0`): lowercase,
/// a domain of at least four digits.
pub(crate) fn normalize_bus_id(id: &str) -> String {
    let id = id.trim().to_ascii_lowercase();
    match id.split_once(':') {
        Some((domain, rest)) if rest.contains(':') => {
            let digits = domain.trim_start_matches('0');
            format!("{digits:0>4}:{rest}")
        }
        _ => id,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_ids_are_normalized_to_sysfs_form() {
        assert_eq!(normalize_bus_id("00000000:07:00.0"), "0000:07:00.0");
        assert_eq!(normalize_bus_id("0000:B7:00.0"), "0000:b7:00.0");
        assert_eq!(normalize_bus_id("00010000:01:00.0"), "10000:01:00.0");
        assert_eq!(normalize_bus_id("0001:01:00.0"), "0001:01:00.0");
    }

    #[test]
    fn placements_overlap_by_slices() {
        let p = |start, size| Placement { start, size };
        assert!(p(0, 4).overlaps(&p(3, 1)));
        assert!(!p(0, 4).overlaps(&p(4, 4)));
        assert!(p(4, 4).overlaps(&p(0, 8)));
        assert_eq!(p(2, 2).slices().collect::<Vec<_>>(), [2, 3]);
    }
}
