//! What kubedev adds to pod start-up: 100 pods with a claim each, started ten at a time, and
//! the real kubelet's own DRA metrics read before and after (the gRPC calls it made to kubedev
//! and its whole prepare step), beside kubedev's own histogram of the same prepares.

use std::collections::BTreeMap;

use super::*;

/// Pods started in all, and at once.
const PODS: usize = 100;
const AT_ONCE: usize = 10;

/// Their namespace: admin access is allowed there, so every pod's claim may have the same device
/// and the pods need not wait for each other's devices.
const STARTUP_NAMESPACE: &str = "kubedev-startup";

pub(super) fn pod_startup(node: &Node, _root: &Path) -> anyhow::Result<()> {
    let result = run(node);
    let _ = node.kubectl_out(&[
        "delete",
        "namespace",
        STARTUP_NAMESPACE,
        "--ignore-not-found",
        "--wait=true",
        "--timeout=180s",
    ]);
    result
}

fn run(node: &Node) -> anyhow::Result<()> {
    apply(
        node,
        &format!(
            r#"apiVersion: v1
kind: Namespace
metadata:
  name: {STARTUP_NAMESPACE}
  labels:
    resource.kubernetes.io/admin-access: "true"
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata:
  name: shared-device
  namespace: {STARTUP_NAMESPACE}
spec:
  spec:
    devices:
      requests:
        - name: dev
          exactly:
            deviceClassName: {CLASS}
            adminAccess: true
"#
        ),
    )?;
    let kubelet_before = kubelet_metrics(node)?;
    let kubedev_before = kubedev_metrics(node)?;
    let started = Instant::now();
    for round in 0..PODS / AT_ONCE {
        let names: Vec<String> = (0..AT_ONCE)
            .map(|i| format!("start-{:03}", round * AT_ONCE + i))
            .collect();
        let manifests: Vec<String> = names.iter().map(|n| pod(n)).collect();
        apply(node, &manifests.join("---\n"))?;
        wait_for(
            &format!("pods {} to {} running", names[0], names[AT_ONCE - 1]),
            Duration::from_secs(180),
            || {
                let pods = get_json(node, &["pods", "-n", STARTUP_NAMESPACE])?;
                let running = pods["items"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter(|p| p["status"]["phase"] == "Running")
                    .count();
                Ok(running == AT_ONCE)
            },
        )?;
        node.kubectl_out(&[
            "delete",
            "pods",
            "--all",
            "-n",
            STARTUP_NAMESPACE,
            "--wait=true",
            "--timeout=120s",
        ])?;
    }
    let took = started.elapsed();
    let kubelet = delta(&kubelet_before, &kubelet_metrics(node)?);
    let kubedev = delta(&kubedev_before, &kubedev_metrics(node)?);

    let grpc = Histogram::of(
        &kubelet,
        "dra_grpc_operations_duration_seconds",
        &[&format!("driver_name=\"{DRIVER}\""), "NodePrepareResources"],
    );
    let step = Histogram::of(
        &kubelet,
        "dra_operations_duration_seconds",
        &["operation_name=\"PrepareResources\""],
    );
    let own = Histogram::of(
        &kubedev,
        "kubedev_dra_operation_duration_seconds",
        &["operation=\"prepare\""],
    );
    eprintln!(
        "  {PODS} pods with a claim each started and deleted, {AT_ONCE} at a time, in {took:.1?}"
    );
    eprintln!("  the kubelet's NodePrepareResources calls to kubedev: {grpc}");
    eprintln!("  the kubelet's whole DRA prepare step per pod:        {step}");
    eprintln!("  kubedev's own prepare of each claim:                  {own}");
    ensure!(
        grpc.count >= PODS as f64,
        "the kubelet recorded {} prepare calls to kubedev for {PODS} pods",
        grpc.count
    );
    ensure!(
        own.count >= PODS as f64,
        "kubedev recorded {} prepares for {PODS} pods",
        own.count
    );
    Ok(())
}

/// A busybox pod of the startup namespace with a claim from `shared-device`.
fn pod(name: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
  namespace: {STARTUP_NAMESPACE}
spec:
  hostNetwork: true
  terminationGracePeriodSeconds: 0
  enableServiceLinks: false
  automountServiceAccountToken: false
  resourceClaims:
    - name: dev
      resourceClaimTemplateName: shared-device
  containers:
    - name: main
      image: {busybox}
      imagePullPolicy: Never
      command: ["/bin/sleep", "3600"]
      resources:
        claims:
          - name: dev
"#,
        busybox = image::BUSYBOX,
    )
}

/// Every sample of a Prometheus text exposition: the series (name and labels) and its value.
pub(super) type Samples = BTreeMap<String, f64>;

fn parse(text: &str) -> Samples {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            Some((series.to_string(), value.parse().ok()?))
        })
        .collect()
}

/// The kubelet's metrics, read from its own port with the admin's certificate (the node reports
/// no address the API server's proxy could use: only loopback, which the kubelet leaves out).
fn kubelet_metrics(node: &Node) -> anyhow::Result<Samples> {
    Ok(parse(&node.kubectl_out(&[
        "--server=https://127.0.0.1:10250",
        "get",
        "--raw",
        "/metrics",
    ])?))
}

/// kubedev's metrics, from its pod's address on the bridge.
pub(super) fn kubedev_metrics(node: &Node) -> anyhow::Result<Samples> {
    let text = crate::commands::http_get(
        &daemon_metrics_address(node)?,
        "/metrics",
        std::time::Duration::from_secs(30),
    )?;
    Ok(parse(&text))
}

/// What grew between two readings.
fn delta(before: &Samples, after: &Samples) -> Samples {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0.0)))
        .collect()
}

/// A histogram's observations over a run: count, sum, and cumulative counts by upper bound.
struct Histogram {
    count: f64,
    sum: f64,
    buckets: Vec<(f64, f64)>,
}

impl Histogram {
    /// The series of histogram `name` whose labels contain every one of `labels`, summed.
    fn of(samples: &Samples, name: &str, labels: &[&str]) -> Histogram {
        let matching = |series: &str, suffix: &str| {
            series.starts_with(&format!("{name}{suffix}"))
                && labels.iter().all(|l| series.contains(l))
        };
        let mut buckets: BTreeMap<String, (f64, f64)> = BTreeMap::new();
        let (mut count, mut sum) = (0.0, 0.0);
        for (series, value) in samples {
            if matching(series, "_count") {
                count += value;
            } else if matching(series, "_sum") {
                sum += value;
            } else if matching(series, "_bucket")
                && let Some(le) = series
                    .split("le=\"")
                    .nth(1)
                    .and_then(|r| r.split('"').next())
            {
                let bound = if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse().unwrap_or(f64::INFINITY)
                };
                buckets.entry(le.to_string()).or_insert((bound, 0.0)).1 += value;
            }
        }
        let mut buckets: Vec<(f64, f64)> = buckets.into_values().collect();
        buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        Histogram {
            count,
            sum,
            buckets,
        }
    }

    /// The upper bound of the bucket the `q` quantile falls in.
    fn quantile(&self, q: f64) -> f64 {
        let wanted = q * self.count;
        self.buckets
            .iter()
            .find(|(_, c)| *c >= wanted)
            .map_or(f64::INFINITY, |(le, _)| *le)
    }
}

impl std::fmt::Display for Histogram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mean = if self.count > 0.0 {
            self.sum / self.count
        } else {
            0.0
        };
        write!(
            f,
            "{} observed, mean {:.1} ms, p50 <= {:.0} ms, p99 <= {:.0} ms (bucket bounds)",
            self.count,
            mean * 1000.0,
            self.quantile(0.5) * 1000.0,
            self.quantile(0.99) * 1000.0
        )
    }
}
