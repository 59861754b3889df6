//! Both counter layouts: Kubernetes 1.34's counter sets with their devices and its limits named,
//! counter sets in slices of their own, and consumed counters bounded per slice.

use super::*;

/// `gpus` GPUs as partitionable MIG publishes them: a set of `counters` counters each, the
/// whole GPU consuming all of them and `parts` partitions consuming one each; then `plain`
/// devices that consume nothing.
fn partitioned_gpus(gpus: usize, counters: usize, parts: usize, plain_devices: usize) -> Pool {
    let mut pool = pool_of(Vec::new());
    let all = |n: usize| -> BTreeMap<CounterName, Quantity> {
        (0..n)
            .map(|c| {
                (
                    CounterName::new(format!("c{c}")).unwrap(),
                    Quantity::parse("1").unwrap(),
                )
            })
            .collect()
    };
    for g in 0..gpus {
        let set = CounterName::new(format!("gpu-{g}-counters")).unwrap();
        pool.shared_counters
            .push(CounterSet::new(set.clone(), all(counters)));
        let mut whole = Device::new(DeviceName::new(format!("gpu-{g}")).unwrap());
        whole
            .consumes_counters
            .push(CounterConsumption::new(set.clone(), all(counters)));
        pool.devices.push(whole);
        for p in 0..parts {
            let mut d = Device::new(DeviceName::new(format!("gpu-{g}-part-{p}")).unwrap());
            d.consumes_counters
                .push(CounterConsumption::new(set.clone(), all(1)));
            pool.devices.push(d);
        }
    }
    for i in 0..plain_devices {
        pool.devices.push(plain(1000 + i));
    }
    pool
}

fn same_slice(pool: Pool) -> Result<DesiredPool, Error> {
    desired_pools_in(
        &Inventory::new(vec![pool]),
        &driver(),
        CounterLayout::SameSlice,
    )
    .map(|mut p| p.remove(0))
}

#[test]
fn kubernetes_1_34_gets_each_counter_set_with_its_devices() {
    // 8 GPUs of 15 counters (the NVIDIA backend's MIG model), 19 partitions each, then 3
    // plain devices: two GPUs per slice (30 of the 32 counters 1.34 allows).
    let pool = same_slice(partitioned_gpus(8, 15, 19, 3)).unwrap();
    let shape: Vec<(usize, usize)> = pool
        .slices
        .iter()
        .map(|s| (s.shared_counters.len(), s.devices.len()))
        .collect();
    assert_eq!(shape, vec![(2, 40), (2, 40), (2, 40), (2, 40), (0, 3)]);
    for slice in &pool.slices {
        let sets: Vec<&str> = slice
            .shared_counters
            .iter()
            .map(|s| s.name.as_str())
            .collect();
        for d in &slice.devices {
            for c in d.consumes_counters.iter().flatten() {
                assert!(
                    sets.contains(&c.counter_set.as_str()),
                    "{} consumes {} outside its slice",
                    d.name,
                    c.counter_set
                );
            }
        }
    }
    // The same pool in the later layout: counter sets in a slice of their own.
    let later = one_pool(partitioned_gpus(8, 15, 19, 3));
    assert!(
        later
            .slices
            .iter()
            .all(|s| s.devices.is_empty() || s.shared_counters.is_empty())
    );
}

#[test]
fn kubernetes_1_34_limits_are_named() {
    // A device joining two sets of 20 counters: 40 counters would have to share a slice.
    let mut pool = partitioned_gpus(2, 20, 0, 0);
    pool.devices.clear();
    let mut joint = plain(0);
    for g in 0..2 {
        joint.consumes_counters.push(CounterConsumption::new(
            CounterName::new(format!("gpu-{g}-counters")).unwrap(),
            [(
                CounterName::new("c0").unwrap(),
                Quantity::parse("1").unwrap(),
            )]
            .into(),
        ));
    }
    pool.devices.push(joint);
    let err = same_slice(pool).unwrap_err().to_string();
    assert!(
        err.contains("40 counters")
            && err.contains("Kubernetes 1.34 allows")
            && err.contains("gpu-0-counters, gpu-1-counters"),
        "{err}"
    );
    let mut pool = pool_of((0..1).map(plain).collect());
    for i in 0..5 {
        pool.devices[0].taints.push(Taint::new(
            format!("example.com/t{i}"),
            TaintEffect::NoSchedule,
        ));
    }
    let err = same_slice(pool.clone()).unwrap_err().to_string();
    assert!(err.contains("5 taints") && err.contains("1.34"), "{err}");
    // The later layout allows 16.
    assert!(
        desired_pools(
            &Inventory::new(vec![pool]),
            &driver(),
            UnhealthyDevices::Omit
        )
        .is_ok()
    );
    // 65 partitions of one GPU cannot share a slice with their counter set.
    let err = same_slice(partitioned_gpus(1, 2, 64, 0))
        .unwrap_err()
        .to_string();
    assert!(err.contains("65 devices"), "{err}");
}

#[test]
fn counter_sets_go_in_slices_of_their_own_eight_at_most() {
    let pool = one_pool(counter_pool(10, 70));
    assert_eq!(sizes(&pool), vec![64, 6, 0, 0]);
    let sets: Vec<usize> = pool
        .slices
        .iter()
        .map(|s| s.shared_counters.len())
        .collect();
    assert_eq!(sets, vec![0, 0, 8, 2]);
    let set = &pool.slices[2].shared_counters[0];
    assert_eq!(set.name, "set-0");
    assert_eq!(set.counters["memory"].value.0, "40Gi");
    let consumed = pool.slices[0].devices[0]
        .consumes_counters
        .as_ref()
        .unwrap();
    assert_eq!(consumed[0].counter_set, "set-0");
    assert_eq!(consumed[0].counters["memory"].value.0, "5Gi");
}

#[test]
fn consumed_counters_per_slice_are_bounded() {
    // 40 devices consuming 2 x 32 counters each: 64 per device, 16 devices per 1024.
    let mut pool = pool_of(Vec::new());
    for s in 0..2 {
        pool.shared_counters.push(CounterSet::new(
            CounterName::new(format!("set-{s}")).unwrap(),
            (0..32)
                .map(|c| {
                    (
                        CounterName::new(format!("c{c}")).unwrap(),
                        Quantity::parse("1").unwrap(),
                    )
                })
                .collect(),
        ));
    }
    for i in 0..40 {
        let mut d = plain(i);
        for s in 0..2 {
            d.consumes_counters.push(CounterConsumption::new(
                CounterName::new(format!("set-{s}")).unwrap(),
                (0..32)
                    .map(|c| {
                        (
                            CounterName::new(format!("c{c}")).unwrap(),
                            Quantity::parse("1").unwrap(),
                        )
                    })
                    .collect(),
            ));
        }
        pool.devices.push(d);
    }
    assert_eq!(sizes(&one_pool(pool)), vec![16, 16, 8, 0]);
}
