//! GPU-to-GPU topology, computed once per discovery: NVLink connections and PCIe common
//! ancestors.

use std::collections::BTreeMap;

use crate::snapshot::MachineInfo;

/// How two GPUs are connected through PCIe: NVML's common-ancestor levels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum PcieLevel {
    /// The same board (e.g. a dual-GPU card).
    Internal,
    /// Behind one PCIe switch.
    SingleSwitch,
    /// Behind several PCIe switches, without crossing the host bridge.
    MultipleSwitches,
    /// Through one host bridge.
    HostBridge,
    /// Through the CPU interconnect within one NUMA node.
    NumaNode,
    /// Across NUMA nodes (SMP interconnect).
    System,
}

impl PcieLevel {
    /// From NVML's `nvmlGpuTopologyLevel_t` value.
    pub(crate) fn from_nvml(level: u32) -> Option<PcieLevel> {
        Some(match level {
            0 => PcieLevel::Internal,
            10 => PcieLevel::SingleSwitch,
            20 => PcieLevel::MultipleSwitches,
            30 => PcieLevel::HostBridge,
            40 => PcieLevel::NumaNode,
            50 => PcieLevel::System,
            _ => return None,
        })
    }

    /// The name `nvidia-smi topo -m` uses: `BOARD`, `PIX`, `PXB`, `PHB`, `NODE`, `SYS`.
    pub fn short_name(&self) -> &'static str {
        match self {
            PcieLevel::Internal => "BOARD",
            PcieLevel::SingleSwitch => "PIX",
            PcieLevel::MultipleSwitches => "PXB",
            PcieLevel::HostBridge => "PHB",
            PcieLevel::NumaNode => "NODE",
            PcieLevel::System => "SYS",
        }
    }
}

/// The connections between the node's GPUs, as discovered; indices are NVML GPU indices.
///
/// Policies and preferred-allocation code read this instead of asking NVML per request.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Topology {
    /// GPU UUIDs by position; `nvlinks` and `pcie` are indexed the same way.
    pub gpus: Vec<String>,
    /// `nvlinks[i][j]`: the NVLinks between GPU `i` and GPU `j`: direct links, plus, when both
    /// are attached to a common NVSwitch, the smaller of their two switch-link counts (the
    /// links a transfer between them can use).
    pub nvlinks: Vec<Vec<u32>>,
    /// `pcie[i][j]`: how GPU `i` and GPU `j` meet on PCIe (`None` on the diagonal and when NVML
    /// could not tell).
    pub pcie: Vec<Vec<Option<PcieLevel>>>,
    /// `nvlink_group[i]`: the smallest NVML index among the GPUs reachable from GPU `i` over
    /// NVLink (GPU `i`'s own index when it has no NVLink peer).
    pub nvlink_group: Vec<u32>,
    /// `pcie_switch_group[i]`: the smallest NVML index among the GPUs reachable from GPU `i`
    /// through PCIe switches only (`PIX`/`PXB` or on the same board); GPU `i`'s own index when
    /// none is.
    pub pcie_switch_group: Vec<u32>,
}

impl Topology {
    /// The number of GPUs GPU `i` has an NVLink to.
    pub fn nvlink_peer_count(&self, i: usize) -> usize {
        self.nvlinks
            .get(i)
            .map_or(0, |row| row.iter().filter(|&&n| n > 0).count())
    }

    /// Builds the topology from what NVML reported.
    pub(crate) fn from_machine(machine: &MachineInfo) -> Topology {
        let n = machine.gpus.len();
        let by_bus: BTreeMap<&str, usize> = machine
            .gpus
            .iter()
            .enumerate()
            .map(|(i, g)| (g.pci_bus_id.as_str(), i))
            .collect();
        let mut nvlinks = vec![vec![0u32; n]; n];
        for (i, g) in machine.gpus.iter().enumerate() {
            for remote in &g.nvlink_remotes {
                // A link to an NVSwitch or a CPU has a remote that is no GPU of ours: it says
                // nothing about GPU pairs.
                if let Some(&j) = by_bus.get(remote.as_str())
                    && j != i
                {
                    nvlinks[i][j] += 1;
                }
            }
        }
        // NVML reports a link from both ends; trust either end.
        let mut symmetric = nvlinks.clone();
        for (i, row) in symmetric.iter_mut().enumerate() {
            for (j, cell) in row.iter_mut().enumerate() {
                *cell = nvlinks[i][j].max(nvlinks[j][i]);
            }
        }
        let mut nvlinks = symmetric;
        // GPUs on a common NVSwitch reach each other through it.
        for (i, a) in machine.gpus.iter().enumerate() {
            for (j, b) in machine.gpus.iter().enumerate() {
                if i != j
                    && a.nvswitch_remotes
                        .iter()
                        .any(|s| b.nvswitch_remotes.contains(s))
                {
                    let links =
                        u32::try_from(a.nvswitch_remotes.len().min(b.nvswitch_remotes.len()))
                            .unwrap_or(u32::MAX);
                    nvlinks[i][j] = nvlinks[i][j].saturating_add(links);
                }
            }
        }
        let mut pcie = vec![vec![None; n]; n];
        for (i, row) in pcie.iter_mut().enumerate() {
            for (j, cell) in row.iter_mut().enumerate() {
                if i == j {
                    continue;
                }
                let a = level_at(machine, i, j);
                let b = level_at(machine, j, i);
                *cell = a.or(b);
            }
        }
        let indices: Vec<u32> = machine.gpus.iter().map(|g| g.index).collect();
        let nvlink_group = components(&indices, |i, j| nvlinks[i][j] > 0);
        let pcie_switch_group = components(&indices, |i, j| {
            matches!(
                pcie[i][j],
                Some(PcieLevel::Internal | PcieLevel::SingleSwitch | PcieLevel::MultipleSwitches)
            )
        });
        Topology {
            gpus: machine.gpus.iter().map(|g| g.uuid.clone()).collect(),
            nvlinks,
            pcie,
            nvlink_group,
            pcie_switch_group,
        }
    }
}

fn level_at(machine: &MachineInfo, i: usize, j: usize) -> Option<PcieLevel> {
    machine
        .ancestor_levels
        .get(i)
        .and_then(|row| row.get(j))
        .copied()
        .flatten()
        .and_then(PcieLevel::from_nvml)
}

/// Connected components of the graph `linked`, each labelled with its smallest index.
fn components(indices: &[u32], linked: impl Fn(usize, usize) -> bool) -> Vec<u32> {
    let n = indices.len();
    let mut label: Vec<Option<u32>> = vec![None; n];
    for start in 0..n {
        if label[start].is_some() {
            continue;
        }
        let mut members = vec![start];
        let mut stack = vec![start];
        let mut seen = vec![false; n];
        seen[start] = true;
        while let Some(i) = stack.pop() {
            for (j, seen_j) in seen.iter_mut().enumerate() {
                if !*seen_j && linked(i, j) {
                    *seen_j = true;
                    members.push(j);
                    stack.push(j);
                }
            }
        }
        let min = members
            .iter()
            .map(|&m| indices[m])
            .min()
            .unwrap_or(indices[start]);
        for m in members {
            label[m] = Some(min);
        }
    }
    label
        .into_iter()
        .zip(indices)
        .map(|(l, &own)| l.unwrap_or(own))
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
pub(crate) mod tests {
    use super::*;
    use crate::snapshot::GpuInfo;

    pub(crate) fn gpu(index: u32, bus: &str, remotes: &[&str]) -> GpuInfo {
        GpuInfo {
            index,
            uuid: format!("GPU-{index:08}"),
            minor: index,
            product_name: "NVIDIA A100-SXM4-40GB".into(),
            brand: "Nvidia".into(),
            architecture: "Ampere".into(),
            compute_capability: Some((8, 0)),
            memory_bytes: 40 << 30,
            pci_bus_id: bus.into(),
            pcie_root: None,
            numa_node: Some(i64::from(index / 4)),
            mig_capable: true,
            mig_enabled: false,
            profiles: vec![],
            instances: vec![],
            nvlink_remotes: remotes.iter().map(|s| s.to_string()).collect(),
            nvswitch_remotes: vec![],
        }
    }

    #[test]
    fn nvlink_groups_are_connected_components() {
        // 0-1 linked (reported from one end only, twice), 2-3 linked, 4 alone, 5 links to an
        // NVSwitch only.
        let machine = MachineInfo {
            gpus: vec![
                gpu(0, "0000:01:00.0", &["0000:02:00.0", "0000:02:00.0"]),
                gpu(1, "0000:02:00.0", &[]),
                gpu(2, "0000:03:00.0", &["0000:04:00.0"]),
                gpu(3, "0000:04:00.0", &["0000:03:00.0"]),
                gpu(4, "0000:05:00.0", &[]),
                gpu(5, "0000:06:00.0", &["0000:99:00.0"]),
            ],
            ancestor_levels: vec![
                vec![None, Some(10), Some(30), Some(50), None, None],
                vec![Some(10), None, None, None, None, None],
            ],
            ..MachineInfo::default()
        };
        let t = Topology::from_machine(&machine);
        assert_eq!(t.nvlink_group, [0, 0, 2, 2, 4, 5]);
        assert_eq!(t.nvlinks[1][0], 2);
        assert_eq!(t.nvlink_peer_count(0), 1);
        assert_eq!(t.nvlink_peer_count(4), 0);
        assert_eq!(t.nvlink_peer_count(5), 0);
        assert_eq!(t.pcie[0][1], Some(PcieLevel::SingleSwitch));
        assert_eq!(t.pcie[2][0], Some(PcieLevel::HostBridge), "symmetric");
        assert_eq!(t.pcie[0][3].map(|l| l.short_name()), Some("SYS"));
        assert_eq!(t.pcie_switch_group, [0, 0, 2, 3, 4, 5]);
    }

    #[test]
    fn gpus_on_a_common_nvswitch_are_one_group() {
        let mut machine = MachineInfo {
            gpus: (0..4)
                .map(|i| gpu(i, &format!("0000:0{i}:00.0"), &[]))
                .collect(),
            ..MachineInfo::default()
        };
        for g in &mut machine.gpus[..3] {
            g.nvswitch_remotes = vec!["0000:c4:00.0".into(), "0000:c5:00.0".into()];
        }
        machine.gpus[2].nvswitch_remotes.pop();
        let t = Topology::from_machine(&machine);
        assert_eq!(t.nvlink_group, [0, 0, 0, 3]);
        assert_eq!(t.nvlinks[0][1], 2);
        assert_eq!(t.nvlinks[0][2], 1);
        assert_eq!(t.nvlink_peer_count(0), 2);
        assert_eq!(t.nvlink_peer_count(3), 0);
    }
}
