//! Shared GPUs in a container: two time-sliced replicas of one GPU in a claim, and an MPS
//! claim's pipe directory.

use std::collections::BTreeSet;

use kubedev_core::DeviceRef;
use kubedev_testkit::podman::Container;
use serde_json::{Value, json};

use super::{
    Fixture, NODES_SCRIPT, assert_nodes, assert_user_view, dra_node, edits_of, gpus,
    nvidia_backend, prepare, prepare_allocated, published, run_spec, unprepare, user_script,
};

#[tokio::test]
#[ignore = "needs root, podman and runc: run by cargo xtask ci"]
async fn both_time_sliced_replicas_of_a_gpu_in_one_claim_give_the_container_that_gpu() {
    let Fixture {
        podman,
        root,
        cuda_sha,
        dir,
        lib,
    } = Fixture::new();
    let backends = format!("{}    replicas: 2\n", nvidia_backend(&lib, &root));
    let node = dra_node(dir.path(), &backends).await;
    let replicas = gpus(&node, &["gpu-0-replica-0", "gpu-0-replica-1"]).await;
    let uuid = replicas[0].1.clone();
    assert_eq!(replicas[1].1, uuid, "replicas of one GPU");
    let (_, attrs) = published(&node, "gpu-0-replica-1").await;
    assert_eq!(attrs["gpu.nvidia.com/replica"], "1", "{attrs:?}");
    assert_eq!(attrs["gpu.nvidia.com/minor"], "0", "{attrs:?}");

    let devices: Vec<DeviceRef> = replicas.iter().map(|(d, _)| d.clone()).collect();
    let spec = prepare(&node, dir.path(), "uid-replicas", &devices).await;
    // Two CDI devices with the same device nodes, /dev/nvidia0 among them.
    let parsed: Value = serde_json::from_str(&spec).unwrap();
    let names: Vec<&str> = parsed["devices"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|d| d["name"].as_str())
        .collect();
    assert_eq!(names.len(), 2, "{spec}");
    let nodes: Vec<BTreeSet<String>> = names
        .iter()
        .map(|n| edits_of(&parsed, n)[1].clone())
        .collect();
    assert_eq!(nodes[0], nodes[1], "{spec}");
    assert!(
        nodes[0].iter().any(|n| n.contains("\"/dev/nvidia0\"")),
        "{spec}"
    );
    let (installed, out) = run_spec(
        &podman,
        &spec,
        format!("{}{NODES_SCRIPT}", user_script(&[0])),
    );
    assert_user_view(&out, &[0], std::slice::from_ref(&uuid), &cuda_sha);
    assert_eq!(
        out.value("visible"),
        Some(uuid.as_str()),
        "{}",
        out.report()
    );
    assert_nodes(&out, &[0], None);
    drop(installed);
    unprepare(&node, "uid-replicas").await;
    node.stop().await;
}

#[tokio::test]
#[ignore = "needs root, podman and runc: run by cargo xtask ci"]
async fn an_mps_claim_gives_the_container_its_mps_pipe_directory() {
    let Fixture {
        podman,
        root,
        cuda_sha,
        dir,
        lib,
    } = Fixture::new();
    let smi = nvml_mock::tools::smi_wrapper(
        &dir.path().join("nvidia-smi"),
        &dir.path().join("gpu-settings.json"),
        &nvml_mock::machine_path("dgx-a100"),
    )
    .expect("run `cargo build -p kubedev-nvml-mock` first");
    let mps = nvml_mock::tools::tool_path("mock-nvidia-cuda-mps-control").unwrap();
    let backends = format!(
        "{}    nvidiaSmiPath: {}\n    mpsControlPath: {}\n",
        nvidia_backend(&lib, &root),
        smi.display(),
        mps.display()
    );
    let node = dra_node(dir.path(), &backends).await;
    let gpu0 = gpus(&node, &["gpu-0"]).await;
    let config = kubedev_core::DeviceConfig::new(
        kubedev_core::ConfigSource::Claim,
        0,
        json!({"apiVersion": "gpu.kubedev.io/v1alpha1", "kind": "GpuConfig",
               "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 40}}}),
    );
    node.claims.allocate_devices(
        "uid-mps",
        vec![
            kubedev_core::AllocatedDevice::new(gpu0[0].0.clone())
                .with_request("req")
                .with_config(vec![config]),
        ],
    );
    let spec = prepare_allocated(&node, dir.path(), "uid-mps", 1).await;
    // What kubedev's MPS control daemon made in the claim's pipe directory.
    let pipe = dir.path().join("state/nvidia/mps/uid-mps/pipe");
    let pid = std::fs::read_to_string(pipe.join("nvidia-cuda-mps-control.pid")).unwrap();
    let mut files: Vec<String> = std::fs::read_dir(&pipe)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    assert!(files.contains(&"control".to_string()), "{files:?}");

    let installed = podman.install_spec(&spec).unwrap();
    let script = format!(
        "{}{NODES_SCRIPT}\
         echo mpsenv=$CUDA_MPS_PIPE_DIRECTORY\n\
         echo mpsfiles=$(ls /tmp/nvidia-mps | sort | tr '\\n' ' ')\n\
         echo mpspid=$(cat /tmp/nvidia-mps/nvidia-cuda-mps-control.pid)\n\
         echo mpscontrol=$(stat -c %F /tmp/nvidia-mps/control)\n",
        user_script(&[0])
    );
    let out = podman
        .run(
            Container::new(script)
                .devices(installed.device_ids())
                .check(&spec, &installed.device_names()),
        )
        .unwrap();
    out.assert_ok();
    let report = out.report();
    assert_user_view(&out, &[0], std::slice::from_ref(&gpu0[0].1), &cuda_sha);
    assert_nodes(&out, &[0], None);
    assert_eq!(out.value("mpsenv"), Some("/tmp/nvidia-mps"), "{report}");
    assert_eq!(
        out.value("mpsfiles").map(str::trim),
        Some(files.join(" ").as_str()),
        "{report}"
    );
    assert_eq!(out.value("mpspid"), Some(pid.trim()), "{report}");
    assert_eq!(out.value("mpscontrol"), Some("socket"), "{report}");
    drop(installed);
    unprepare(&node, "uid-mps").await;
    assert!(!pipe.exists(), "unprepare removes the pipe directory");
    node.stop().await;
}
