//! The daemon's HTTP endpoint: Prometheus metrics (devices, registrations, publishes, prepare
//! timings, holders from the pod resources API), `/healthz` and `/readyz`.

use std::sync::Arc;
use std::time::Duration;

use crate::common::{self, Claims, Daemon, Slices};
use kubedev::runtime::ClusterServices;
use kubedev_testkit::kubelet::{
    ClaimId, DraKubelet, KubeletEmulator, KubeletRelease, PodResourcesEmulator,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const DRIVER: &str = "devices.example.com";
const WAIT: Duration = Duration::from_secs(10);

async fn get(port: u16, path: &str) -> (u16, String) {
    // Not listening yet: status 0, so `wait_for` tries again.
    let Ok(mut s) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await else {
        return (0, String::new());
    };
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    let status = out
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = out
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

async fn wait_for(port: u16, path: &str, ok: impl Fn(u16, &str) -> bool) -> (u16, String) {
    common::eventually(WAIT, || async {
        let (status, body) = get(port, path).await;
        if ok(status, &body) {
            Ok((status, body))
        } else {
            Err(format!("{path}: {status}\n{body}"))
        }
    })
    .await
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[tokio::test]
async fn metrics_and_probes_follow_the_daemon() {
    let root = tempfile::tempdir().unwrap();
    let r = root.path();
    for d in ["dp", "registry", "pod-resources"] {
        std::fs::create_dir_all(r.join(d)).unwrap();
    }
    std::fs::write(r.join("boot_id"), "8b7c1f6e-0000-4000-8000-0000000000aa\n").unwrap();
    let port = free_port();
    let path = r.join("kubedev.yaml");
    let cfg = common::write_config(
        &path,
        &format!(
            "nodeName: node-a
metrics:
  address: 127.0.0.1:{port}
  podResourcesSocket: {r}/pod-resources/kubelet.sock
  podResourcesIntervalSeconds: 1
devicePlugin:
  directory: {r}/dp
  resources:
    - name: example.com/gpu
      selector:
        attributes:
          type: {{string: gpu}}
{dra}backends:
  static:
    pool: node-a
    devices:
      - {{name: gpu-0, attributes: {{type: {{string: gpu}}}}}}
      - {{name: gpu-1, attributes: {{type: {{string: gpu}}}}}}
      - {{name: nic-0, deviceNodes: [/dev/null], attributes: {{type: {{string: nic}}}}}}
",
            r = r.display(),
            dra = common::dra_section(DRIVER, r, &r.join("plugins")),
        ),
    );
    let claims = Arc::new(Claims::default());
    let cluster = ClusterServices {
        claims: claims.clone(),
        slices: Arc::new(Slices::reporting_writes()),
        events: None,
        api: None,
    };
    let daemon = Daemon::spawn(cfg, &path, Some(cluster));

    // No kubelet yet: alive, but not ready, and /readyz says why.
    let (_, body) = wait_for(port, "/readyz", |s, _| s == 503).await;
    assert!(body.contains("example.com/gpu is not registered"), "{body}");
    assert_eq!(get(port, "/healthz").await.0, 200);

    let mut dp_kubelet = KubeletEmulator::start(r.join("dp")).await.unwrap();
    let dra_kubelet = DraKubelet::start(r.join("registry")).unwrap();
    let pods = PodResourcesEmulator::start(&r.join("pod-resources/kubelet.sock")).unwrap();
    pods.assign_devices("ml", "trainer", "main", "example.com/gpu", &["gpu-1"]);
    wait_for(port, "/readyz", |s, _| s == 200).await;

    // A claim prepared and unprepared through the kubelet.
    claims.allocate("uid-1", "nic", &[common::device("node-a", "nic-0")]);
    let claim = ClaimId {
        namespace: "ml".into(),
        uid: "uid-1".into(),
        name: "nic".into(),
    };
    let answers = dra_kubelet
        .prepare(DRIVER, std::slice::from_ref(&claim))
        .await
        .unwrap();
    assert!(answers["uid-1"].is_ok(), "{:?}", answers["uid-1"]);
    // And one that fails: not allocated.
    let bad = ClaimId {
        uid: "uid-2".into(),
        ..claim.clone()
    };
    let answers = dra_kubelet.prepare(DRIVER, &[bad]).await.unwrap();
    assert!(answers["uid-2"].is_err());

    let (_, m) = wait_for(port, "/metrics", |_, b| b.contains("pod=\"trainer\"")).await;
    for want in [
        "kubedev_devices{api=\"device-plugin\",resource=\"example.com/gpu\",pool=\"node-a\",health=\"Healthy\"} 2",
        "kubedev_devices{api=\"dra\",resource=\"devices.example.com\",pool=\"node-a\",health=\"Healthy\"} 1",
        "kubedev_kubelet_registrations_total{api=\"device-plugin\",resource=\"example.com/gpu\"} 1",
        "kubedev_kubelet_registrations_total{api=\"dra\",resource=\"devices.example.com\"} 1",
        "kubedev_dra_operation_duration_seconds_count{operation=\"prepare\"} 2",
        "kubedev_dra_operation_errors_total{operation=\"prepare\",reason=\"claim_lookup\",retry=\"permanent\"} 1",
        "kubedev_device_held{api=\"device-plugin\",resource=\"example.com/gpu\",device=\"gpu-1\",namespace=\"ml\",pod=\"trainer\",container=\"main\"} 1",
    ] {
        assert!(m.contains(want), "missing {want} in\n{m}");
    }
    // How the emulated kubelet called each socket, as the daemon saw it: the methods, the
    // DRA service it chose, and the `:authority` its release sends (the cluster tests hold
    // the real kubelet to the same).
    let dialing = KubeletRelease::default().dialing();
    let expected = [
        (
            "/pluginregistration.Registration/GetInfo",
            &dialing.registration,
        ),
        (
            "/pluginregistration.Registration/NotifyRegistrationStatus",
            &dialing.registration,
        ),
        (
            "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources",
            &dialing.dra,
        ),
        // Health is on in this configuration, and advertised: kubelets from 1.37 open `v1`.
        ("/v1.DRAResourceHealth/NodeWatchResources", &dialing.dra),
        (
            "/v1beta1.DevicePlugin/GetDevicePluginOptions",
            &dialing.device_plugin,
        ),
        ("/v1beta1.DevicePlugin/ListAndWatch", &dialing.device_plugin),
    ];
    for (method, authority) in expected {
        let series = format!(
            "kubedev_kubelet_requests_total{{method=\"{method}\",authority=\"{}\"}}",
            authority.label()
        );
        assert!(m.contains(&series), "missing {series} in\n{m}");
    }
    let requests: Vec<&str> = m
        .lines()
        .filter(|l| l.starts_with("kubedev_kubelet_requests_total{"))
        .collect();
    assert_eq!(requests.len(), expected.len(), "{requests:#?}");
    assert!(
        m.contains("kubedev_resourceslice_publishes_total{result=\"ok\"}"),
        "{m}"
    );
    // The publisher's own API writes, as it counts them.
    assert!(
        m.contains("kubedev_resourceslice_writes_total{operation=\"failure\"} 1"),
        "{m}"
    );
    assert!(
        !m.contains("kubedev_resourceslice_writes_total{operation=\"create\"} 0"),
        "{m}"
    );

    // A kubelet restart is a re-registration.
    dp_kubelet.restart().await.unwrap();
    wait_for(port, "/metrics", |_, b| {
        b.contains("kubedev_kubelet_registrations_total{api=\"device-plugin\",resource=\"example.com/gpu\"} 2")
    })
    .await;

    // A socket that stops answering makes /healthz fail, naming it.
    let dra_socket = std::fs::read_dir(r.join("plugins"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "sock"))
        .unwrap();
    std::fs::remove_file(&dra_socket).unwrap();
    let (status, body) = get(port, "/healthz").await;
    assert_eq!(status, 503);
    assert!(body.contains(&dra_socket.display().to_string()), "{body}");
    assert_eq!(get(port, "/nope").await.0, 404);

    daemon.stop().await;
    pods.stop().await;
    dp_kubelet.stop().await;
    dra_kubelet.stop().await;
}

#[tokio::test]
async fn policy_calls_and_fuel_are_counted_per_resource_and_outcome() {
    let root = tempfile::tempdir().unwrap();
    let r = root.path();
    std::fs::create_dir_all(r.join("dp")).unwrap();
    let trap = common::trapping_policy();
    std::fs::write(r.join("trap.wasm"), trap).unwrap();
    let gpus: String = (0..4)
        .map(|i| {
            format!(
                "      - {{name: gpu-{i}, numaNode: 0, attributes: {{type: {{string: gpu}}, resource.kubernetes.io/pcieRoot: {{string: \"pci0000:{:02x}\"}}}}}}\n",
                i / 2
            )
        })
        .collect();
    let port = free_port();
    let path = r.join("kubedev.yaml");
    let text = format!(
        "metrics:
  address: 127.0.0.1:{port}
devicePlugin:
  directory: {r}/dp
  resources:
    - name: example.com/gpu
      policy: {spread}
      selector:
        attributes:
          type: {{string: gpu}}
    - name: example.com/nic
      policy: {r}/trap.wasm
      selector:
        attributes:
          type: {{string: nic}}
backends:
  static:
    pool: node-a
    devices:
{gpus}      - {{name: nic-0, numaNode: 0, attributes: {{type: {{string: nic}}}}}}
      - {{name: nic-1, numaNode: 1, attributes: {{type: {{string: nic}}}}}}
      - {{name: nic-2, numaNode: 0, attributes: {{type: {{string: nic}}}}}}
",
        r = r.display(),
        spread = common::plugin("spread").display(),
    );
    let node = common::DevicePluginDaemon::start(&path, &text, &r.join("dp")).await;
    let kubelet = &node.kubelet;
    for (resource, n) in [("example.com/gpu", 4), ("example.com/nic", 3)] {
        kubelet
            .wait_for(resource, WAIT, |s| s.connected && s.capacity == n)
            .await
            .unwrap();
    }
    let ids = |prefix: &str, n: usize| (0..n).map(|i| format!("{prefix}-{i}")).collect::<Vec<_>>();
    for _ in 0..2 {
        let got = kubelet
            .preferred_allocation("example.com/gpu", &ids("gpu", 4), &[], 2)
            .await
            .unwrap();
        assert_eq!(
            got,
            ["gpu-0", "gpu-2"],
            "spread takes one GPU per PCIe root"
        );
    }
    // The trapping policy falls back to NUMA packing.
    let got = kubelet
        .preferred_allocation("example.com/nic", &ids("nic", 3), &[], 2)
        .await
        .unwrap();
    assert_eq!(got, ["nic-0", "nic-2"]);

    let (_, m) = wait_for(port, "/metrics", |s, _| s == 200).await;
    for want in [
        "kubedev_policy_calls_total{resource=\"example.com/gpu\",result=\"ok\"} 2",
        "kubedev_policy_fuel_count{resource=\"example.com/gpu\"} 2",
        "kubedev_policy_calls_total{resource=\"example.com/nic\",result=\"error\"} 1",
    ] {
        assert!(m.contains(want), "missing {want} in\n{m}");
    }
    for absent in [
        "kubedev_policy_calls_total{resource=\"example.com/gpu\",result=\"error\"}",
        "kubedev_policy_fuel_count{resource=\"example.com/nic\"} 1",
    ] {
        assert!(!m.contains(absent), "unexpected {absent} in\n{m}");
    }
    node.stop().await;
}
