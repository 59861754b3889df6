//! The DRA kubelet plugin over real Unix sockets, against the kubelet emulator's DRA side.
#![allow(clippy::unwrap_used)]

use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use kubedev_core::{ClaimRef, DriverName, Health};
use kubedev_kubelet_grpc::dra::{
    ClaimError, DeviceHealthReport, DraHandler, DraPlugin, DraPluginConfig, DraPluginHandle,
    PreparedClaimDevice,
};
use kubedev_testkit::kubelet::{ClaimId, DraKubelet, KubeletRelease};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

const DRIVER: &str = "gpu.example.com";
const WAIT: Duration = Duration::from_secs(10);

#[derive(Default)]
struct Handler {
    prepared: Mutex<BTreeMap<String, ClaimRef>>,
    unprepared: Mutex<Vec<String>>,
    delay: Duration,
}

#[async_trait]
impl DraHandler for Handler {
    async fn prepare(&self, claim: &ClaimRef) -> Result<Vec<PreparedClaimDevice>, ClaimError> {
        tokio::time::sleep(self.delay).await;
        if claim.name.as_str().starts_with("bad") {
            return Err(ClaimError::permanent(
                "not_allocated",
                format!("claim {} is not allocated", claim.name),
            ));
        }
        if claim.name.as_str().starts_with("busy") {
            return Err(ClaimError::retryable(
                "device_in_use",
                format!("claim {}: its device is busy", claim.name),
            ));
        }
        self.prepared
            .lock()
            .insert(claim.uid.to_string(), claim.clone());
        Ok(vec![PreparedClaimDevice {
            request_names: vec!["gpu".into()],
            pool: "node-a".into(),
            device: format!("gpu-{}", claim.name),
            cdi_device_ids: vec![format!("k8s.{DRIVER}/claim={}-gpu", claim.uid)],
            share_id: claim
                .name
                .as_str()
                .starts_with("shared")
                .then(|| "s1".to_string()),
        }])
    }

    async fn unprepare(&self, claim: &ClaimRef) -> Result<(), ClaimError> {
        self.unprepared.lock().push(claim.uid.to_string());
        Ok(())
    }
}

struct Fixture {
    _dir: tempfile::TempDir,
    kubelet: DraKubelet,
    plugin: DraPluginHandle,
    handler: Arc<Handler>,
    health: watch::Sender<Vec<DeviceHealthReport>>,
}

async fn fixture(versions: &[&str], handler: Handler) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let registry = dir.path().join("plugins_registry");
    let kubelet = DraKubelet::start_with_versions(&registry, versions).unwrap();
    let cfg = DraPluginConfig::new(DriverName::new(DRIVER).unwrap())
        .plugin_dir(dir.path().join("plugins").join(DRIVER))
        .registry_dir(&registry)
        .health(true);
    let (health, rx) = watch::channel(vec![DeviceHealthReport {
        pool: "node-a".into(),
        device: "gpu-0".into(),
        health: Health::healthy(),
        last_updated: 100,
        timeout_seconds: 0,
    }]);
    let handler = Arc::new(handler);
    let plugin = DraPlugin::start(cfg, handler.clone(), rx, CancellationToken::new()).unwrap();
    assert!(
        plugin.wait_registered(WAIT).await,
        "{:?} {:?}",
        plugin.status(),
        kubelet.rejected()
    );
    Fixture {
        _dir: dir,
        kubelet,
        plugin,
        handler,
        health,
    }
}

#[tokio::test]
async fn registers_with_get_info_and_the_kubelet_chooses_v1() {
    let f = fixture(&["v1.DRAPlugin", "v1beta1.DRAPlugin"], Handler::default()).await;
    let d = &f.kubelet.drivers()[DRIVER];
    assert_eq!(d.chosen, "v1.DRAPlugin");
    assert_eq!(
        &d.supported_versions[..2],
        ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
    );
    assert_eq!(d.endpoint, f.plugin.dra_socket().display().to_string());
    assert!(std::path::Path::new(&d.endpoint).is_absolute());
    assert_eq!(d.health_service.as_deref(), Some("v1.DRAResourceHealth"));
    assert!(
        f.plugin
            .registration_socket()
            .ends_with(format!("{DRIVER}-reg.sock"))
    );
}

async fn prepare_unprepare_in(versions: &[&str]) {
    let f = fixture(versions, Handler::default()).await;
    let claims = [
        ClaimId::new("default", "a", "uid-a"),
        ClaimId::new("default", "bad-b", "uid-b"),
        ClaimId::new("team", "shared-c", "uid-c"),
    ];
    let out = f.kubelet.prepare(DRIVER, &claims).await.unwrap();
    assert_eq!(out.len(), 3, "every claim has an entry");
    let a = out["uid-a"].as_ref().unwrap();
    assert_eq!(a[0].device, "gpu-a");
    assert_eq!(a[0].request_names, ["gpu"]);
    assert_eq!(
        a[0].cdi_device_ids,
        [format!("k8s.{DRIVER}/claim=uid-a-gpu")]
    );
    let err = out["uid-b"].as_ref().unwrap_err();
    assert!(err.contains("bad-b"), "{err}");
    assert!(err.contains("(permanent: retrying cannot succeed"), "{err}");
    let c = out["uid-c"].as_ref().unwrap();
    if versions[0] == "v1.DRAPlugin" {
        assert_eq!(c[0].share_id.as_deref(), Some("s1"));
    } else {
        assert_eq!(c[0].share_id, None, "v1beta1 has no share ID");
    }
    assert_eq!(f.handler.prepared.lock()["uid-c"].namespace, "team");
    let out = f.kubelet.unprepare(DRIVER, &claims).await.unwrap();
    assert_eq!(out.len(), 3);
    assert!(out.values().all(|r| r.is_ok()));
    // An empty request is fine too.
    assert!(f.kubelet.prepare(DRIVER, &[]).await.unwrap().is_empty());
}

#[tokio::test]
async fn prepare_and_unprepare_over_v1() {
    prepare_unprepare_in(&["v1.DRAPlugin", "v1beta1.DRAPlugin"]).await;
}

#[tokio::test]
async fn prepare_and_unprepare_over_v1beta1_for_an_older_kubelet() {
    let f = fixture(&["v1beta1.DRAPlugin"], Handler::default()).await;
    assert_eq!(f.kubelet.drivers()[DRIVER].chosen, "v1beta1.DRAPlugin");
    drop(f);
    prepare_unprepare_in(&["v1beta1.DRAPlugin"]).await;
}

#[tokio::test]
async fn malformed_claims_fail_alone() {
    let f = fixture(&["v1.DRAPlugin"], Handler::default()).await;
    let claims = [
        ClaimId::new("", "x", "uid-x"),
        ClaimId::new("default", "y", "uid-y"),
        // Names no API server stores: a path traversal, and a namespace that is no DNS label.
        ClaimId::new("default", "../../../api/v1/nodes/x", "uid-t"),
        ClaimId::new("Default", "train", "uid-n"),
    ];
    let out = f.kubelet.prepare(DRIVER, &claims).await.unwrap();
    let err = |uid: &str| out[uid].as_ref().unwrap_err().clone();
    assert!(
        err("uid-x").contains("claims[0].namespace"),
        "{}",
        err("uid-x")
    );
    assert!(out["uid-y"].is_ok());
    assert!(
        err("uid-t")
            .starts_with("claims[2].name: invalid claim name \"../../../api/v1/nodes/x\": "),
        "{}",
        err("uid-t")
    );
    assert!(
        err("uid-n").starts_with("claims[3].namespace: invalid namespace \"Default\": "),
        "{}",
        err("uid-n")
    );
    // Only the well-formed claim reached the driver.
    let reached: Vec<String> = f.handler.prepared.lock().keys().cloned().collect();
    assert_eq!(reached, ["uid-y"]);
}

#[tokio::test]
async fn the_kubelet_learns_which_failures_retrying_cannot_fix() {
    let f = fixture(&["v1.DRAPlugin"], Handler::default()).await;
    let claims = [
        ClaimId::new("default", "busy-a", "uid-a"),
        ClaimId::new("default", "bad-b", "uid-b"),
        // Not a UID the driver can put in a file or CDI device name.
        ClaimId::new("default", "c", "../../etc"),
    ];
    let out = f.kubelet.prepare(DRIVER, &claims).await.unwrap();
    assert_eq!(
        out["uid-a"].as_ref().unwrap_err(),
        "claim busy-a: its device is busy",
        "a retryable failure is the message alone"
    );
    assert!(out["uid-b"].as_ref().unwrap_err().ends_with(
        "(permanent: retrying cannot succeed until the claim or the driver's configuration changes)"
    ));
    let bad_uid = out["../../etc"].as_ref().unwrap_err();
    assert!(bad_uid.contains("claims[2].uid"), "{bad_uid}");
    assert!(bad_uid.contains("permanent"), "{bad_uid}");
    assert!(f.handler.prepared.lock().is_empty());
}

#[tokio::test]
async fn claims_are_prepared_concurrently() {
    let f = fixture(
        &["v1.DRAPlugin"],
        Handler {
            delay: Duration::from_millis(300),
            ..Default::default()
        },
    )
    .await;
    let claims: Vec<_> = (0..8)
        .map(|i| ClaimId::new("ns", &format!("c{i}"), &format!("u{i}")))
        .collect();
    let t = Instant::now();
    let out = f.kubelet.prepare(DRIVER, &claims).await.unwrap();
    assert_eq!(out.len(), 8);
    assert!(
        t.elapsed() < Duration::from_millis(1500),
        "took {:?}",
        t.elapsed()
    );
}

#[tokio::test]
async fn health_stream_sends_snapshots_on_change() {
    let f = fixture(&["v1.DRAPlugin"], Handler::default()).await;
    assert!(
        f.kubelet
            .wait_until(WAIT, |k| k
                .health(DRIVER)
                .get("node-a/gpu-0")
                .is_some_and(|h| h.health == "HEALTHY"))
            .await
    );
    f.health.send_modify(|d| {
        d[0].health = Health::unhealthy("Xid 79");
        d[0].last_updated = 200;
    });
    assert!(
        f.kubelet
            .wait_until(WAIT, |k| k
                .health(DRIVER)
                .get("node-a/gpu-0")
                .is_some_and(|h| h.health == "UNHEALTHY"))
            .await
    );
    let seen = &f.kubelet.health(DRIVER)["node-a/gpu-0"];
    assert_eq!(seen.message, "Xid 79");
    assert_eq!(seen.last_updated, 200);
}

fn report(device: &str, timeout_seconds: i64) -> DeviceHealthReport {
    DeviceHealthReport {
        pool: "node-a".into(),
        device: device.into(),
        health: Health::unhealthy(format!("{device} is failing")),
        last_updated: 100,
        timeout_seconds,
    }
}

#[tokio::test]
async fn the_kubelet_shows_a_device_left_out_of_the_reports_as_unknown_after_its_timeout() {
    let f = fixture(&["v1.DRAPlugin"], Handler::default()).await;
    f.health
        .send_replace(vec![report("gpu-0", 0), report("gpu-1", 1)]);
    let shows = |device: &'static str, health: &'static str| {
        move |k: &DraKubelet| {
            k.health(DRIVER)
                .get(&format!("node-a/{device}"))
                .is_some_and(|h| h.health == health)
        }
    };
    assert!(
        f.kubelet
            .wait_until(WAIT, shows("gpu-1", "UNHEALTHY"))
            .await
    );
    let seen = f.kubelet.health(DRIVER);
    assert_eq!(seen["node-a/gpu-1"].timeout_seconds, 1);
    assert_eq!(seen["node-a/gpu-1"].message, "gpu-1 is failing");
    assert_eq!(seen["node-a/gpu-0"].timeout_seconds, 0);

    // gpu-1 is no longer reported: the kubelet keeps what it had for its timeout, then shows
    // Unknown without the message; gpu-0, reported again and again, stays as reported.
    f.health.send_replace(vec![report("gpu-0", 0)]);
    let start = Instant::now();
    while start.elapsed() < WAIT && !shows("gpu-1", "UNKNOWN")(&f.kubelet) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let seen = f.kubelet.health(DRIVER);
    assert_eq!(seen["node-a/gpu-1"].health, "UNKNOWN", "{seen:?}");
    assert_eq!(seen["node-a/gpu-1"].message, "");
    assert_eq!(seen["node-a/gpu-0"].health, "UNHEALTHY");

    // The stream ends with the plugin: the kubelet forgets the driver's devices.
    f.plugin.stop().await;
    assert!(
        f.kubelet
            .wait_until(WAIT, |k| k.health(DRIVER).is_empty())
            .await
    );
}

/// A plugin registered with a kubelet of `release`, health on or off, reporting gpu-0 as in
/// [`report`].
struct Registered {
    _dir: tempfile::TempDir,
    kubelet: DraKubelet,
    plugin: DraPluginHandle,
    _health: watch::Sender<Vec<DeviceHealthReport>>,
}

async fn registered(release: KubeletRelease, health: bool) -> Registered {
    let dir = tempfile::tempdir().unwrap();
    let registry = dir.path().join("plugins_registry");
    let kubelet = DraKubelet::start_release(&registry, release).unwrap();
    let cfg = DraPluginConfig::new(DriverName::new(DRIVER).unwrap())
        .plugin_dir(dir.path().join("plugins").join(DRIVER))
        .registry_dir(&registry)
        .health(health);
    let (tx, rx) = watch::channel(vec![report("gpu-0", 0)]);
    let plugin = DraPlugin::start(
        cfg,
        Arc::new(Handler::default()),
        rx,
        CancellationToken::new(),
    )
    .unwrap();
    assert!(plugin.wait_registered(WAIT).await);
    Registered {
        _dir: dir,
        kubelet,
        plugin,
        _health: tx,
    }
}

#[tokio::test]
async fn without_health_nothing_is_advertised_and_a_stray_stream_is_unimplemented() {
    let Registered {
        _dir,
        _health,
        kubelet,
        plugin,
    } = registered(KubeletRelease::default(), false).await;
    let d = &kubelet.drivers()[DRIVER];
    assert!(
        !d.supported_versions
            .iter()
            .any(|v| v.contains("DRAResourceHealth")),
        "{:?}",
        d.supported_versions
    );
    assert_eq!(d.health_service, None);

    // A kubelet that opens the stream anyway (1.36 does) hears at once that there is none,
    // on both versions.
    use kubedev_kubelet_grpc::authority::{ClientAuthority, dial};
    use kubedev_kubelet_grpc::pb::drahealth::{v1, v1alpha1};
    let channel = dial(plugin.dra_socket(), ClientAuthority::Localhost, WAIT)
        .await
        .unwrap();
    let started = Instant::now();
    let v1 = v1::dra_resource_health_client::DraResourceHealthClient::new(channel.clone())
        .node_watch_resources(v1::NodeWatchResourcesRequest {})
        .await
        .map(|_| ())
        .unwrap_err();
    assert_eq!(v1.code(), tonic::Code::Unimplemented, "{v1:?}");
    let alpha = v1alpha1::dra_resource_health_client::DraResourceHealthClient::new(channel)
        .node_watch_resources(v1alpha1::NodeWatchResourcesRequest {})
        .await
        .map(|_| ())
        .unwrap_err();
    assert_eq!(alpha.code(), tonic::Code::Unimplemented, "{alpha:?}");
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    assert!(kubelet.health(DRIVER).is_empty());
    assert!(
        kubelet.health_calls(DRIVER).is_empty(),
        "a 1.37+ kubelet asks only where told"
    );
    plugin.stop().await;
}

/// A 1.36 kubelet opens the health stream of every plugin and opens it again 5 s after it
/// failed: a plugin without health answers `Unimplemented` each time, at once; with health on,
/// the same kubelet gets the reports over `v1alpha1`.
#[tokio::test]
async fn a_1_36_kubelet_asking_every_plugin_for_health_hears_unimplemented_or_the_reports() {
    for health in [false, true] {
        let Registered {
            _dir,
            _health,
            kubelet,
            plugin,
        } = registered(KubeletRelease::V1_36, health).await;
        if health {
            assert!(
                kubelet
                    .wait_until(WAIT, |k| k
                        .health(DRIVER)
                        .get("node-a/gpu-0")
                        .is_some_and(|h| h.health == "UNHEALTHY"))
                    .await
            );
            assert!(
                kubelet.health_calls(DRIVER).is_empty(),
                "the stream stays open"
            );
        } else {
            let twice = kubelet
                .wait_until(Duration::from_secs(8), |k| {
                    k.health_calls(DRIVER).len() >= 2
                })
                .await;
            assert!(twice, "{:?}", kubelet.health_calls(DRIVER));
            assert_eq!(
                kubelet.health_calls(DRIVER)[..2],
                ["Unimplemented", "Unimplemented"]
            );
        }
        plugin.stop().await;
    }
}

#[tokio::test]
async fn rejected_registration_is_recorded_and_stop_removes_sockets() {
    let f = fixture(&["v1.DRAPlugin"], Handler::default()).await;
    let (dra, reg) = (
        f.plugin.dra_socket().to_path_buf(),
        f.plugin.registration_socket().to_path_buf(),
    );
    assert!(dra.exists() && reg.exists());
    f.plugin.stop().await;
    assert!(!dra.exists() && !reg.exists());
    assert!(
        f.kubelet.wait_until(WAIT, |k| k.drivers().is_empty()).await,
        "driver still registered"
    );

    // A kubelet that speaks no version we offer rejects us; we record its reason.
    let dir = tempfile::tempdir().unwrap();
    let registry = dir.path().join("reg");
    let kubelet = DraKubelet::start_with_versions(&registry, &["v2.DRAPlugin"]).unwrap();
    let cfg = DraPluginConfig::new(DriverName::new(DRIVER).unwrap())
        .plugin_dir(dir.path().join("p"))
        .registry_dir(&registry);
    let (_tx, rx) = watch::channel(vec![]);
    let plugin = DraPlugin::start(
        cfg,
        Arc::new(Handler::default()),
        rx,
        CancellationToken::new(),
    )
    .unwrap();
    let mut tries = 0;
    while plugin.status().last_error.is_none() && tries < 200 {
        tokio::time::sleep(Duration::from_millis(25)).await;
        tries += 1;
    }
    let err = plugin.status().last_error.unwrap();
    assert!(err.contains("v1.DRAPlugin"), "{err}");
    assert!(!plugin.status().registered);
    assert_eq!(kubelet.rejected().len(), 1);
}
