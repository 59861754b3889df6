//! How a machine's GPUs are connected: common-ancestor levels between pairs, and NVLink wiring
//! (NVSwitches and direct links).

use serde::{Deserialize, Serialize};

/// Common-ancestor levels between GPUs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Topology {
    /// Level of pairs no group names.
    #[serde(default = "TopologyLevel::system")]
    pub default: TopologyLevel,
    /// Groups of GPUs whose pairs share a level; later groups override earlier ones.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<TopologyGroup>,
}

impl Default for Topology {
    fn default() -> Self {
        Topology {
            default: TopologyLevel::System,
            groups: Vec::new(),
        }
    }
}

/// GPUs whose every pair has `level` as common ancestor.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TopologyGroup {
    /// GPU indices.
    pub gpus: Vec<u32>,
    /// Their common-ancestor level.
    pub level: TopologyLevel,
}

/// `nvmlGpuTopologyLevel_t` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[allow(missing_docs)]
pub enum TopologyLevel {
    Internal,
    Single,
    Multiple,
    Hostbridge,
    Node,
    System,
}

impl TopologyLevel {
    fn system() -> Self {
        TopologyLevel::System
    }

    /// The `nvmlGpuTopologyLevel_t` value.
    pub fn nvml_value(self) -> u32 {
        match self {
            TopologyLevel::Internal => 0,
            TopologyLevel::Single => 10,
            TopologyLevel::Multiple => 20,
            TopologyLevel::Hostbridge => 30,
            TopologyLevel::Node => 40,
            TopologyLevel::System => 50,
        }
    }
}

/// NVLink wiring.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NvLink {
    /// NVLink version of active links.
    pub version: u32,
    /// Links each GPU has (queries at or above it report an inactive link up to 18).
    pub max_links: u32,
    /// NVSwitch PCI bus ids.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub switches: Vec<String>,
    /// GPUs wired to the switches.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub switched: Option<SwitchedLinks>,
    /// Direct GPU-to-GPU links, numbered after the switched ones.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pairs: Vec<LinkPair>,
}

/// GPUs whose first `links_per_gpu` links go round-robin to the NVSwitches.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SwitchedLinks {
    /// GPU indices.
    pub gpus: Vec<u32>,
    /// Links of each GPU that go to switches.
    pub links_per_gpu: u32,
}

/// Direct links between two GPUs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LinkPair {
    /// The two GPU indices.
    pub gpus: [u32; 2],
    /// Number of links between them.
    pub links: u32,
}
