//! The NVIDIA backend through the real daemon: DGX GPUs through the device plugin (an NVLink
//! policy) and through DRA with CDI, Xid events as health, and MIG placements chosen by the
//! allocator created on prepare.

use super::*;

/// A copy of the NVML stand-in bound to `machine`, with a control file for Xid events.
fn nvml(dir: &Path, machine: &str) -> (PathBuf, PathBuf) {
    let control = dir.join("control.jsonl");
    std::fs::write(&control, "").unwrap();
    let lib = nvml_mock::isolated_library(dir, &nvml_mock::machine_path(machine), Some(&control))
        .unwrap();
    (lib, control)
}

fn send(control: &Path, line: &str) {
    use std::io::Write as _;
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(control)
        .unwrap();
    writeln!(f, "{line}").unwrap();
}

fn backends(lib: &Path) -> String {
    format!(
        "  nvidia:\n    libraryPath: {}\n    healthRecheckSeconds: 1\n    healthPollMillis: 50\n",
        lib.display()
    )
}

#[tokio::test]
async fn dgx_gpus_through_the_device_plugin_with_an_nvlink_policy_and_xid_health() {
    let dir = tempfile::tempdir().unwrap();
    let host = tempfile::tempdir().unwrap();
    let (lib, control) = nvml(dir.path(), "dgx-a100");
    let resource = "nvidia.com/gpu";
    let policy = format!(
        "      policy: {}\n",
        common::plugin("nvlink-pack").display()
    );
    let node = dp_node(dir.path(), host.path(), resource, &backends(&lib), &policy).await;
    let state = node.kubelet.resource(resource).unwrap();
    assert_eq!(state.capacity, 8, "{:?}", state.devices.keys());
    // GPUs 0-3 sit on NUMA node 0, 4-7 on node 1.
    assert_eq!(state.devices["gpu-5"].numa_nodes, [1]);

    let a = node.kubelet.allocate(resource, &["gpu-3"]).await.unwrap();
    assert!(
        a.envs["NVIDIA_VISIBLE_DEVICES"].starts_with("GPU-"),
        "{a:?}"
    );
    let paths: Vec<&str> = a.devices.iter().map(|d| d.host_path.as_str()).collect();
    assert!(paths.contains(&"/dev/nvidiactl"), "{paths:?}");
    assert!(
        paths
            .iter()
            .any(|p| p.starts_with("/dev/nvidia") && p[11..].parse::<u32>().is_ok()),
        "{paths:?}"
    );

    // The policy chooses 4 of 8 from one NVLink island and NUMA node.
    let all: Vec<String> = (0..8).map(|i| format!("gpu-{i}")).collect();
    let got = node
        .kubelet
        .preferred_allocation(resource, &all, &[], 4)
        .await
        .unwrap();
    assert_eq!(got.len(), 4);
    let numa: std::collections::BTreeSet<i64> =
        got.iter().map(|g| state.devices[g].numa_nodes[0]).collect();
    assert_eq!(numa.len(), 1, "{got:?} spans NUMA nodes");

    // An Xid 79 (fallen off the bus) makes gpu-2 Unhealthy; it recovers once NVML answers
    // again and no new Xid arrives. An ignored Xid (13) changes nothing.
    send(&control, r#"{"xid": 13, "gpu": 1}"#);
    send(&control, r#"{"xid": 79, "gpu": 2}"#);
    node.wait_health(resource, "gpu-2", "Unhealthy", WAIT).await;
    assert_eq!(
        node.kubelet.resource(resource).unwrap().devices["gpu-1"].health,
        "Healthy"
    );
    node.wait_health(resource, "gpu-2", "Healthy", WAIT).await;
    node.stop().await;
}

#[tokio::test]
async fn dgx_gpus_through_dra_with_cdi_and_xid_health() {
    let dir = tempfile::tempdir().unwrap();
    let host = tempfile::tempdir().unwrap();
    let (lib, control) = nvml(dir.path(), "dgx-a100");
    let node = dra_node(dir.path(), host.path(), &backends(&lib)).await;
    let published = node.published().await;
    assert_eq!(published.len(), 8, "{published:?}");
    let inv = node.published_inventory();
    let gpu0 = published
        .iter()
        .find(|d| d.device.as_str() == "gpu-0")
        .unwrap()
        .clone();
    let uuid = attr(&inv, &gpu0, "gpu.nvidia.com/uuid").unwrap();
    let spec = node.prepare("uid-gpu", std::slice::from_ref(&gpu0)).await;
    assert!(
        spec.contains(&uuid),
        "NVIDIA_VISIBLE_DEVICES names the UUID: {spec}"
    );
    assert!(spec.contains("/dev/nvidiactl"), "{spec}");

    let gpu6 = published
        .iter()
        .find(|d| d.device.as_str() == "gpu-6")
        .unwrap()
        .clone();
    send(&control, r#"{"xid": 48, "gpu": 6}"#);
    node.wait_health(&gpu6, "UNHEALTHY").await;
    let msg = node.dra.kubelet.health(DRIVER)[&gpu6.to_string()]
        .message
        .clone();
    assert!(msg.contains("48"), "the reason names the Xid: {msg}");
    node.wait_health(&gpu6, "HEALTHY").await;
    node.unprepare("uid-gpu").await;
    node.stop().await;
}

/// The distinct MIG UUIDs a CDI spec names.
fn mig_uuids(spec: &str) -> usize {
    spec.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
        .filter(|t| t.starts_with("MIG-"))
        .collect::<std::collections::BTreeSet<_>>()
        .len()
}

#[tokio::test]
async fn mig_placements_chosen_by_the_allocator_are_created_on_prepare() {
    let dir = tempfile::tempdir().unwrap();
    let host = tempfile::tempdir().unwrap();
    let (lib, _control) = nvml(dir.path(), "dgx-a100");
    let backends = format!("{}    migStrategy: partitionable\n", backends(&lib));
    let node = dra_node(dir.path(), host.path(), &backends).await;
    node.published().await;
    let inv = node.published_inventory();

    // Three 1g.5gb slices, then four more on the MIG-enabled GPUs, all distinct
    // placements, because the counters say which memory slices each one takes.
    let first = common::schedule_mig(&inv, DRIVER, "1g.5gb", 3, &[]);
    assert_eq!(first.len(), 3);
    let spec = node.prepare("uid-mig-1", &first).await;
    assert_eq!(mig_uuids(&spec), 3, "three MIG devices: {spec}");
    let used: Vec<String> = first.iter().map(|d| format!("{DRIVER}/{d}")).collect();
    let second = common::schedule_mig(&inv, DRIVER, "1g.5gb", 4, &used);
    assert!(
        second.iter().all(|d| !first.contains(d)),
        "{first:?} {second:?}"
    );
    let spec = node.prepare("uid-mig-2", &second).await;
    assert_eq!(mig_uuids(&spec), 4, "{spec}");

    // Unprepare frees the placements: the same slices can be created again.
    node.unprepare("uid-mig-1").await;
    node.unprepare("uid-mig-2").await;
    let again = node.prepare("uid-mig-3", &first).await;
    assert_eq!(mig_uuids(&again), 3, "{again}");
    node.unprepare("uid-mig-3").await;
    node.stop().await;
}
