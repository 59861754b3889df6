//! Sample requests a policy must answer before it is accepted (by `check` and by
//! [`PolicyDir`](crate::dir::PolicyDir)): small realistic node layouts.

use std::collections::BTreeMap;

use kubedev_allocator::api::{self, Counter, DeviceAttribute, DeviceCapacity, RawQuantity};

use crate::input::{Candidate, CounterUsage, PolicyInput};

pub(crate) const DRIVER: &str = "gpu.example.com";
pub(crate) const POOL: &str = "node-a";

/// One sample request.
#[derive(Debug)]
pub(crate) struct Sample {
    pub(crate) name: &'static str,
    pub(crate) about: &'static str,
    pub(crate) count: usize,
    pub(crate) devices: Vec<api::Device>,
    pub(crate) in_use: Vec<&'static str>,
    pub(crate) usage: CounterUsage,
}

impl Sample {
    pub(crate) fn input(&self) -> PolicyInput<'_> {
        let candidates = self
            .devices
            .iter()
            .map(|d| {
                Candidate::published(DRIVER, POOL, d).with_in_use(self.in_use.contains(&&*d.name))
            })
            .collect();
        PolicyInput::new("default/sample", "gpus", self.count, candidates)
            .with_counter_usage(&self.usage)
    }
}

fn int(v: i64) -> DeviceAttribute {
    DeviceAttribute {
        int: Some(v),
        ..Default::default()
    }
}

fn string(v: &str) -> DeviceAttribute {
    DeviceAttribute {
        string: Some(v.to_string()),
        ..Default::default()
    }
}

fn version(v: &str) -> DeviceAttribute {
    DeviceAttribute {
        version: Some(v.to_string()),
        ..Default::default()
    }
}

/// A GPU with the attributes the example policies read: NUMA node, link group, PCIe root.
pub(crate) fn gpu(index: usize, numa: i64, link_group: i64, pcie_root: &str) -> api::Device {
    let mut attributes = BTreeMap::new();
    attributes.insert("index".to_string(), int(index as i64));
    attributes.insert("model".to_string(), string("X100-SXM"));
    attributes.insert("driverVersion".to_string(), version("550.54.15"));
    attributes.insert("linkGroup".to_string(), int(link_group));
    attributes.insert(crate::abi::NUMA_NODE_ATTRIBUTE.to_string(), int(numa));
    attributes.insert(
        "resource.kubernetes.io/pcieRoot".to_string(),
        string(pcie_root),
    );
    let mut capacity = BTreeMap::new();
    capacity.insert(
        "memory".to_string(),
        DeviceCapacity {
            value: RawQuantity::from("80Gi"),
            request_policy: None,
        },
    );
    api::Device {
        name: format!("gpu-{index}"),
        attributes,
        capacity,
        ..Default::default()
    }
}

/// `n` GPUs, NUMA nodes interleaved, link groups of 4 and two GPUs per PCIe root.
pub(crate) fn gpus(n: usize, numa_nodes: i64) -> Vec<api::Device> {
    (0..n)
        .map(|i| {
            gpu(
                i,
                i as i64 % numa_nodes,
                (i / 4) as i64,
                &format!("pci0000:{:02x}", i / 2),
            )
        })
        .collect()
}

fn partition(gpu: usize, name: &str, memory: &str) -> api::Device {
    let mut counters = BTreeMap::new();
    counters.insert(
        "memory".to_string(),
        Counter {
            value: RawQuantity::from(memory),
        },
    );
    let mut attributes = BTreeMap::new();
    attributes.insert("parentIndex".to_string(), int(gpu as i64));
    api::Device {
        name: format!("gpu-{gpu}-{name}"),
        attributes,
        consumes_counters: vec![api::DeviceCounterConsumption {
            counter_set: format!("gpu-{gpu}"),
            counters,
        }],
        ..Default::default()
    }
}

pub(crate) fn all() -> Vec<Sample> {
    let mut usage = CounterUsage::new();
    usage.add(DRIVER, POOL, "gpu-1");
    let parts = vec![
        partition(0, "whole", "40Gi"),
        partition(0, "a", "20Gi"),
        partition(0, "b", "20Gi"),
        partition(1, "whole", "40Gi"),
        partition(1, "a", "20Gi"),
        partition(1, "b", "20Gi"),
    ];
    vec![
        Sample {
            name: "gpus-8",
            about: "8 GPUs on 2 NUMA nodes, 2 link groups and 4 PCIe roots; gpu-1 in use",
            count: 2,
            devices: gpus(8, 2),
            in_use: vec!["gpu-1"],
            usage: CounterUsage::new(),
        },
        Sample {
            name: "partitions",
            about: "2 partitionable GPUs; gpu-1-a in use",
            count: 1,
            devices: parts,
            in_use: vec!["gpu-1-a"],
            usage,
        },
        Sample {
            name: "gpus-64",
            about: "64 GPUs on 8 NUMA nodes, 16 link groups and 32 PCIe roots",
            count: 8,
            devices: gpus(64, 8),
            in_use: Vec::new(),
            usage: CounterUsage::new(),
        },
    ]
}
