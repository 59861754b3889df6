//! What a claim's spec holds: joined variables, the CDI shape and field names, the lowest
//! version, specs for named devices, shared devices and devices without edits.

use super::*;

#[test]
fn a_variable_several_devices_set_carries_the_whole_claims_value() {
    let w = writer(Path::new("/nonexistent"));
    let mut a = prepared("gpu-0");
    a.edits.env.insert("ONLY_A".into(), "x".into());
    let b = prepared("gpu-1");
    let (spec, _) = w.claim_spec(&cuid(UID), &[a, b]).unwrap();
    let spec = spec.unwrap();
    // What a container given device i gets: the spec's edits, then the device's.
    let env = |i: usize| {
        let mut v = spec.container_edits.env.clone();
        v.extend(spec.devices[i].container_edits.env.iter().cloned());
        v
    };
    // A container given both devices sees both GPUs, whichever device's edits apply last.
    assert!(
        env(0).contains(&"GPU_VISIBLE=gpu-0,gpu-1".to_string()),
        "{:?}",
        env(0)
    );
    assert!(
        env(1).contains(&"GPU_VISIBLE=gpu-0,gpu-1".to_string()),
        "{:?}",
        env(1)
    );
    assert!(env(0).contains(&"ONLY_A=x".to_string()));
    assert!(!env(1).iter().any(|e| e.starts_with("ONLY_A")));
    // One device alone keeps its own value.
    let (one, _) = w.claim_spec(&cuid(UID), &[prepared("gpu-3")]).unwrap();
    assert_eq!(
        one.unwrap().devices[0].container_edits.env,
        vec!["GPU_VISIBLE=gpu-3".to_string()]
    );
}

#[test]
fn spec_has_the_cdi_shape_and_field_names() {
    let dir = TestDir::new("cdi");
    let w = writer(dir.path());
    let mut p = prepared("gpu-0");
    p.edits.env.insert("A".into(), "1".into());
    let node = &mut p.edits.device_nodes[0];
    node.host_path = Some("/dev/host-gpu0".into());
    node.node_type = Some(DeviceNodeType::Char);
    node.major = Some(195);
    node.minor = Some(0);
    node.file_mode = Some(0o666);
    node.uid = Some(0);
    node.gid = Some(44);
    p.edits
        .mounts
        .push(Mount::bind("/opt/lib", "/usr/lib/gpu", true));
    p.edits.hooks.push(
        Hook::new("createContainer", "/usr/bin/gpu-hook")
            .with_args(vec!["gpu-hook".into(), "update-ldcache".into()])
            .with_env(vec!["DEBUG=1".into()])
            .with_timeout(5),
    );
    p.edits
        .annotations
        .insert("gpu.example.com/model".into(), "x1".into());

    let out = w.write_claim(&cuid(UID), &[p]).unwrap();
    let path = dir
        .path()
        .join(format!("k8s.gpu.example.com-claim_{UID}.json"));
    assert_eq!(out.file.as_deref(), Some(path.as_path()));
    assert_eq!(
        out.device_ids,
        [Some(format!("k8s.gpu.example.com/claim={UID}-gpu-0"))]
    );
    let written: serde_json::Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
    assert_eq!(
        written,
        json!({
            "cdiVersion": "0.6.0",
            "kind": "k8s.gpu.example.com/claim",
            "devices": [{
                "name": format!("{UID}-gpu-0"),
                "annotations": {"gpu.example.com/model": "x1"},
                "containerEdits": {
                    "env": ["A=1", "GPU_VISIBLE=gpu-0"],
                    "deviceNodes": [{
                        "path": "/dev/gpu-0",
                        "hostPath": "/dev/host-gpu0",
                        "type": "c",
                        "major": 195,
                        "minor": 0,
                        "fileMode": 0o666,
                        "permissions": "rw",
                        "uid": 0,
                        "gid": 44
                    }],
                    "hooks": [{
                        "hookName": "createContainer",
                        "path": "/usr/bin/gpu-hook",
                        "args": ["gpu-hook", "update-ldcache"],
                        "env": ["DEBUG=1"],
                        "timeout": 5
                    }],
                    "mounts": [{
                        "hostPath": "/opt/lib",
                        "containerPath": "/usr/lib/gpu",
                        "options": ["rbind", "ro"],
                        "type": "bind"
                    }]
                }
            }]
        })
    );
}

#[test]
fn minimum_version_follows_the_content() {
    let dir = TestDir::new("cdi");
    let w = writer(dir.path());
    let version = |uid: &str, p: PreparedDevice| {
        let (spec, _) = w.claim_spec(&cuid(uid), &[p]).unwrap();
        spec.unwrap().cdi_version
    };
    // Baseline: name starts with a letter, no newer fields.
    assert_eq!(version(UID, prepared("gpu-0")), "0.3.0");
    // A host path equal to the path is the default and left out.
    let mut same = prepared("gpu-0");
    same.edits.device_nodes[0].host_path = Some("/dev/gpu-0".into());
    assert_eq!(version(UID, same), "0.3.0");
    // Mount type: 0.4.0; a mount without type stays at 0.3.0.
    let mut typed = prepared("gpu-0");
    typed.edits.mounts.push(Mount::bind("/a", "/b", false));
    assert_eq!(version(UID, typed.clone()), "0.4.0");
    typed.edits.mounts[0].mount_type = None;
    assert_eq!(version(UID, typed), "0.3.0");
    // A device name starting with a digit: 0.5.0.
    assert_eq!(version(DIGIT_UID, prepared("gpu-0")), "0.5.0");
    // hostPath on a device node: 0.5.0.
    let mut host = prepared("gpu-0");
    host.edits.device_nodes[0].host_path = Some("/dev/other".into());
    assert_eq!(version(UID, host), "0.5.0");
    // Device annotations: 0.6.0.
    let mut annotated = prepared("gpu-0");
    annotated.edits.annotations.insert("a".into(), "b".into());
    assert_eq!(version(UID, annotated), "0.6.0");

    // Rules only reachable through hand-built specs.
    let (spec, _) = w.claim_spec(&cuid(UID), &[prepared("gpu-0")]).unwrap();
    let mut spec = spec.unwrap();
    spec.kind = "example.com/gpu.v2".into();
    assert_eq!(spec.minimum_version(), "0.6.0");
    spec.kind = "example.com/gpu".into();
    spec.annotations.insert("k".into(), "v".into());
    assert_eq!(spec.minimum_version(), "0.6.0");
    spec.annotations.clear();
    spec.container_edits.additional_gids.push(44);
    assert_eq!(spec.minimum_version(), "0.7.0");
    // Declaring less than the content needs is invalid.
    spec.cdi_version = "0.6.0".into();
    let err = spec.validate().unwrap_err();
    assert!(err.to_string().contains("needs 0.7.0"), "{err}");
    spec.cdi_version = "0.7.0".into();
    spec.validate().unwrap();
    spec.cdi_version = "0.9.0".into();
    assert!(spec.validate().is_err());
}

#[test]
fn a_spec_for_named_devices_keeps_each_devices_values() {
    let edits = |v: &str| {
        let mut e = ContainerEdits::default();
        e.env.insert("VISIBLE".into(), v.into());
        e.device_nodes
            .push(DeviceNode::new(format!("/dev/x{v}"), "rw"));
        e
    };
    let spec = CdiSpec::for_devices(
        "example.com/device",
        &[("a".into(), edits("0")), ("b".into(), edits("1"))],
    )
    .unwrap();
    assert_eq!(spec.kind, "example.com/device");
    assert_eq!(spec.devices[1].name, "b");
    assert_eq!(spec.devices[1].container_edits.env, ["VISIBLE=1"]);
    assert_eq!(
        spec.devices[0].container_edits.device_nodes[0].path,
        "/dev/x0"
    );
    assert_eq!(spec.cdi_version, "0.3.0");
    // Names, kinds and empty edits are checked as for claim specs.
    let err = CdiSpec::for_devices("example.com/device", &[("-a".into(), edits("0"))]);
    assert!(err.unwrap_err().to_string().contains("-a"));
    assert!(CdiSpec::for_devices("nokind", &[("a".into(), edits("0"))]).is_err());
    assert!(
        CdiSpec::for_devices(
            "example.com/device",
            &[("a".into(), ContainerEdits::default())]
        )
        .is_err()
    );
    let dup = CdiSpec::for_devices(
        "example.com/device",
        &[("a".into(), edits("0")), ("a".into(), edits("1"))],
    );
    assert!(dup.is_err());
}

#[test]
fn shared_devices_get_the_share_id_and_duplicates_are_rejected() {
    let dir = TestDir::new("cdi");
    let w = writer(dir.path());
    let mut a = prepared("gpu-0");
    a.device.share_id = Some("s-1".into());
    let mut b = prepared("gpu-0");
    b.device.share_id = Some("s-2".into());
    let out = w.write_claim(&cuid(UID), &[a.clone(), b]).unwrap();
    assert_eq!(
        out.device_ids,
        [
            Some(format!("k8s.gpu.example.com/claim={UID}-gpu-0-s-1")),
            Some(format!("k8s.gpu.example.com/claim={UID}-gpu-0-s-2")),
        ]
    );
    // The same device name from another pool would collide.
    let mut c = prepared("gpu-0");
    c.device.device.pool = PoolName::new("node-b").unwrap();
    let err = w
        .write_claim(&cuid(UID), &[prepared("gpu-0"), c])
        .unwrap_err();
    assert!(matches!(err, CdiError::DuplicateDevice { .. }), "{err:?}");
    let err = w.write_claim(&cuid(UID), &[a.clone(), a]).unwrap_err();
    assert!(err.to_string().contains("gpu-0-s-1"), "{err}");
}

#[test]
fn devices_without_edits_get_no_cdi_device() {
    let dir = TestDir::new("cdi");
    let w = writer(dir.path());
    let mut bare = prepared("gpu-1");
    bare.edits = ContainerEdits::default();
    bare.edits
        .annotations
        .insert("only".into(), "metadata".into());
    let out = w
        .write_claim(&cuid(UID), &[prepared("gpu-0"), bare.clone()])
        .unwrap();
    assert_eq!(
        out.device_ids,
        [Some(format!("k8s.gpu.example.com/claim={UID}-gpu-0")), None]
    );
    let spec: CdiSpec = serde_json::from_slice(&fs::read(out.file.unwrap()).unwrap()).unwrap();
    assert_eq!(spec.devices.len(), 1);
    // A claim where nothing needs edits has no file, and an earlier one is removed.
    let out = w.write_claim(&cuid(UID), &[bare]).unwrap();
    assert_eq!(out.file, None);
    assert_eq!(out.device_ids, [None]);
    assert!(dir.names().is_empty(), "{:?}", dir.names());
}

#[test]
fn edits_every_device_shares_are_written_once_at_the_spec_level() {
    let w = writer(Path::new("/nonexistent"));
    let driver = [
        Mount::bind("/usr/lib/libgpu.so.1.2", "/usr/lib/libgpu.so.1", true),
        Mount::bind("/usr/bin/gpu-smi", "/usr/bin/gpu-smi", true),
    ];
    let mut devices: Vec<_> = ["gpu-0", "gpu-1", "gpu-2"]
        .into_iter()
        .map(|d| {
            let mut p = prepared(d);
            p.edits.mounts.extend(driver.iter().cloned());
            p.edits
                .device_nodes
                .push(kubedev_core::DeviceNode::new("/dev/gpuctl", "rw"));
            p
        })
        .collect();
    devices[1]
        .edits
        .mounts
        .push(Mount::bind("/run/gpu-1", "/run/gpu", false));
    let (spec, ids) = w.claim_spec(&cuid(UID), &devices).unwrap();
    let spec = spec.unwrap();
    assert_eq!(ids.iter().flatten().count(), 3);
    assert_eq!(spec.container_edits.mounts, driver);
    let ctl: Vec<_> = spec
        .container_edits
        .device_nodes
        .iter()
        .map(|n| n.path.as_str())
        .collect();
    assert_eq!(ctl, ["/dev/gpuctl"]);
    assert!(
        spec.container_edits
            .env
            .contains(&"GPU_VISIBLE=gpu-0,gpu-1,gpu-2".to_string())
    );
    for (i, d) in spec.devices.iter().enumerate() {
        let nodes: Vec<_> = d
            .container_edits
            .device_nodes
            .iter()
            .map(|n| n.path.as_str())
            .collect();
        assert_eq!(nodes.len(), 1, "each device keeps its own node: {nodes:?}");
        assert!(nodes[0].ends_with(&i.to_string()), "{nodes:?}");
        let own: Vec<_> = d
            .container_edits
            .mounts
            .iter()
            .map(|m| m.container_path.as_str())
            .collect();
        assert_eq!(own, if i == 1 { vec!["/run/gpu"] } else { vec![] });
    }
    // Two handles on one device (replicas) share everything: their nodes and variables stay
    // on the devices, so neither CDI device is empty; the shared mounts still move.
    let mut a = prepared("gpu-0");
    a.edits.mounts.extend(driver.iter().cloned());
    let mut b = a.clone();
    b.device.device.device = kubedev_core::DeviceName::new("gpu-0-replica-1").unwrap();
    let (spec, _) = w.claim_spec(&cuid(UID), &[a, b]).unwrap();
    let spec = spec.unwrap();
    assert_eq!(spec.container_edits.mounts, driver);
    assert!(spec.container_edits.device_nodes.is_empty());
    for d in &spec.devices {
        assert!(!d.container_edits.is_empty());
        assert!(d.container_edits.mounts.is_empty());
    }
}
