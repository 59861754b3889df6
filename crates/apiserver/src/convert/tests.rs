//! Tests of the inventory-to-ResourceSlice mapping: chunking, both counter layouts, the device
//! shape, NUMA, unhealthy devices and the limits' messages.

use std::collections::BTreeMap;

use kubedev_core::{
    AttributeValue, CounterConsumption, CounterName, CounterSet, Device, DeviceName, Health,
    PoolName, QualifiedName, Quantity, Taint, TaintEffect,
};

use super::*;

mod chunking;
mod counters;
mod device_shape;
mod health;

fn driver() -> DriverName {
    DriverName::new("gpu.example.com").unwrap()
}

fn plain(i: usize) -> Device {
    Device::new(DeviceName::new(format!("dev-{i}")).unwrap())
}

fn tainted(i: usize) -> Device {
    let mut d = plain(i);
    d.taints.push(Taint::new(
        "example.com/maintenance",
        TaintEffect::NoSchedule,
    ));
    d
}

fn pool_of(devices: Vec<Device>) -> Pool {
    Pool::new(PoolName::new("node-a").unwrap(), devices)
}

fn sizes(pool: &DesiredPool) -> Vec<usize> {
    pool.slices.iter().map(|s| s.devices.len()).collect()
}

fn one_pool(pool: Pool) -> DesiredPool {
    desired_pools(
        &Inventory::new(vec![pool]),
        &driver(),
        UnhealthyDevices::Omit,
    )
    .unwrap()
    .remove(0)
}

fn counter_pool(sets: usize, consuming_devices: usize) -> Pool {
    let mut pool = pool_of(Vec::new());
    for s in 0..sets {
        pool.shared_counters.push(CounterSet::new(
            CounterName::new(format!("set-{s}")).unwrap(),
            [(
                CounterName::new("memory").unwrap(),
                Quantity::parse("40Gi").unwrap(),
            )]
            .into_iter()
            .collect(),
        ));
    }
    for i in 0..consuming_devices {
        let mut d = plain(i);
        d.consumes_counters.push(CounterConsumption::new(
            CounterName::new("set-0").unwrap(),
            [(
                CounterName::new("memory").unwrap(),
                Quantity::parse("5Gi").unwrap(),
            )]
            .into_iter()
            .collect(),
        ));
        pool.devices.push(d);
    }
    pool
}
