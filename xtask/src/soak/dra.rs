//! The DRA soak: each step is a pod's claims created in the API server, prepared in one
//! `NodePrepareResources` call, unprepared in the next and deleted, as happens when the pod goes
//! away. Mixed in: claims the API server does not have, claims of a device the backend cannot
//! prepare, claims deleted while still prepared, unprepare of claims never prepared, and a
//! device that goes missing and comes back.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail, ensure};
use kubedev_testkit::apiserver::{ApiServer, Resource};
use kubedev_testkit::kubelet::{ClaimId, DraKubelet};
use serde_json::json;

use super::{Args, Daemon, Probe, Soak, WAIT, Workload};

pub(super) const DRIVER: &str = "gpu.example.com";
pub(super) const NODE: &str = "node-soak";
/// The namespace of every claim: a metric series that names it is a series per claim.
pub(super) const NAMESPACE: &str = "churn";
/// Devices every pod's claims get, one each.
const DEVICES: usize = 4;
/// The device that goes missing and comes back (never claimed).
pub(super) const FLAKY: &str = "gpu-flaky";

/// Runs the DRA soak with `bin`.
pub(super) async fn run(bin: &Path, args: &Args) -> anyhow::Result<Soak> {
    let mut node = Node::new(args.parent_dir(), 20, "").await?;
    let daemon = node.start(bin).await?;
    let probe = Probe {
        pid: daemon.0.id(),
        smaps: args.smaps_dir.clone().map(|d| (d, "dra")),
        metrics_port: node.metrics_port,
        checkpoint: Some(node.path().join("state").join("kubedev-checkpoint.json")),
        api_port: Some(node.api.addr().port()),
        dirs: vec![
            node.path().join("cdi"),
            node.path().join("plugins").join("dra-device-metadata"),
        ],
    };
    let (samples, new_series, per_second) =
        super::drive(&probe, &mut node, args, args.claims, |s| {
            s.contains(NAMESPACE)
        })
        .await?;
    daemon.stop()?;
    node.kubelet.stop().await;
    node.api.shutdown().await;
    Ok(Soak {
        what: format!(
            "DRA, {} claims after {} of warm-up ({DEVICES} claims a pod, static backend)",
            args.claims, args.warmup
        ),
        unit: "claims",
        samples,
        new_series,
        per_second,
    })
}

/// The working directory and the emulators.
pub(super) struct Node {
    dir: tempfile::TempDir,
    pub(super) api: ApiServer,
    pub(super) kubelet: DraKubelet,
    pub(super) metrics_port: u16,
    /// The next pod's number.
    pod: u64,
}

impl Workload for Node {
    async fn step(&mut self) -> anyhow::Result<u64> {
        self.one_pod(self.pod).await?;
        self.pod += 1;
        Ok(DEVICES as u64)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.path().join("daemon.log")).unwrap_or_default()
    }
}

impl Node {
    /// The node's files in a new directory under `parent`; the static backend polls its
    /// devices' presence every `poll_ms`. `extra` follows the static backend's section in the
    /// configuration: more backends, then top-level keys.
    pub(super) async fn new(
        parent: Option<&Path>,
        poll_ms: u64,
        extra: &str,
    ) -> anyhow::Result<Node> {
        Node::with_slice_qps(parent, poll_ms, extra, 5).await
    }

    /// [`Node::new`] with the ResourceSlice publisher sending `qps` requests a second (0: no
    /// limit).
    pub(super) async fn with_slice_qps(
        parent: Option<&Path>,
        poll_ms: u64,
        extra: &str,
        qps: u32,
    ) -> anyhow::Result<Node> {
        let dir = super::node_dir(parent)?;
        let r = dir.path();
        let api = ApiServer::start().await?;
        api.write_kubeconfig(&r.join("kubeconfig"))?;
        api.put_raw(
            Resource::Nodes,
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "uid": "node-soak-uid"}}),
        )?;
        std::fs::write(r.join("boot_id"), "50a50a50-0000-4000-8000-000000000001\n")?;
        std::fs::create_dir_all(r.join("present"))?;
        let mut devices = String::new();
        let names = (0..DEVICES)
            .map(|i| format!("gpu-{i}"))
            .chain([FLAKY.to_string()]);
        for name in names {
            std::fs::write(r.join("present").join(&name), "")?;
            devices.push_str(&format!(
                "      - name: {name}\n        deviceNodes: [\"/dev/null\"]\n        presencePath: {}/present/{name}\n",
                r.display()
            ));
        }
        let metrics_port = super::free_port()?;
        std::fs::write(
            r.join("kubedev.yaml"),
            format!(
                "nodeName: {NODE}\nstateDir: {r}/backend-state\nmetrics:\n  address: 127.0.0.1:{metrics_port}\n  podResourcesSocket: {r}/pod-resources.sock\ndra:\n  enabled: true\n  driverName: {DRIVER}\n  kubeconfig: {r}/kubeconfig\n  pluginDir: {r}/plugins\n  registryDir: {r}/registry\n  cdiDir: {r}/cdi\n  stateDir: {r}/state\n  bootIdPath: {r}/boot_id\n  deviceMetadata: true\n  sliceRequests: {{qps: {qps}}}\nbackends:\n  static:\n    pool: {NODE}\n    pollIntervalMs: {poll_ms}\n    devices:\n{devices}{extra}",
                r = r.display()
            ),
        )?;
        let kubelet = DraKubelet::start(r.join("registry"))?;
        Ok(Node {
            dir,
            api,
            kubelet,
            metrics_port,
            pod: 0,
        })
    }

    pub(super) fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Starts the daemon and waits until it registered with the kubelet.
    pub(super) async fn start(&self, bin: &Path) -> anyhow::Result<Daemon> {
        let daemon = Daemon::spawn(
            bin,
            &self.path().join("kubedev.yaml"),
            &self.path().join("daemon.log"),
        )?;
        if !self
            .kubelet
            .wait_until(WAIT, |k| k.drivers().contains_key(DRIVER))
            .await
        {
            bail!(
                "the daemon did not register with the kubelet; its log:\n{}",
                self.log()
            );
        }
        Ok(daemon)
    }

    /// Puts the claim `name` allocated `device` into the API server, reserved for a pod.
    fn put_claim(&self, name: &str, uid: &str, device: &str) -> anyhow::Result<ClaimId> {
        self.api.put_raw(
            Resource::ResourceClaims,
            json!({
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"name": name, "namespace": NAMESPACE, "uid": uid},
                "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu"}}]}},
                "status": {
                    "allocation": {"devices": {"results": [
                        {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": device}
                    ]}},
                    "reservedFor": [{"resource": "pods", "name": format!("{name}-pod"), "uid": format!("{uid}-pod")}]
                }
            }),
        )?;
        Ok(ClaimId::new(NAMESPACE, name, uid))
    }

    fn delete_claim(&self, id: &ClaimId) -> anyhow::Result<()> {
        self.api
            .delete_raw(Resource::ResourceClaims, Some(NAMESPACE), &id.name)
            .with_context(|| format!("claim {} was not in the API server", id.name))?;
        Ok(())
    }

    pub(super) fn set_present(&self, name: &str, present: bool) -> anyhow::Result<()> {
        let path: PathBuf = self.path().join("present").join(name);
        if present {
            std::fs::write(path, "")?;
        } else {
            std::fs::remove_file(path)?;
        }
        Ok(())
    }

    /// The claims of pod number `cycle`, with this pod's failures mixed in.
    async fn one_pod(&self, cycle: u64) -> anyhow::Result<()> {
        let mut claims = Vec::with_capacity(DEVICES + 2);
        for i in 0..DEVICES {
            let name = format!("c{cycle}-{i}");
            claims.push(self.put_claim(&name, &format!("u{cycle}-{i}"), &format!("gpu-{i}"))?);
        }
        // A claim the API server does not have (deleted before the kubelet got to it).
        let missing = (cycle % 10 == 3).then(|| {
            ClaimId::new(
                NAMESPACE,
                &format!("gone{cycle}"),
                &format!("gone-u{cycle}"),
            )
        });
        // A claim of a device the backend does not have: prepare fails for it alone.
        let broken = if cycle % 10 == 6 {
            Some(self.put_claim(
                &format!("bad{cycle}"),
                &format!("bad-u{cycle}"),
                "gpu-absent",
            )?)
        } else {
            None
        };
        let mut call = claims.clone();
        call.extend(missing.iter().cloned());
        call.extend(broken.iter().cloned());
        let answers = self.kubelet.prepare(DRIVER, &call).await?;
        for id in &claims {
            match answers.get(&id.uid) {
                Some(Ok(devices)) if devices.len() == 1 => {}
                other => bail!("prepare of {}: {other:?}", id.name),
            }
        }
        for id in missing.iter().chain(broken.iter()) {
            ensure!(
                matches!(answers.get(&id.uid), Some(Err(_))),
                "prepare of {} should have failed: {:?}",
                id.name,
                answers.get(&id.uid)
            );
        }
        // The device that comes and goes: health changes while claims are prepared.
        if cycle.is_multiple_of(25) {
            self.set_present(FLAKY, !cycle.is_multiple_of(50))?;
        }
        // The pod went away and the claim with it before the kubelet unprepared it.
        if cycle % 10 == 8 {
            self.delete_claim(&claims[0])?;
        }
        let mut un = call.clone();
        // Unprepare of a claim never prepared (the kubelet repeats itself after a restart).
        if cycle % 10 == 1 {
            un.push(ClaimId::new(
                NAMESPACE,
                &format!("never{cycle}"),
                &format!("never-u{cycle}"),
            ));
        }
        let answers = self.kubelet.unprepare(DRIVER, &un).await?;
        for id in &un {
            match answers.get(&id.uid) {
                Some(Ok(())) => {}
                other => bail!("unprepare of {}: {other:?}", id.name),
            }
        }
        for (i, id) in claims.iter().enumerate() {
            if !(cycle % 10 == 8 && i == 0) {
                self.delete_claim(id)?;
            }
        }
        if let Some(id) = &broken {
            self.delete_claim(id)?;
        }
        Ok(())
    }
}
