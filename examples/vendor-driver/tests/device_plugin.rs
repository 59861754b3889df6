//! The driver as a device plugin, against kubedev's kubelet emulator: Allocate answers with the
//! card's device node, `FPGA_CARDS` and the bitstreams; a card whose `state` leaves `operating`
//! is reported unhealthy in ListAndWatch, and healthy again when it comes back; a card that goes
//! away leaves the list.
#![allow(clippy::unwrap_used)]

mod common;

use common::{Daemon, Host, WAIT};
use kubedev_testkit::kubelet::KubeletEmulator;

const RESOURCE: &str = "example.com/fpga";

/// The kubelet emulator and the driver serving `example.com/fpga` from `host`'s cards.
struct Node {
    dir: tempfile::TempDir,
    kubelet: KubeletEmulator,
    driver: Daemon,
}

impl Node {
    async fn start(host: &Host) -> Node {
        let dir = tempfile::tempdir().unwrap();
        let plugins = dir.path().join("device-plugins");
        std::fs::create_dir_all(&plugins).unwrap();
        let config = dir.path().join("fpga.yaml");
        std::fs::write(
            &config,
            format!(
                "nodeName: node-a\nhostRoot: {host}\nstateDir: {dir}/state\ndevicePlugin:\n  directory: {plugins}\n  resources:\n    - name: {RESOURCE}\nbackends:\n  fpga:\n    bitstreamDir: /lib/firmware\n",
                host = host.path().display(),
                dir = dir.path().display(),
                plugins = plugins.display(),
            ),
        )
        .unwrap();
        let kubelet = KubeletEmulator::start(&plugins).await.unwrap();
        let driver = Daemon::start(&config);
        Node {
            dir,
            kubelet,
            driver,
        }
    }

    /// Waits until the kubelet sees `healthy` of the resource's devices healthy, and returns
    /// the devices' health by ID.
    async fn wait_allocatable(&self, healthy: usize) -> Vec<(String, String)> {
        let state = self
            .kubelet
            .wait_for(RESOURCE, WAIT, |r| r.connected && r.allocatable == healthy)
            .await;
        let state = state.unwrap_or_else(|| {
            panic!(
                "{RESOURCE} never had {healthy} healthy device(s): {:?}\n{}",
                self.kubelet.resource(RESOURCE),
                self.driver.log()
            )
        });
        state
            .devices
            .into_iter()
            .map(|(id, d)| (id, d.health))
            .collect()
    }

    async fn stop(self) {
        self.driver.stop();
        self.kubelet.stop().await;
        drop(self.dir);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allocate_gives_the_card_node_its_name_and_the_bitstreams() {
    let host = Host::with_cards(&[("fpga0", "operating"), ("fpga1", "operating")]);
    let node = Node::start(&host).await;
    let devices = node.wait_allocatable(2).await;
    let healthy = |id: &str| (id.to_string(), "Healthy".to_string());
    assert_eq!(devices, [healthy("fpga0"), healthy("fpga1")]);

    let one = node.kubelet.allocate(RESOURCE, &["fpga1"]).await.unwrap();
    assert_eq!(one.devices.len(), 1, "{one:?}");
    assert_eq!(one.devices[0].host_path, "/dev/fpga1");
    assert_eq!(one.devices[0].container_path, "/dev/fpga1");
    assert_eq!(one.devices[0].permissions, "rw");
    assert_eq!(one.envs["FPGA_CARDS"], "fpga1");
    assert_eq!(one.mounts.len(), 1, "{one:?}");
    assert_eq!(one.mounts[0].host_path, "/lib/firmware");
    assert!(one.mounts[0].read_only);

    // Two cards in one container: both nodes, both names, the bitstreams once.
    let both = node
        .kubelet
        .allocate(RESOURCE, &["fpga0", "fpga1"])
        .await
        .unwrap();
    let nodes: Vec<_> = both.devices.iter().map(|d| d.host_path.as_str()).collect();
    assert_eq!(nodes, ["/dev/fpga0", "/dev/fpga1"]);
    assert_eq!(both.envs["FPGA_CARDS"], "fpga0,fpga1");
    assert_eq!(both.mounts.len(), 1, "{both:?}");

    // A card the driver does not have is an error naming it.
    let err = node
        .kubelet
        .allocate(RESOURCE, &["fpga7"])
        .await
        .unwrap_err();
    assert!(err.message().contains("fpga7"), "{err:?}");
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_card_is_unhealthy_while_it_does_not_operate_and_leaves_when_it_is_gone() {
    let host = Host::with_cards(&[("fpga0", "operating"), ("fpga1", "operating")]);
    let node = Node::start(&host).await;
    node.wait_allocatable(2).await;

    // The FPGA manager is loading a new bitstream into fpga1.
    host.set_state("fpga1", "write");
    let devices = node.wait_allocatable(1).await;
    assert_eq!(devices[1], ("fpga1".to_string(), "Unhealthy".to_string()));
    let err = node
        .kubelet
        .allocate(RESOURCE, &["fpga1"])
        .await
        .unwrap_err();
    assert!(err.message().contains("fpga1"), "{err:?}");

    host.set_state("fpga1", "operating");
    node.wait_allocatable(2).await;
    let a = node.kubelet.allocate(RESOURCE, &["fpga1"]).await.unwrap();
    assert_eq!(a.envs["FPGA_CARDS"], "fpga1");

    // A card that goes away (hot-unplug) leaves the list.
    host.remove("fpga0");
    let devices = node.wait_allocatable(1).await;
    assert_eq!(devices, [("fpga1".to_string(), "Healthy".to_string())]);
    node.stop().await;
}
