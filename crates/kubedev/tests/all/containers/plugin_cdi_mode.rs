//! The device plugin in CDI mode: each container gets exactly the devices it was allocated.

use std::path::Path;

use crate::common::{self, DevicePluginDaemon};
use kubedev_testkit::podman::{Container, FakeNode};

use super::{WAIT, podman, run};

/// Four static GPUs served as `example.com/gpu` in device-plugin CDI mode.
fn dp_config(dir: &Path) -> String {
    let devices: String = (0..4)
        .map(|i| {
            format!(
                "      - name: gpu-{i}\n        deviceNodes: [\"/dev/example/dp{i}\"]\n        env: {{EXAMPLE_GPU_{i}: \"present\"}}\n"
            )
        })
        .collect();
    format!(
        "devicePlugin:\n  directory: {d}\n  cdi: true\n  cdiDir: {d}/cdi\n  resources:\n    - name: example.com/gpu\nbackends:\n  static:\n    pool: node-a\n    devices:\n{devices}",
        d = dir.display()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root, podman and runc: run by cargo xtask ci"]
async fn device_plugin_cdi_mode_gives_each_container_its_devices() {
    let podman = podman();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kubedev.yaml");
    let node = DevicePluginDaemon::start(&path, &dp_config(dir.path()), dir.path()).await;
    node.kubelet
        .wait_for("example.com/gpu", WAIT, |r| r.connected && r.capacity == 4)
        .await
        .unwrap();
    // Two containers: the first gets gpu-1, the second gpu-3 and gpu-0.
    let first = node
        .kubelet
        .allocate("example.com/gpu", &["gpu-1"])
        .await
        .unwrap();
    let second = node
        .kubelet
        .allocate("example.com/gpu", &["gpu-3", "gpu-0"])
        .await
        .unwrap();
    let files = common::cdi_files(&dir.path().join("cdi"));
    assert_eq!(files.len(), 1, "one spec for the resource: {files:?}");
    let spec = std::fs::read_to_string(&files[0]).unwrap();
    let _installed = podman.install_spec(&spec).unwrap();
    let script = "ls /dev/example | tr '\\n' ' ' | sed 's/^/nodes=/'; echo\n\
                  echo \"visible=$STATIC_VISIBLE_DEVICES\"\n\
                  env | grep '^EXAMPLE_GPU_' | sort | tr '\\n' ' ' | sed 's/^/gpus=/'; echo\n";
    let fakes: Vec<FakeNode> = (0..4)
        .map(|i| FakeNode::char(format!("/dev/example/dp{i}"), 240, i))
        .collect();
    // Both containers start after both allocations, as a container restarted later does: each
    // must still get its own devices and variables from the spec as it is now.
    for (answer, nodes, visible, gpus) in [
        (&first, "dp1", "gpu-1", "EXAMPLE_GPU_1=present"),
        (
            &second,
            "dp0 dp3",
            "gpu-0,gpu-3",
            "EXAMPLE_GPU_0=present EXAMPLE_GPU_3=present",
        ),
    ] {
        let ids: Vec<String> = answer.cdi_devices.iter().map(|d| d.name.clone()).collect();
        let out = run(
            &podman,
            Container::new(script)
                .devices(&ids)
                .nodes(fakes.clone())
                .check(&spec, &ids),
        );
        out.assert_ok();
        assert_eq!(
            out.value("nodes").map(str::trim),
            Some(nodes),
            "{}",
            out.report()
        );
        assert_eq!(
            out.value("gpus").map(str::trim),
            Some(gpus),
            "{}",
            out.report()
        );
        let mut seen: Vec<&str> = out.value("visible").unwrap_or("").split(',').collect();
        seen.sort();
        assert_eq!(
            seen.join(","),
            visible,
            "STATIC_VISIBLE_DEVICES lists the container's own devices\n{spec}\n{}",
            out.report()
        );
    }
    node.stop().await;
}
