//! The device-plugin soak: each step is a pod given two of the node's GPUs, as the kubelet's
//! device manager does it: `GetPreferredAllocation` over the healthy devices, then `Allocate`
//! of the choice (CDI mode, so the resource's CDI spec is rewritten). Mixed in: a kubelet
//! restart every [`RESTART_EVERY`] pods (the kubelet's socket and the plugin's removed, the
//! `ListAndWatch` stream cut; kubedev registers again and the kubelet opens a new stream), a
//! device that goes missing and comes back, `Allocate` of a device the node does not have, and
//! the resource's selection policy replaced in the watched policy directory every
//! `--reload-every` pods, alternating NUMA packing and spreading over PCIe roots; each reload is
//! waited for until `GetPreferredAllocation` chooses as the new module does.

use std::path::Path;

use anyhow::{Context as _, bail, ensure};
use kubedev_testkit::kubelet::KubeletEmulator;

use super::{Args, Daemon, Probe, Soak, WAIT, Workload};

/// The policies the resource's module alternates between, from `cargo xtask build-plugins`:
/// NUMA packing (two GPUs of one PCIe root) and spreading (one GPU per root).
const POLICIES: [&str; 2] = ["numa-pack", "spread"];
/// The module's name in the policy directory (the resource's `policy`).
const POLICY: &str = "choose";

const RESOURCE: &str = "example.com/gpu";
/// The GPUs pods get.
const DEVICES: usize = 4;
/// The device that goes missing and comes back.
const FLAKY: &str = "gpu-flaky";
/// How many pods between two kubelet restarts.
const RESTART_EVERY: u64 = 2_500;

/// Runs the device-plugin soak with `bin`.
pub(super) async fn run(root: &Path, bin: &Path, args: &Args) -> anyhow::Result<Soak> {
    let wasm = root.join(crate::plugins::WASM_DIR);
    // Without reloads the resource has no policy: NUMA packing, nothing to build first.
    let names: &[&str] = if args.reload_every > 0 {
        &POLICIES
    } else {
        &[]
    };
    let policies = names
        .iter()
        .map(|p| {
            let path = wasm.join(format!("{p}.wasm"));
            std::fs::read(&path).with_context(|| {
                format!(
                    "reading {} (run `cargo xtask build-plugins` first)",
                    path.display()
                )
            })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let mut node = Node::new(args.parent_dir(), policies, args.reload_every).await?;
    let daemon = Daemon::spawn(
        bin,
        &node.path().join("kubedev.yaml"),
        &node.path().join("daemon.log"),
    )?;
    node.wait_served().await?;
    let probe = Probe {
        pid: daemon.0.id(),
        smaps: args.smaps_dir.clone().map(|d| (d, "device-plugin")),
        metrics_port: node.metrics_port,
        checkpoint: None,
        api_port: None,
        dirs: Vec::new(),
    };
    let (samples, new_series, per_second) =
        super::drive(&probe, &mut node, args, args.pods, |s| s.contains("pod-")).await?;
    daemon.stop()?;
    let (restarts, reloads) = (node.restarts, node.reloads);
    node.kubelet.stop().await;
    Ok(Soak {
        what: format!(
            "device plugin, {} pods after {} of warm-up (2 GPUs a pod, CDI mode, in all \
             {restarts} kubelet restarts and {reloads} policy reloads)",
            args.pods, args.warmup
        ),
        unit: "pods",
        samples,
        new_series,
        per_second,
    })
}

/// The working directory and the kubelet emulator.
struct Node {
    dir: tempfile::TempDir,
    kubelet: KubeletEmulator,
    metrics_port: u16,
    /// The next pod's number.
    pod: u64,
    /// Kubelet restarts so far.
    restarts: u64,
    /// The modules of [`POLICIES`].
    policies: Vec<Vec<u8>>,
    /// Pods between two policy reloads (0: never).
    reload_every: u64,
    /// Policy reloads so far; the module in place is `policies[reloads % 2]`.
    reloads: u64,
}

impl Workload for Node {
    async fn step(&mut self) -> anyhow::Result<u64> {
        let pod = self.pod;
        self.pod += 1;
        if pod > 0 && pod.is_multiple_of(RESTART_EVERY) {
            self.kubelet.restart().await?;
            self.restarts += 1;
            self.wait_served().await?;
        }
        if pod.is_multiple_of(100) {
            let present = self.path().join("present").join(FLAKY);
            if pod.is_multiple_of(200) {
                std::fs::write(&present, "")?;
            } else {
                std::fs::remove_file(&present)?;
            }
        }
        if self.reload_every > 0 && pod > 0 && pod.is_multiple_of(self.reload_every) {
            self.reload().await?;
        }
        self.one_pod(pod).await?;
        Ok(1)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.path().join("daemon.log")).unwrap_or_default()
    }
}

impl Node {
    /// The node's files in a new directory under `parent`; the kubelet emulator listening.
    async fn new(
        parent: Option<&Path>,
        policies: Vec<Vec<u8>>,
        reload_every: u64,
    ) -> anyhow::Result<Node> {
        let dir = super::node_dir(parent)?;
        let r = dir.path();
        std::fs::create_dir_all(r.join("policies"))?;
        let policy = match policies.first() {
            Some(module) => {
                std::fs::write(r.join("policies").join(format!("{POLICY}.wasm")), module)?;
                format!("      policy: {POLICY}\n")
            }
            None => String::new(),
        };
        std::fs::create_dir_all(r.join("present"))?;
        std::fs::create_dir_all(r.join("device-plugins"))?;
        let mut devices = String::new();
        let names = (0..DEVICES)
            .map(|i| format!("gpu-{i}"))
            .chain([FLAKY.to_string()]);
        for (i, name) in names.enumerate() {
            std::fs::write(r.join("present").join(&name), "")?;
            devices.push_str(&format!(
                "      - name: {name}\n        numaNode: {}\n        attributes:\n          resource.kubernetes.io/pcieRoot: {{string: \"pci0000:{:02x}\"}}\n        deviceNodes: [\"/dev/null\"]\n        presencePath: {}/present/{name}\n",
                i / 2,
                i / 2,
                r.display()
            ));
        }
        let metrics_port = super::free_port()?;
        std::fs::write(
            r.join("kubedev.yaml"),
            format!(
                "stateDir: {r}/backend-state\nmetrics:\n  address: 127.0.0.1:{metrics_port}\n  podResourcesSocket: {r}/pod-resources.sock\ndevicePlugin:\n  directory: {r}/device-plugins\n  cdi: true\n  cdiDir: {r}/cdi\n  policyDir: {r}/policies\n  resources:\n    - name: {RESOURCE}\n{policy}backends:\n  static:\n    pool: node-soak\n    pollIntervalMs: 20\n    devices:\n{devices}",
                r = r.display()
            ),
        )?;
        let kubelet = KubeletEmulator::start(r.join("device-plugins")).await?;
        Ok(Node {
            dir,
            kubelet,
            metrics_port,
            pod: 0,
            restarts: 0,
            policies,
            reload_every,
            reloads: 0,
        })
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Waits until kubedev registered the resource and the kubelet follows its device list.
    async fn wait_served(&self) -> anyhow::Result<()> {
        if self
            .kubelet
            .wait_for(RESOURCE, WAIT, |r| r.connected && r.capacity == DEVICES + 1)
            .await
            .is_none()
        {
            bail!(
                "the kubelet does not see kubedev's {} devices of {RESOURCE} (after {} \
                 restarts): {:?}; the daemon's log:\n{}",
                DEVICES + 1,
                self.restarts,
                self.kubelet.resource(RESOURCE),
                super::tail(&self.log())
            );
        }
        Ok(())
    }

    /// Replaces the policy module with the other one (a new file renamed over the old, as a
    /// ConfigMap update does) and waits until `GetPreferredAllocation` chooses as it does.
    async fn reload(&mut self) -> anyhow::Result<()> {
        self.reloads += 1;
        let spread = self.reloads % 2 == 1;
        let dir = self.path().join("policies");
        let staged = dir.join(".staged");
        std::fs::write(&staged, &self.policies[usize::from(spread)])?;
        std::fs::rename(&staged, dir.join(format!("{POLICY}.wasm")))?;
        let deadline = std::time::Instant::now() + WAIT;
        loop {
            let chosen = self.choose().await?;
            // gpu-0 and gpu-1 share a PCIe root, as do gpu-2 and gpu-3.
            let roots: std::collections::BTreeSet<char> = chosen
                .iter()
                .filter_map(|d| d.strip_prefix("gpu-"))
                .filter_map(|n| n.parse::<u8>().ok())
                .map(|n| if n < 2 { 'a' } else { 'b' })
                .collect();
            if (roots.len() == 2) == spread {
                return Ok(());
            }
            ensure!(
                std::time::Instant::now() < deadline,
                "reload {} ({}) not in effect after {WAIT:?}: still chose {chosen:?}",
                self.reloads,
                POLICIES[usize::from(spread)]
            );
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    }

    /// `GetPreferredAllocation` of two of the four GPUs.
    async fn choose(&self) -> anyhow::Result<Vec<String>> {
        let available: Vec<String> = (0..DEVICES).map(|i| format!("gpu-{i}")).collect();
        let chosen = self
            .kubelet
            .preferred_allocation(RESOURCE, &available, &[], 2)
            .await
            .context("GetPreferredAllocation")?;
        ensure!(
            chosen.len() == 2,
            "GetPreferredAllocation chose {chosen:?} for 2 devices"
        );
        Ok(chosen)
    }

    /// Pod number `pod`: two devices chosen and allocated; every 50th pod also asks for a
    /// device the node does not have, which must fail.
    async fn one_pod(&self, pod: u64) -> anyhow::Result<()> {
        let chosen = self.choose().await?;
        let ids: Vec<&str> = chosen.iter().map(String::as_str).collect();
        let answer = self
            .kubelet
            .allocate(RESOURCE, &ids)
            .await
            .context("Allocate")?;
        ensure!(
            answer.cdi_devices.len() == 1,
            "Allocate of {ids:?} answered {} CDI devices",
            answer.cdi_devices.len()
        );
        if pod.is_multiple_of(50) {
            let refused = self.kubelet.allocate(RESOURCE, &["gpu-absent"]).await;
            ensure!(
                refused.is_err(),
                "Allocate of a device the node does not have succeeded: {refused:?}"
            );
        }
        Ok(())
    }
}
