//! The driver as a DRA driver, against kubedev's API-server and kubelet emulators: it publishes
//! the cards as a ResourceSlice, prepares a claim into a CDI spec (device nodes, `FPGA_CARDS`
//! joined across the claim's cards, the bitstreams), reports a card that stops operating on the
//! resource health stream, and removes the spec on unprepare.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::PathBuf;

use common::{Daemon, Host, WAIT, eventually};
use kubedev_testkit::apiserver::{ApiServer, Resource};
use kubedev_testkit::kubelet::{ClaimId, DraKubelet};
use serde_json::{Value, json};

const DRIVER: &str = "fpga.example.com";
const NODE: &str = "node-a";
const POOL: &str = "node-a-fpga";

/// A node as the driver sees it in DRA mode: the API server (with the Node object), the
/// kubelet's DRA side, and the driver's directories.
struct Env {
    root: tempfile::TempDir,
    api: ApiServer,
    kubelet: DraKubelet,
}

impl Env {
    async fn new(host: &Host) -> Env {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        let api = ApiServer::builder().start().await.unwrap();
        api.write_kubeconfig(&r.join("kubeconfig")).unwrap();
        let node = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "uid": "node-uid-1"}});
        api.put_raw(Resource::Nodes, node).unwrap();
        std::fs::write(r.join("boot_id"), "5a0c2e9f-1111-4000-8000-00000000abcd\n").unwrap();
        std::fs::write(
            r.join("fpga.yaml"),
            format!(
                "nodeName: {NODE}\nhostRoot: {host}\nstateDir: {r}/state\ndra:\n  enabled: true\n  driverName: {DRIVER}\n  kubeconfig: {r}/kubeconfig\n  pluginDir: {r}/plugins\n  registryDir: {r}/registry\n  cdiDir: {r}/cdi\n  bootIdPath: {r}/boot_id\nbackends:\n  fpga:\n    bitstreamDir: /lib/firmware\n",
                host = host.path().display(),
                r = r.display()
            ),
        )
        .unwrap();
        let kubelet = DraKubelet::start(r.join("registry")).unwrap();
        Env { root, api, kubelet }
    }

    async fn start_driver(&self) -> Daemon {
        let driver = Daemon::start(&self.root.path().join("fpga.yaml"));
        let registered = self
            .kubelet
            .wait_until(WAIT, |k| k.drivers().contains_key(DRIVER))
            .await;
        assert!(registered, "{DRIVER} did not register: {}", driver.log());
        driver
    }

    /// A claim allocated `cards` of this node, as the scheduler leaves it in the API server.
    fn claim(&self, name: &str, uid: &str, cards: &[&str]) -> ClaimId {
        let results: Vec<_> = cards
            .iter()
            .map(|c| json!({"request": "fpga", "driver": DRIVER, "pool": POOL, "device": c}))
            .collect();
        let claim = json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "default", "uid": uid},
            "spec": {"devices": {"requests": [{"name": "fpga", "exactly": {"deviceClassName": DRIVER, "count": cards.len()}}]}},
            "status": {"allocation": {"devices": {"results": results}}}
        });
        self.api.put_raw(Resource::ResourceClaims, claim).unwrap();
        ClaimId::new("default", name, uid)
    }

    fn slices(&self) -> Vec<Value> {
        let ours = |s: &Value| s["spec"]["driver"] == DRIVER && s["spec"]["nodeName"] == NODE;
        self.api
            .objects(Resource::ResourceSlices)
            .into_iter()
            .filter(ours)
            .collect()
    }

    fn cdi_files(&self) -> Vec<PathBuf> {
        let dir = std::fs::read_dir(self.root.path().join("cdi"));
        let mut files: Vec<PathBuf> = dir
            .map(|d| d.map(|e| e.unwrap().path()).collect())
            .unwrap_or_default();
        files.retain(|p| p.extension().is_some_and(|e| e == "json"));
        files
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_is_prepared_into_a_cdi_spec_and_a_card_out_of_operation_is_reported() {
    let host = Host::with_cards(&[("fpga0", "operating"), ("fpga1", "operating")]);
    let env = Env::new(&host).await;
    let driver = env.start_driver().await;

    // The cards are published in the pool <node>-fpga.
    eventually("the ResourceSlice", || !env.slices().is_empty()).await;
    let slice = &env.slices()[0];
    assert_eq!(slice["spec"]["pool"]["name"], POOL);
    let names: Vec<_> = slice["spec"]["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| &d["name"])
        .collect();
    assert_eq!(names, ["fpga0", "fpga1"]);

    // Prepare: one CDI device per card, in one spec file for the claim.
    let claim = env.claim("accel", "claim-uid-1", &["fpga0", "fpga1"]);
    let answer = env
        .kubelet
        .prepare(DRIVER, std::slice::from_ref(&claim))
        .await
        .unwrap();
    let prepared = answer["claim-uid-1"].as_ref().unwrap();
    let cards: Vec<_> = prepared
        .iter()
        .map(|d| (d.pool.as_str(), d.device.as_str()))
        .collect();
    assert_eq!(cards, [(POOL, "fpga0"), (POOL, "fpga1")]);
    let files = env.cdi_files();
    assert_eq!(files.len(), 1, "{files:?}");
    let spec: Value = serde_json::from_slice(&std::fs::read(&files[0]).unwrap()).unwrap();
    let kind = spec["kind"].as_str().unwrap();
    for (i, card) in ["fpga0", "fpga1"].into_iter().enumerate() {
        let device = &spec["devices"][i];
        let id = format!("{kind}={}", device["name"].as_str().unwrap());
        assert_eq!(prepared[i].cdi_device_ids, [id]);
        let edits = &device["containerEdits"];
        assert_eq!(
            edits["deviceNodes"][0]["path"],
            format!("/dev/{card}"),
            "{spec:#}"
        );
        // Each card sets FPGA_CARDS; CDI gives every device the value of the whole claim, so
        // the container sees both names whichever device the runtime applies last.
        assert_eq!(
            applied(&spec, i, "env"),
            [json!("FPGA_CARDS=fpga0,fpga1")],
            "{spec:#}"
        );
        let mounts = applied(&spec, i, "mounts");
        assert_eq!(mounts.len(), 1, "{spec:#}");
        assert_eq!(mounts[0]["hostPath"], "/lib/firmware", "{spec:#}");
    }

    // fpga1 stops operating: the kubelet hears it on the resource health stream.
    let health = |card: &str| {
        env.kubelet
            .health(DRIVER)
            .get(&format!("{POOL}/{card}"))
            .cloned()
    };
    eventually("health for both cards", || {
        health("fpga0").is_some() && health("fpga1").is_some()
    })
    .await;
    assert_eq!(health("fpga1").unwrap().health, "HEALTHY");
    host.set_state("fpga1", "power off");
    eventually("fpga1 unhealthy", || {
        health("fpga1").is_some_and(|h| h.health == "UNHEALTHY")
    })
    .await;
    assert!(
        health("fpga1").unwrap().message.contains("power off"),
        "{:?}",
        health("fpga1")
    );
    assert_eq!(health("fpga0").unwrap().health, "HEALTHY");

    // Unprepare removes the claim's spec.
    let answer = env.kubelet.unprepare(DRIVER, &[claim]).await.unwrap();
    assert!(answer["claim-uid-1"].is_ok(), "{answer:?}");
    assert!(env.cdi_files().is_empty(), "{:?}", env.cdi_files());
    driver.stop();
}

/// The `key` edits a runtime applies for device `i` of `spec`: the spec's own edits, which every
/// device of the spec shares, then the device's.
fn applied(spec: &Value, i: usize, key: &str) -> Vec<Value> {
    let list = |edits: &Value| edits[key].as_array().cloned().unwrap_or_default();
    let mut all = list(&spec["containerEdits"]);
    all.extend(list(&spec["devices"][i]["containerEdits"]));
    all
}
