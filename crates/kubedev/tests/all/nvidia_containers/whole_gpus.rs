//! Whole GPUs in a container: a DRA claim of one or two GPUs, the device plugin's CDI mode,
//! and `kubedev cdi generate` matching a claim's spec.

use crate::common::{self, DevicePluginDaemon};
use kubedev_core::DeviceRef;
use kubedev_testkit::podman::Container;
use serde_json::Value;

use super::{
    CUDA_MARKER, DRIVER, DriverRoot, Fixture, LoaderProbe, VERSION, WAIT, assert_user_view,
    dra_node, edits_of, gpus, nvidia_backend, nvml, prepare, run_spec, unprepare, user_script,
};

#[tokio::test]
#[ignore = "needs root, podman and runc: run by cargo xtask ci"]
async fn a_dra_claim_gives_the_container_the_gpu_and_a_usable_driver() {
    let Fixture {
        podman,
        root,
        cuda_sha,
        dir,
        lib,
    } = Fixture::new();
    let node = dra_node(dir.path(), &nvidia_backend(&lib, &root)).await;

    // One GPU: everything a CUDA user needs, checked edit by edit and from the user's side,
    // and the container's loader finds libcuda.so.1 by SONAME.
    let one = gpus(&node, &["gpu-0"]).await;
    let spec = prepare(&node, dir.path(), "uid-one", &[one[0].0.clone()]).await;
    assert!(spec.contains(&root.path().display().to_string()), "{spec}");
    let installed = podman.install_spec(&spec).unwrap();
    let probe = LoaderProbe::new(&root);
    let helper = podman.install_spec(&probe.spec).unwrap();
    let script = format!("{}\n/opt/probe\n", user_script(&[0]));
    let out = podman
        .run(
            Container::new(script)
                .devices(installed.device_ids())
                .devices(helper.device_ids())
                .check(&spec, &installed.device_names()),
        )
        .unwrap();
    out.assert_ok();
    assert_user_view(&out, &[0], &[one[0].1.clone()], &cuda_sha);
    assert_eq!(
        out.value("loaded"),
        Some(format!("{CUDA_MARKER} 0").as_str()),
        "{}",
        out.report()
    );
    drop(helper);
    drop(probe.dir);
    drop(installed);
    unprepare(&node, "uid-one").await;

    // Two GPUs in one claim: both nodes, both UUIDs, the driver files once.
    let two = gpus(&node, &["gpu-0", "gpu-1"]).await;
    let devices: Vec<DeviceRef> = two.iter().map(|(d, _)| d.clone()).collect();
    let spec = prepare(&node, dir.path(), "uid-two", &devices).await;
    let (installed, out) = run_spec(&podman, &spec, user_script(&[0, 1]));
    let uuids: Vec<String> = two.iter().map(|(_, u)| u.clone()).collect();
    assert_user_view(&out, &[0, 1], &uuids, &cuda_sha);
    drop(installed);
    unprepare(&node, "uid-two").await;
    node.stop().await;
}

#[tokio::test]
#[ignore = "needs root, podman and runc: run by cargo xtask ci"]
async fn the_device_plugin_in_cdi_mode_gives_the_container_the_gpu_and_the_driver() {
    let Fixture {
        podman,
        root,
        cuda_sha,
        dir,
        lib,
    } = Fixture::new();
    let dp = dir.path().join("dp");
    std::fs::create_dir_all(&dp).unwrap();
    let resource = "nvidia.com/gpu";
    let text = format!(
        "nodeName: node-a\nhostRoot: /\nstateDir: {d}/state\ndevicePlugin:\n  directory: {dp}\n  cdi: true\n  cdiDir: {d}/cdi\n  resources:\n    - name: {resource}\nbackends:\n{backends}",
        d = dir.path().display(),
        dp = dp.display(),
        backends = nvidia_backend(&lib, &root),
    );
    let node = DevicePluginDaemon::start(&dir.path().join("dp.yaml"), &text, &dp).await;
    node.kubelet
        .wait_for(resource, WAIT, |r| r.connected && r.capacity == 8)
        .await
        .unwrap();
    let a = node.kubelet.allocate(resource, &["gpu-1"]).await.unwrap();
    assert!(
        a.devices.is_empty() && a.envs.is_empty(),
        "CDI mode leaves the edits to the runtime: {a:?}"
    );
    let ids: Vec<String> = a.cdi_devices.iter().map(|d| d.name.clone()).collect();
    assert_eq!(ids.len(), 1, "{a:?}");
    let files = common::cdi_files(&dir.path().join("cdi"));
    assert_eq!(files.len(), 1, "{files:?}");
    let spec = std::fs::read_to_string(&files[0]).unwrap();
    let uuid = serde_json::from_str::<Value>(&spec).unwrap()["devices"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|d| {
            d["containerEdits"]["env"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .chain(
            serde_json::from_str::<Value>(&spec).unwrap()["containerEdits"]["env"]
                .as_array()
                .cloned()
                .unwrap_or_default(),
        )
        .filter_map(|e| {
            e.as_str()?
                .strip_prefix("NVIDIA_VISIBLE_DEVICES=")
                .map(str::to_string)
        })
        .next()
        .unwrap_or_else(|| panic!("no NVIDIA_VISIBLE_DEVICES: {spec}"));
    assert!(uuid.starts_with("GPU-"), "{uuid}");
    let installed = podman.install_spec(&spec).unwrap();
    let names: Vec<String> = ids
        .iter()
        .map(|id| {
            id.strip_prefix(&format!("{}=", installed.kind()))
                .unwrap_or_else(|| panic!("{id} is not of the kind {}", installed.kind()))
                .to_string()
        })
        .collect();
    let out = podman
        .run(
            Container::new(user_script(&[1]))
                .devices(&ids)
                .check(&spec, &names),
        )
        .unwrap();
    out.assert_ok();
    assert_user_view(&out, &[1], &[uuid], &cuda_sha);
    drop(installed);
    node.stop().await;
}

#[tokio::test]
#[ignore = "needs root, podman and runc: run by cargo xtask ci"]
async fn cdi_generate_gives_a_gpu_what_a_dra_claim_gives_it() {
    let root = DriverRoot::new();
    let dir = tempfile::tempdir().unwrap();
    let lib = nvml(dir.path());
    let backends = nvidia_backend(&lib, &root);

    let node = dra_node(dir.path(), &backends).await;
    let gpu0 = gpus(&node, &["gpu-0"]).await;
    let claim: Value =
        serde_json::from_str(&prepare(&node, dir.path(), "uid-gen", &[gpu0[0].0.clone()]).await)
            .unwrap();
    node.stop().await;
    let claim_devices = claim["devices"].as_array().unwrap();
    assert_eq!(claim_devices.len(), 1, "{claim:#}");
    let claim_edits = edits_of(&claim, claim_devices[0]["name"].as_str().unwrap());

    let gen_dir = tempfile::tempdir().unwrap();
    let path = gen_dir.path().join("kubedev.yaml");
    std::fs::write(
        &path,
        format!(
            "nodeName: node-a\nhostRoot: /\nstateDir: {}/state\ndra:\n  enabled: true\n  driverName: {DRIVER}\nbackends:\n{backends}",
            gen_dir.path().display()
        ),
    )
    .unwrap();
    let config = kubedev::config::Config::load(&path).unwrap();
    let generated = kubedev::cdi_generate::generate(&config, &path, &format!("{DRIVER}/device"))
        .await
        .unwrap();
    let spec = serde_json::to_value(generated.spec.as_ref().unwrap()).unwrap();
    let names: Vec<&str> = spec["devices"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|d| d["name"].as_str())
        .collect();
    let name = names
        .iter()
        .find(|n| **n == "gpu-0" || n.ends_with("-gpu-0"))
        .unwrap_or_else(|| panic!("no device for gpu-0 among {names:?}"));
    let gen_edits = edits_of(&spec, name);
    for (i, what) in ["env", "deviceNodes", "mounts", "hooks"].iter().enumerate() {
        assert_eq!(
            gen_edits[i], claim_edits[i],
            "{what} of gpu-0 differ between `cdi generate` and the claim's spec"
        );
    }
    assert!(
        claim_edits[2]
            .iter()
            .any(|m| m.contains(&format!("libcuda.so.{VERSION}"))),
        "the driver's libraries are mounted: {:?}",
        claim_edits[2]
    );
}
