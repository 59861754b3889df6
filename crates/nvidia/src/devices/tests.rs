//! Tests of the device model: names, attributes, static and partitionable MIG, counters, replicas.

use super::*;
use crate::topology::tests::gpu;

/// The A100-40GB MIG profiles and placements as NVML reports them.
pub(crate) fn a100_profiles() -> Vec<MigProfile> {
    let p =
        |index, id, name: &str, slices, mem, sm, ce, dec, jpg, ofa, pl: &[(u32, u32)]| MigProfile {
            index,
            id,
            name: name.into(),
            slice_count: slices,
            memory_mib: mem,
            multiprocessors: sm,
            copy_engines: ce,
            decoders: dec,
            encoders: 0,
            jpeg_engines: jpg,
            ofa_engines: ofa,
            placements: pl
                .iter()
                .map(|&(start, size)| Placement { start, size })
                .collect(),
        };
    let ones: Vec<(u32, u32)> = (0..7).map(|s| (s, 1)).collect();
    vec![
        p(0, 19, "1g.5gb", 1, 4864, 14, 1, 0, 0, 0, &ones),
        p(
            1,
            14,
            "2g.10gb",
            2,
            9856,
            28,
            2,
            1,
            0,
            0,
            &[(0, 2), (2, 2), (4, 2)],
        ),
        p(2, 9, "3g.20gb", 3, 19968, 42, 3, 2, 0, 0, &[(0, 4), (4, 4)]),
        p(3, 5, "4g.20gb", 4, 19968, 56, 4, 2, 0, 0, &[(0, 4)]),
        p(4, 0, "7g.40gb", 7, 40192, 98, 7, 5, 1, 1, &[(0, 8)]),
        p(7, 20, "1g.5gb+me", 1, 4864, 14, 1, 1, 1, 1, &ones),
        p(
            9,
            15,
            "1g.10gb",
            1,
            9856,
            14,
            1,
            1,
            0,
            0,
            &[(0, 2), (2, 2), (4, 2), (6, 2)],
        ),
    ]
}

pub(crate) fn machine(n: u32, mig: bool) -> MachineInfo {
    let gpus = (0..n)
        .map(|i| {
            let mut g = gpu(i, &format!("0000:{:02x}:00.0", i + 1), &[]);
            g.mig_enabled = mig;
            g.profiles = if mig { a100_profiles() } else { vec![] };
            g
        })
        .collect();
    MachineInfo {
        driver_version: Some("535.104.05".into()),
        cuda_driver_version: Some((12, 2)),
        gpus,
        ancestor_levels: vec![],
    }
}

fn build(config: &NvidiaConfig, m: &MachineInfo) -> Built {
    let t = Topology::from_machine(m);
    let (built, errors) = build_pool(
        PoolName::new("node-a-nvidia").unwrap(),
        config,
        m,
        &t,
        &|_, _| Health::healthy(),
        &Owned::new(),
    );
    assert!(errors.is_empty(), "{errors:?}");
    built.pool.validate().unwrap();
    built
}

fn s(d: &Device, id: &str) -> Option<AttributeValue> {
    d.attribute(&format!("{DOMAIN}/{id}")).cloned()
}

#[test]
fn attribute_names_are_valid() {
    for id in [
        attr::TYPE,
        attr::UUID,
        attr::INDEX,
        attr::MINOR,
        attr::PRODUCT_NAME,
        attr::BRAND,
        attr::ARCHITECTURE,
        attr::CUDA_COMPUTE_CAPABILITY,
        attr::DRIVER_VERSION,
        attr::CUDA_DRIVER_VERSION,
        attr::PCIE_BUS_ID,
        attr::MIG_CAPABLE,
        attr::MIG_ENABLED,
        attr::NVLINK_GROUP,
        attr::NVLINK_PEERS,
        attr::PCIE_SWITCH_GROUP,
        attr::PARENT_UUID,
        attr::PARENT_INDEX,
        attr::PROFILE,
        attr::PLACEMENT_START,
        attr::PLACEMENT_SIZE,
        attr::GPU_INSTANCE_ID,
        attr::COMPUTE_INSTANCE_ID,
        attr::REPLICA,
        "copyEngines",
        "jpegEngines",
        "ofaEngines",
    ] {
        QualifiedName::new(format!("{DOMAIN}/{id}")).unwrap();
    }
    QualifiedName::new(STANDARD_PCI_BUS_ID).unwrap();
    QualifiedName::new(STANDARD_PCIE_ROOT).unwrap();
    for c in [
        counters::MULTIPROCESSORS,
        counters::COPY_ENGINES,
        counters::DECODERS,
        counters::ENCODERS,
        counters::JPEG_ENGINES,
        counters::OFA_ENGINES,
        counters::MEMORY,
        "memory-slice-15",
        "gpu-63-counters",
    ] {
        CounterName::new(c).unwrap();
    }
}

#[test]
fn versions_and_labels() {
    let v = |s| loose_version(s).map(|v| v.to_string());
    assert_eq!(v("535.104.05").as_deref(), Some("535.104.5"));
    assert_eq!(v("560.28").as_deref(), Some("560.28.0"));
    assert_eq!(v("8.0").as_deref(), Some("8.0.0"));
    assert_eq!(v("r550"), None);
    assert_eq!(v("1.2.3.4"), None);
    assert_eq!(profile_label("1g.5gb"), "1g5gb");
    assert_eq!(profile_label("1g.5gb+me"), "1g5gb-me");
    assert_eq!(profile_label("1c.3g.20gb"), "1c3g20gb");
    assert_eq!(profile_label("1g.24gb-me"), "1g24gb-me");
    assert_eq!(profile_label("1g.10gb+gfx"), "1g10gb-gfx");
}

#[test]
fn whole_gpus_carry_identity_versions_and_memory() {
    let b = build(&NvidiaConfig::default(), &machine(2, false));
    assert_eq!(b.pool.devices.len(), 2);
    let d = &b.pool.devices[1];
    assert_eq!(d.name.as_str(), "gpu-1");
    assert_eq!(s(d, attr::TYPE), Some(AttributeValue::String("gpu".into())));
    assert_eq!(s(d, attr::INDEX), Some(AttributeValue::Int(1)));
    assert_eq!(
        s(d, attr::DRIVER_VERSION).map(|v| v.to_string()).as_deref(),
        Some("535.104.5")
    );
    assert_eq!(
        s(d, attr::CUDA_DRIVER_VERSION)
            .map(|v| v.to_string())
            .as_deref(),
        Some("12.2.0")
    );
    assert_eq!(
        d.attribute(STANDARD_PCI_BUS_ID),
        Some(&AttributeValue::String("0000:02:00.0".into()))
    );
    assert_eq!(s(d, attr::NVLINK_GROUP), Some(AttributeValue::Int(1)));
    assert_eq!(
        d.capacity[&q("memory")].value,
        Quantity::parse("40Gi").unwrap()
    );
    assert_eq!(d.numa_node, Some(0));
    assert!(d.consumes_counters.is_empty());
    assert!(b.pool.shared_counters.is_empty());
    // Kubernetes allows 32 attributes and capacities per device (the publisher adds the
    // NUMA node).
    assert!(d.attributes.len() + d.capacity.len() < 32);
}

#[test]
fn replicas_advertise_each_gpu_n_times() {
    let config = NvidiaConfig {
        replicas: 3,
        ..NvidiaConfig::default()
    };
    let b = build(&config, &machine(2, false));
    let names: Vec<_> = b.pool.devices.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "gpu-0-replica-0",
            "gpu-0-replica-1",
            "gpu-0-replica-2",
            "gpu-1-replica-0",
            "gpu-1-replica-1",
            "gpu-1-replica-2"
        ]
    );
    assert_eq!(
        s(&b.pool.devices[4], attr::REPLICA),
        Some(AttributeValue::Int(1))
    );
    assert_eq!(b.kinds[&b.pool.devices[4].name], DeviceKind::Gpu { gpu: 1 });
}

fn consumption(d: &Device) -> BTreeMap<String, i64> {
    d.consumes_counters
        .iter()
        .flat_map(|c| c.counters.iter())
        .map(|(k, v)| (k.to_string(), v.as_i64().unwrap()))
        .collect()
}

#[test]
fn partition_model_has_every_placement_and_consistent_counters() {
    let config = NvidiaConfig {
        mig_strategy: MigStrategy::Partitionable,
        ..NvidiaConfig::default()
    };
    let b = build(&config, &machine(1, true));
    let names: Vec<_> = b.pool.devices.iter().map(|d| d.name.as_str()).collect();
    // 1 whole GPU + 7 (1g.5gb) + 3 (2g.10gb) + 2 (3g.20gb) + 1 (4g.20gb) + 1 (7g.40gb)
    // + 7 (1g.5gb+me) + 4 (1g.10gb).
    assert_eq!(names.len(), 26, "{names:?}");
    assert!(names.contains(&"gpu-0-mig-1g5gb-6"));
    assert!(!names.contains(&"gpu-0-mig-1g5gb-7"));
    assert!(names.contains(&"gpu-0-mig-1g5gb-me-0"));
    assert!(names.contains(&"gpu-0-mig-3g20gb-4"));
    assert!(names.contains(&"gpu-0-mig-7g40gb-0"));
    assert_eq!(b.pool.shared_counters.len(), 1);
    let set = &b.pool.shared_counters[0];
    assert_eq!(set.name.as_str(), "gpu-0-counters");
    let totals: BTreeMap<String, i64> = set
        .counters
        .iter()
        .map(|(k, v)| (k.to_string(), v.as_i64().unwrap()))
        .collect();
    assert_eq!(totals["memory-slice-7"], 1);
    assert_eq!(totals["multiprocessors"], 98);
    assert_eq!(totals["memory"], 40192 << 20);
    // The whole GPU consumes exactly the totals.
    let whole = b.pool.device("gpu-0").unwrap();
    assert_eq!(consumption(whole), totals);
    // Each placement consumes its own slices and its profile's engines and memory.
    let p = b.pool.device("gpu-0-mig-3g20gb-4").unwrap();
    let c = consumption(p);
    let slices: Vec<_> = c
        .keys()
        .filter(|k| k.starts_with("memory-slice-"))
        .cloned()
        .collect();
    assert_eq!(
        slices,
        [
            "memory-slice-4",
            "memory-slice-5",
            "memory-slice-6",
            "memory-slice-7"
        ]
    );
    assert_eq!(c["multiprocessors"], 42);
    assert_eq!(c["memory"], 19968 << 20);
    for d in &b.pool.devices {
        for (k, v) in consumption(d) {
            assert!(v <= totals[&k], "{} consumes {k}={v}", d.name);
        }
    }
}

/// Every set of placements the counters admit is a set of disjoint placements, and every
/// set of disjoint placements whose engines fit is admitted: checked over all pairs and
/// triples of the A100 model.
#[test]
fn counters_admit_exactly_the_non_overlapping_placements() {
    let config = NvidiaConfig {
        mig_strategy: MigStrategy::Partitionable,
        ..NvidiaConfig::default()
    };
    let b = build(&config, &machine(1, true));
    let set = &b.pool.shared_counters[0];
    let fits = |devs: &[&Device]| {
        set.counters.iter().all(|(k, total)| {
            let used: i64 = devs
                .iter()
                .flat_map(|d| d.consumes_counters.iter())
                .filter_map(|c| c.counters.get(k))
                .map(|v| v.as_i64().unwrap())
                .sum();
            used <= total.as_i64().unwrap()
        })
    };
    let placement = |d: &Device| match &b.kinds[&d.name] {
        DeviceKind::Placement { placement, .. } => Some(*placement),
        _ => None,
    };
    let parts: Vec<&Device> = b
        .pool
        .devices
        .iter()
        .filter(|d| placement(d).is_some())
        .collect();
    // Physically, two A100 instances coexist when their memory slices are disjoint and at
    // most one of them holds the media engines (`+me`).
    let media = |d: &Device| d.name.as_str().contains("-me-");
    let mut checked = 0;
    for i in 0..parts.len() {
        for j in i + 1..parts.len() {
            let (a, c) = (placement(parts[i]).unwrap(), placement(parts[j]).unwrap());
            let both_media = media(parts[i]) && media(parts[j]);
            let physical = !(a.overlaps(&c) || both_media);
            assert_eq!(
                fits(&[parts[i], parts[j]]),
                physical,
                "{} with {}",
                parts[i].name,
                parts[j].name
            );
            checked += 1;
        }
    }
    assert_eq!(checked, 25 * 24 / 2);
    // Seven 1g.5gb fit; an eighth 1-slice placement of another profile does not.
    let sevens: Vec<&Device> = (0..7)
        .map(|s| b.pool.device(&format!("gpu-0-mig-1g5gb-{s}")).unwrap())
        .collect();
    assert!(fits(&sevens));
    let whole = b.pool.device("gpu-0").unwrap();
    assert!(!fits(&[whole, sevens[0]]));
    let mut more = sevens.clone();
    more.push(b.pool.device("gpu-0-mig-1g10gb-6").unwrap());
    assert!(!fits(&more));
    // 3g.20gb at 0 and 4 together fill the GPU.
    let halves = [
        b.pool.device("gpu-0-mig-3g20gb-0").unwrap(),
        b.pool.device("gpu-0-mig-3g20gb-4").unwrap(),
    ];
    assert!(fits(&halves));
    // 4g.20gb + 3g.20gb at 4 fits (7 compute slices).
    assert!(fits(&[
        b.pool.device("gpu-0-mig-4g20gb-0").unwrap(),
        b.pool.device("gpu-0-mig-3g20gb-4").unwrap()
    ]));
}

#[test]
fn foreign_instances_are_static_devices_and_block_their_slices() {
    let config = NvidiaConfig {
        mig_strategy: MigStrategy::Partitionable,
        ..NvidiaConfig::default()
    };
    let mut m = machine(1, true);
    m.gpus[0].instances.push(MigInstance {
        gi_id: 1,
        ci_id: 0,
        profile_id: 9,
        placement: Placement { start: 0, size: 4 },
        ci_slice_count: 3,
        uuid: Some("MIG-aaaa".into()),
    });
    let b = build(&config, &m);
    assert!(b.pool.device("gpu-0").is_none(), "whole GPU is withheld");
    let st = b.pool.device("gpu-0-mig-3g20gb-0").unwrap();
    assert!(st.consumes_counters.is_empty());
    assert_eq!(
        s(st, attr::UUID),
        Some(AttributeValue::String("MIG-aaaa".into()))
    );
    assert!(b.pool.device("gpu-0-mig-1g5gb-3").is_none());
    assert!(b.pool.device("gpu-0-mig-1g5gb-4").is_some());
    assert!(b.pool.device("gpu-0-mig-3g20gb-4").is_some());
    // The same instance, created by kubedev for a claim, stays a placement device.
    let t = Topology::from_machine(&m);
    let owned = Owned::from([(
        (m.gpus[0].uuid.clone(), Placement { start: 0, size: 4 }),
        Some(1),
    )]);
    let (b, errors) = build_pool(
        PoolName::new("p").unwrap(),
        &config,
        &m,
        &t,
        &|_, _| Health::healthy(),
        &owned,
    );
    assert!(errors.is_empty());
    let d = b.pool.device("gpu-0-mig-3g20gb-0").unwrap();
    assert_eq!(d.consumes_counters.len(), 1);
    assert!(b.pool.device("gpu-0").is_some());
}

#[test]
fn static_strategy_lists_instances_and_not_the_gpu() {
    let config = NvidiaConfig {
        mig_strategy: MigStrategy::Static,
        ..NvidiaConfig::default()
    };
    let mut m = machine(2, true);
    m.gpus[1].mig_enabled = false;
    for (i, s) in [0u32, 1].into_iter().enumerate() {
        m.gpus[0].instances.push(MigInstance {
            gi_id: 7 + i as u32,
            ci_id: 0,
            profile_id: 19,
            placement: Placement { start: s, size: 1 },
            ci_slice_count: 1,
            uuid: Some(format!("MIG-{i}")),
        });
    }
    let b = build(&config, &m);
    let names: Vec<_> = b.pool.devices.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, ["gpu-0-mig-1g5gb-0", "gpu-0-mig-1g5gb-1", "gpu-1"]);
    let d = &b.pool.devices[1];
    assert_eq!(s(d, attr::TYPE), Some(AttributeValue::String("mig".into())));
    assert_eq!(s(d, attr::GPU_INSTANCE_ID), Some(AttributeValue::Int(8)));
    assert_eq!(
        s(d, attr::PARENT_UUID),
        Some(AttributeValue::String(m.gpus[0].uuid.clone()))
    );
    assert_eq!(
        d.capacity[&q("memory")].value,
        Quantity::parse("4864Mi").unwrap()
    );
    assert!(d.attributes.len() + d.capacity.len() < 32);
}

#[test]
fn health_applies_to_every_device_of_a_gpu() {
    let m = machine(2, false);
    let t = Topology::from_machine(&m);
    let bad = m.gpus[1].uuid.clone();
    let (b, _) = build_pool(
        PoolName::new("p").unwrap(),
        &NvidiaConfig::default(),
        &m,
        &t,
        &|u, _| {
            if u == bad {
                Health::unhealthy("Xid 79")
            } else {
                Health::healthy()
            }
        },
        &Owned::new(),
    );
    assert!(b.pool.devices[0].health.is_healthy());
    assert_eq!(b.pool.devices[1].health.reason.as_deref(), Some("Xid 79"));
}
