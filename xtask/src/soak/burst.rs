//! The burst: one `NodePrepareResources` call of thousands of claims through the daemon's real
//! socket, as a kubelet hands over every claim of a node it restarted on, or a pod of many
//! claims: each claim answered within the kubelet's deadline, the daemon's memory and its
//! connections to the API server bounded while it works, and nothing left after one
//! `NodeUnprepareResources` of them all. The same calls serve the real cluster's scale test.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use kubedev_kubelet_grpc::authority::{ClientAuthority, dial};
use kubedev_kubelet_grpc::pb::dra::v1 as pb;
use kubedev_testkit::apiserver::Resource;
use serde_json::json;

use super::dra::{DRIVER, NAMESPACE, NODE, Node};
use super::{Args, Daemon, entries_under, tcp_sockets_to};

/// The kubelet's deadline for one call to a DRA plugin.
pub(crate) const KUBELET_DEADLINE: Duration = Duration::from_secs(45);

/// The most connections the daemon may hold to the API server while it reads a burst's claims.
pub(crate) const MAX_API_CONNECTIONS: usize = 64;

/// The most resident memory the daemon may reach during a burst, well within the chart's 256 MiB
/// limit (it reached 266 MiB, and the chart's pods were killed, before claims were read a few
/// dozen at a time and the checkpoint written without copies of itself).
const MAX_PEAK_MIB: u64 = 160;

/// A claim as the kubelet names it: namespace, name, UID.
pub(crate) type ClaimName = (String, String, String);

/// What one call answered.
pub(crate) struct Answered {
    /// Claims with an answer.
    pub(crate) answers: usize,
    /// `uid: error` of each claim that failed.
    pub(crate) failed: Vec<String>,
    /// The devices the first claim (in UID order) was prepared with.
    pub(crate) first_devices: Vec<String>,
    pub(crate) took: Duration,
}

impl Answered {
    /// Fails unless every one of `claims` claims was answered without an error.
    pub(crate) fn all_ok(&self, what: &str, claims: usize) -> anyhow::Result<()> {
        ensure!(
            self.answers == claims && self.failed.is_empty(),
            "{what}: {} of {claims} claims answered, {} failed{}",
            self.answers,
            self.failed.len(),
            self.failed
                .iter()
                .take(3)
                .map(|f| format!("\n  {f}"))
                .collect::<String>()
        );
        Ok(())
    }
}

/// A client of the DRA plugin at `socket`, dialed as the kubelet does, with its deadline.
pub(crate) async fn plugin(
    socket: &Path,
) -> anyhow::Result<pb::dra_plugin_client::DraPluginClient<tonic::transport::Channel>> {
    let channel = dial(socket, ClientAuthority::Localhost, KUBELET_DEADLINE).await?;
    Ok(pb::dra_plugin_client::DraPluginClient::new(channel)
        .max_decoding_message_size(64 << 20)
        .max_encoding_message_size(64 << 20))
}

fn refs(claims: &[ClaimName]) -> Vec<pb::Claim> {
    claims
        .iter()
        .map(|(namespace, name, uid)| pb::Claim {
            namespace: namespace.clone(),
            uid: uid.clone(),
            name: name.clone(),
        })
        .collect()
}

/// `NodePrepareResources` of every claim in one call, within the kubelet's deadline.
pub(crate) async fn prepare_all(socket: &Path, claims: &[ClaimName]) -> anyhow::Result<Answered> {
    let mut plugin = plugin(socket).await?;
    let mut request = tonic::Request::new(pb::NodePrepareResourcesRequest {
        claims: refs(claims),
    });
    request.set_timeout(KUBELET_DEADLINE);
    let started = Instant::now();
    let answer = plugin.node_prepare_resources(request).await;
    let took = started.elapsed();
    let answer = answer
        .with_context(|| {
            format!(
                "NodePrepareResources of {} claims, after {took:.1?}",
                claims.len()
            )
        })?
        .into_inner();
    let mut answers: Vec<_> = answer.claims.into_iter().collect();
    answers.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(Answered {
        answers: answers.len(),
        failed: answers
            .iter()
            .filter(|(_, a)| !a.error.is_empty())
            .map(|(uid, a)| format!("{uid}: {}", a.error))
            .collect(),
        first_devices: answers
            .first()
            .map(|(_, a)| a.devices.iter().map(|d| d.device_name.clone()).collect())
            .unwrap_or_default(),
        took,
    })
}

/// `NodeUnprepareResources` of every claim in one call, within the kubelet's deadline.
pub(crate) async fn unprepare_all(socket: &Path, claims: &[ClaimName]) -> anyhow::Result<Answered> {
    let mut plugin = plugin(socket).await?;
    let mut request = tonic::Request::new(pb::NodeUnprepareResourcesRequest {
        claims: refs(claims),
    });
    request.set_timeout(KUBELET_DEADLINE);
    let started = Instant::now();
    let answer = plugin
        .node_unprepare_resources(request)
        .await
        .with_context(|| format!("NodeUnprepareResources of {} claims", claims.len()))?
        .into_inner();
    Ok(Answered {
        answers: answer.claims.len(),
        failed: answer
            .claims
            .iter()
            .filter(|(_, a)| !a.error.is_empty())
            .map(|(uid, a)| format!("{uid}: {}", a.error))
            .collect(),
        first_devices: Vec::new(),
        took: started.elapsed(),
    })
}

/// Samples, every 100 ms until stopped (lightly: the machine is busy with the calls), the most connections process `pid` holds to `port` at
/// once.
pub(crate) struct PeakConnections {
    stop: Arc<AtomicBool>,
    peak: Arc<AtomicUsize>,
    thread: std::thread::JoinHandle<()>,
}

impl PeakConnections {
    /// Starts sampling `count()` (connections of the daemon to the API server now).
    pub(crate) fn start(count: impl Fn() -> usize + Send + 'static) -> PeakConnections {
        let stop = Arc::new(AtomicBool::new(false));
        let peak = Arc::new(AtomicUsize::new(0));
        let thread = {
            let (stop, peak) = (stop.clone(), peak.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    peak.fetch_max(count(), Ordering::Relaxed);
                    std::thread::sleep(Duration::from_millis(100));
                }
            })
        };
        PeakConnections { stop, peak, thread }
    }

    /// The most seen at once.
    pub(crate) fn stop(self) -> usize {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.thread.join();
        self.peak.load(Ordering::Relaxed)
    }
}

/// The highest resident memory process `pid` has had, in KiB (`VmHWM`).
fn peak_rss_kib(pid: u32) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .context("no VmHWM in the daemon's status")
}

/// Runs the burst of `args.burst` claims with `bin`; returns its report (Markdown rows for
/// `cargo xtask bench`) or the first thing that went wrong.
pub(super) async fn run(bin: &Path, args: &Args) -> anyhow::Result<String> {
    let count = usize::try_from(args.burst)?;
    let node = Node::new(args.parent_dir(), 1_000, "").await?;
    let daemon: Daemon = node.start(bin).await?;
    let pid = daemon.0.id();
    let api_port = node.api.addr().port();
    let socket = node
        .kubelet
        .drivers()
        .get(DRIVER)
        .map(|d| d.endpoint.clone())
        .context("the daemon is not registered")?;
    let mut claims = Vec::with_capacity(count);
    for i in 0..count {
        let (name, uid) = (format!("burst-{i:05}"), format!("burst-u{i:05}"));
        // Admin access: every claim may have the same device at once.
        node.api.put_raw(
            Resource::ResourceClaims,
            json!({
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"name": name, "namespace": NAMESPACE, "uid": uid},
                "spec": {"devices": {"requests": [{"name": "gpu",
                    "exactly": {"deviceClassName": "gpu", "adminAccess": true}}]}},
                "status": {"allocation": {"devices": {"results": [{"request": "gpu",
                    "driver": DRIVER, "pool": NODE, "device": "gpu-0", "adminAccess": true}]}}}
            }),
        )?;
        claims.push((NAMESPACE.to_string(), name, uid));
    }
    let before_kib = peak_rss_kib(pid)?;
    let sampler = PeakConnections::start(move || tcp_sockets_to(pid, api_port).len());
    let prepared = prepare_all(Path::new(&socket), &claims).await;
    let connections = sampler.stop();
    let peak_kib = peak_rss_kib(pid)?;
    let prepared = prepared.with_context(|| tail(&node))?;
    prepared
        .all_ok("prepare", count)
        .with_context(|| tail(&node))?;
    ensure!(
        prepared.first_devices == ["gpu-0"],
        "the first claim was prepared with {:?}",
        prepared.first_devices
    );
    let unprepared = unprepare_all(Path::new(&socket), &claims).await?;
    unprepared
        .all_ok("unprepare", count)
        .with_context(|| tail(&node))?;
    let left = entries_under(&node.path().join("cdi"));
    daemon.stop()?;
    let report = format!(
        "| soak, a burst of {count} claims in one call: seconds to answer them all | {:.1} |\n\
         | soak, a burst of {count} claims: seconds to unprepare them all | {:.1} |\n\
         | soak, a burst of {count} claims: the daemon's peak resident memory, MiB | {:.1} (before the call {:.1}) |\n\
         | soak, a burst of {count} claims: most connections to the API server at once | {connections} |\n",
        prepared.took.as_secs_f64(),
        unprepared.took.as_secs_f64(),
        peak_kib as f64 / 1024.0,
        before_kib as f64 / 1024.0,
    );
    println!("\n{report}");
    if !args.measure_only {
        ensure!(
            prepared.took < KUBELET_DEADLINE,
            "the burst took {:.1?}, more than the kubelet waits",
            prepared.took
        );
        ensure!(
            peak_kib <= MAX_PEAK_MIB * 1024,
            "the daemon reached {} MiB resident during a burst of {count} claims (at most \
             {MAX_PEAK_MIB} MiB)",
            peak_kib / 1024
        );
        ensure!(
            connections <= MAX_API_CONNECTIONS,
            "the daemon held {connections} connections to the API server at once (at most \
             {MAX_API_CONNECTIONS})"
        );
        ensure!(left == 0, "{left} CDI files left after unprepare");
    }
    Ok(report)
}

fn tail(node: &Node) -> String {
    use super::Workload as _;
    format!("the daemon's log ends:\n{}", super::tail(&node.log()))
}
