//! Mediated devices on the fake vGPU host: discovery, attributes, prepare, the type manager.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;

use common::{alloc, attrs, backend, claim, names, table};
use kubedev_core::{Consumer, ContainerEdits, DeviceSource, HostFs, Preparer};
use kubedev_testkit::machines::mdev::{
    MDEV_IGPU, MDEV_INSTANCES, MdevKernelSim, vgpu_mdev_host, vgpu_mdev_host_spec,
};
use kubedev_vfio::{PciAddress, VfioConfig, scan_mdev_parents, scan_mdevs};

fn selectors() -> serde_json::Value {
    serde_json::json!({
        "mediatedDevices": [
            {"mdevNameSelector": "GRID T4-1B", "resourceName": "nvidia.com/GRID_T4-1B"},
            {"mdevNameSelector": "i915-GVTg_V5_4", "resourceName": "intel.com/gvt_v5_4"}
        ]
    })
}

#[tokio::test]
async fn instances_are_offered_with_their_attributes() {
    let root = vgpu_mdev_host().unwrap();
    let state = tempfile::tempdir().unwrap();
    let b = backend(&root, state.path(), selectors());
    let pool = b.discover().await.unwrap().remove(0);
    let u = |i: usize| MDEV_INSTANCES[i].0;
    assert_eq!(
        names(&pool),
        [
            format!("mdev-{}", u(0)),
            format!("mdev-{}", u(1)),
            format!("mdev-{}", u(2))
        ]
    );
    let uuid_s = format!("s:{}", u(0));
    assert_eq!(
        attrs(&pool.devices[0]),
        table(&[
            ("type", "s:mdev"),
            ("uuid", &uuid_s),
            ("mdevType", "s:GRID_T4-1B"),
            ("mdevTypeID", "s:nvidia-222"),
            ("parentAddress", "s:0000:3b:00.0"),
            ("iommuGroup", "i:200"),
            ("numaNode", "i:0"),
            ("resourceName", "s:nvidia.com/GRID_T4-1B"),
            ("resource.kubernetes.io/pcieRoot", "s:pci0000:3a"),
        ])
    );
    // The GVT-g type has no name file: the directory name is the type name. The iGPU's NUMA
    // node is -1: no attribute.
    let uuid_s = format!("s:{}", u(2));
    assert_eq!(
        attrs(&pool.devices[2]),
        table(&[
            ("type", "s:mdev"),
            ("uuid", &uuid_s),
            ("mdevType", "s:i915-GVTg_V5_4"),
            ("mdevTypeID", "s:i915-GVTg_V5_4"),
            ("parentAddress", &format!("s:{MDEV_IGPU}")),
            ("iommuGroup", "i:202"),
            ("resourceName", "s:intel.com/gvt_v5_4"),
            ("resource.kubernetes.io/pcieRoot", "s:pci0000:00"),
        ])
    );
    assert_eq!(pool.devices[2].numa_node, None);

    // Prepare two instances of one resource: nodes for both groups, UUIDs joined.
    let devs = [
        alloc(&format!("mdev-{}", u(0))),
        alloc(&format!("mdev-{}", u(1))),
    ];
    let out = b.prepare(&Consumer::Claim(claim()), &devs).await.unwrap();
    let mut merged = ContainerEdits::default();
    for p in &out {
        merged.merge(&p.edits);
    }
    assert_eq!(
        merged.env["MDEV_PCI_RESOURCE_NVIDIA_COM_GRID_T4-1B"],
        format!("{},{}", u(0), u(1))
    );
    let nodes: Vec<_> = merged
        .device_nodes
        .iter()
        .map(|n| (n.path.as_str(), n.permissions.as_deref().unwrap()))
        .collect();
    assert_eq!(
        nodes,
        [
            ("/dev/vfio/vfio", "mrw"),
            ("/dev/vfio/200", "mrw"),
            ("/dev/vfio/201", "mrw")
        ]
    );
    let out = b
        .prepare(
            &Consumer::Container {
                resource: "nvidia.com/T4_1B".into(),
            },
            &devs[..1],
        )
        .await
        .unwrap();
    assert_eq!(out[0].edits.env["MDEV_PCI_RESOURCE_NVIDIA_COM_T4_1B"], u(0));
}

#[test]
fn unselected_types_are_not_offered() {
    let root = vgpu_mdev_host().unwrap();
    let state = tempfile::tempdir().unwrap();
    let b = backend(
        &root,
        state.path(),
        serde_json::json!({"mediatedDevices": [
            {"mdevNameSelector": "GRID_T4-1B", "resourceName": "nvidia.com/GRID_T4-1B"}
        ]}),
    );
    let (pool, logs) = common::with_logs(|| b.discover_blocking().unwrap());
    assert_eq!(pool.devices.len(), 2);
    assert!(
        logs.lines().any(|l| l.contains(MDEV_INSTANCES[2].0)
            && l.contains("type i915-GVTg_V5_4 matches no mdev selector")),
        "{logs}"
    );
}

/// A supported type as the test compares it: id, name, available, instances.
type TypeRow = (String, String, u32, usize);

#[test]
fn parents_and_supported_types_are_read() {
    let root = vgpu_mdev_host().unwrap();
    let host = HostFs::new(root.path());
    let parents = scan_mdev_parents(&host).unwrap();
    let view: Vec<(String, String, Vec<TypeRow>)> = parents
        .iter()
        .map(|p| {
            (
                p.address.to_string(),
                p.ids.to_string(),
                p.types
                    .iter()
                    .map(|t| {
                        (
                            t.id.clone(),
                            t.name.clone(),
                            t.available_instances,
                            t.instances.len(),
                        )
                    })
                    .collect(),
            )
        })
        .collect();
    let t4 = |a: u32, b: u32, c: u32, n: usize| {
        vec![
            ("nvidia-222".to_owned(), "GRID_T4-1B".to_owned(), a, n),
            ("nvidia-223".to_owned(), "GRID_T4-2B".to_owned(), b, 0),
            ("nvidia-230".to_owned(), "GRID_T4-16Q".to_owned(), c, 0),
        ]
    };
    assert_eq!(
        view,
        [
            (
                MDEV_IGPU.to_owned(),
                "8086:3e92".to_owned(),
                vec![(
                    "i915-GVTg_V5_4".to_owned(),
                    "i915-GVTg_V5_4".to_owned(),
                    1,
                    1
                )]
            ),
            (
                "0000:3b:00.0".to_owned(),
                "10de:1eb8".to_owned(),
                t4(14, 0, 0, 2)
            ),
            (
                "0000:d8:00.0".to_owned(),
                "10de:1eb8".to_owned(),
                t4(16, 8, 1, 0)
            ),
        ]
    );
    assert_eq!(parents[1].numa_node, Some(0));
    assert_eq!(parents[2].numa_node, Some(1));
}

/// Instances per (parent, type).
fn census(host: &HostFs) -> BTreeMap<(String, String), usize> {
    let mut out = BTreeMap::new();
    for i in scan_mdevs(host).unwrap() {
        *out.entry((i.parent.to_string(), i.type_id)).or_default() += 1;
    }
    out
}

fn key(p: &str, t: &str) -> (String, String) {
    (p.to_owned(), t.to_owned())
}

#[test]
fn type_manager_fills_parents_round_robin_and_replaces_undesired_types() {
    let spec = vgpu_mdev_host_spec();
    let root = spec.build().unwrap();
    let _kernel = MdevKernelSim::start(root.path(), &spec);
    let host = HostFs::new(root.path());
    let config: VfioConfig = serde_json::from_value(serde_json::json!({
        "desiredMdevTypes": [{"parentSelectors": ["10de:1eb8"], "types": ["nvidia-223", "GRID T4-1B"]}],
        "settleTimeoutMs": 3000
    }))
    .unwrap();
    let manager = kubedev_vfio::MdevTypeManager::new(&config, host.clone()).unwrap();
    // The first T4 keeps the wanted type it already holds (GRID T4-1B = nvidia-222); the second
    // takes the wanted type no parent holds yet. The iGPU is not governed.
    let plan = manager.plan().unwrap();
    let decided: Vec<_> = plan
        .parents
        .iter()
        .map(|p| (p.parent.to_string(), p.type_id.clone(), p.remove.len()))
        .collect();
    assert_eq!(
        decided,
        [
            ("0000:3b:00.0".to_owned(), Some("nvidia-222".to_owned()), 0),
            ("0000:d8:00.0".to_owned(), Some("nvidia-223".to_owned()), 0),
        ]
    );
    let report = manager.apply().unwrap();
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert_eq!(report.created.len(), 14 + 8);
    assert!(report.removed.is_empty());
    assert_eq!(
        census(&host),
        BTreeMap::from([
            (key("0000:3b:00.0", "nvidia-222"), 16),
            (key("0000:d8:00.0", "nvidia-223"), 8),
            (key(MDEV_IGPU, "i915-GVTg_V5_4"), 1),
        ])
    );
    // Nothing left to do.
    let report = manager.apply().unwrap();
    assert!(report.created.is_empty() && report.removed.is_empty());

    // Another wish: every T4 instance goes, one GRID T4-16Q per GPU comes.
    let config: VfioConfig = serde_json::from_value(serde_json::json!({
        "desiredMdevTypes": [{"types": ["nvidia-230"]}, {"types": ["i915-GVTg_V5_4"]}],
        "settleTimeoutMs": 3000
    }))
    .unwrap();
    let manager = kubedev_vfio::MdevTypeManager::new(&config, host.clone()).unwrap();
    let report = manager.apply().unwrap();
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert_eq!(report.removed.len(), 16 + 8 + 1);
    // The iGPU's entry is the first that matches it (no parent selectors): its GVT-g instance
    // is not a wanted type there, so it is removed too and none can be created in its place.
    let created: Vec<_> = report
        .created
        .iter()
        .map(|(p, t, _)| (p.to_string(), t.clone()))
        .collect();
    assert_eq!(
        created,
        [
            key("0000:3b:00.0", "nvidia-230"),
            key("0000:d8:00.0", "nvidia-230"),
        ]
    );
    assert_eq!(
        census(&host),
        BTreeMap::from([
            (key("0000:3b:00.0", "nvidia-230"), 1),
            (key("0000:d8:00.0", "nvidia-230"), 1),
        ])
    );
    // A backend discovering now sees the new instances.
    let state = tempfile::tempdir().unwrap();
    let b = common::backend(
        &root,
        state.path(),
        serde_json::json!({"mediatedDevices": [
            {"mdevNameSelector": "GRID T4-16Q", "resourceName": "nvidia.com/GRID_T4-16Q"}
        ]}),
    );
    let pool = b.discover_blocking().unwrap();
    assert_eq!(pool.devices.len(), 2);
    assert!(pool.devices.iter().all(|d| d.health.is_healthy()));
    let parents: Vec<PciAddress> = pool
        .devices
        .iter()
        .map(|d| attrs(d)["parentAddress"][2..].parse().unwrap())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    assert_eq!(
        parents,
        [
            "0000:3b:00.0".parse::<PciAddress>().unwrap(),
            "0000:d8:00.0".parse().unwrap()
        ]
    );
}

#[test]
fn without_desired_types_the_manager_changes_nothing() {
    let root = vgpu_mdev_host().unwrap();
    let host = HostFs::new(root.path());
    let manager = kubedev_vfio::MdevTypeManager::new(&VfioConfig::default(), host.clone()).unwrap();
    let before = census(&host);
    let report = manager.apply().unwrap();
    assert!(report.plan.parents.is_empty());
    assert_eq!(census(&host), before);
}
