//! Scale against the real API server and its default flow control: one `NodePrepareResources`
//! call of 10,000 claims answers each claim within the kubelet's deadline, kubedev keeps its
//! connections to the API server to a few dozen while it reads them, its container is not
//! restarted (the chart's memory limit holds), and every claim's status comes to name the
//! device.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};

use crate::soak::burst::{
    ClaimName, MAX_API_CONNECTIONS, PeakConnections, prepare_all, unprepare_all,
};

use super::*;

/// Claims in the one call.
const CLAIMS: usize = 10_000;

/// The namespace of the claims (admin access is allowed there, so all may share one device).
const SCALE_NAMESPACE: &str = "kubedev-scale";

/// How long kubedev may take to write every claim's status after answering.
const STATUS_WAIT: Duration = Duration::from_secs(240);

/// The API server's port.
const API_PORT: u16 = 6443;

pub(super) fn prepare_ten_thousand(node: &Node, _root: &Path) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let result = runtime.block_on(scale(node));
    // The claims go whatever happened.
    let _ = node.kubectl_out(&[
        "delete",
        "namespace",
        SCALE_NAMESPACE,
        "--ignore-not-found",
        "--wait=true",
        "--timeout=300s",
    ]);
    result
}

async fn scale(node: &Node) -> anyhow::Result<()> {
    let client = admin_client(node).await?;
    let (pool, device) = one_dra_device(node)?;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace = serde_json::from_value(serde_json::json!({
        "metadata": {
            "name": SCALE_NAMESPACE,
            "labels": {"resource.kubernetes.io/admin-access": "true"},
        }
    }))?;
    namespaces.create(&PostParams::default(), &ns).await?;

    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), SCALE_NAMESPACE);
    let started = Instant::now();
    let uids = create_allocated(&claims, pki::NODE, &pool, &device).await?;
    eprintln!(
        "  {CLAIMS} claims created and allocated to {pool}/{device} (admin access) in {:.1?}",
        started.elapsed()
    );

    let socket = dra_socket()?;
    let restarts_before = daemon_restarts(node)?;
    let named: Vec<ClaimName> = uids
        .iter()
        .map(|(name, uid)| (SCALE_NAMESPACE.to_string(), name.clone(), uid.clone()))
        .collect();
    let daemon = daemon_pid()?;
    let sampler = PeakConnections::start(move || api_connections(daemon));
    let (prepared, timed_out) =
        as_the_kubelet_retries("NodePrepareResources", || prepare_all(&socket, &named)).await;
    let peak = sampler.stop();
    let prepared = prepared?;
    eprintln!(
        "  NodePrepareResources of {CLAIMS} claims: {} answers, {} failed, in {:.1?} ({timed_out} \
         earlier calls past the deadline); at most {peak} connections from kubedev to the API \
         server",
        prepared.answers,
        prepared.failed.len(),
        prepared.took
    );
    prepared.all_ok("prepare", CLAIMS)?;
    ensure!(
        prepared.first_devices == [device.clone()],
        "the first claim was prepared with {:?}",
        prepared.first_devices
    );
    ensure!(
        peak <= MAX_API_CONNECTIONS,
        "kubedev opened {peak} connections to the API server at once (at most \
         {MAX_API_CONNECTIONS} expected)"
    );

    // Every claim's status comes to name kubedev's device, as the server stores it (kubedev
    // writes them after answering).
    let started = Instant::now();
    let mut with_status = 0;
    while started.elapsed() < STATUS_WAIT {
        let listed = claims.list(&ListParams::default()).await?;
        with_status = listed
            .items
            .iter()
            .filter(|c| {
                c.status
                    .as_ref()
                    .and_then(|s| s.devices.as_ref())
                    .is_some_and(|d| d.iter().any(|d| d.driver == DRIVER && d.device == device))
            })
            .count();
        if with_status == CLAIMS {
            break;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    eprintln!(
        "  {with_status} claims show {device} in status.devices after {:.1?}",
        started.elapsed()
    );
    ensure!(
        with_status == CLAIMS,
        "{with_status} of {CLAIMS} claims show the device in status.devices"
    );

    let (unprepared, unprepare_timed_out) =
        as_the_kubelet_retries("NodeUnprepareResources", || unprepare_all(&socket, &named)).await;
    let unprepared = unprepared?;
    let restarts = daemon_restarts(node)? - restarts_before;
    ensure!(
        restarts == 0,
        "kubedev's container restarted {restarts} times during the calls (killed for memory?)"
    );
    eprintln!(
        "  NodeUnprepareResources of {CLAIMS} claims: {} answers, {} failed, in {:.1?} \
         ({unprepare_timed_out} earlier calls past the deadline)",
        unprepared.answers,
        unprepared.failed.len(),
        unprepared.took
    );
    unprepared.all_ok("unprepare", CLAIMS)?;
    let left = cdi_files_naming(&uids[0].1).len();
    ensure!(left == 0, "{left} CDI specs left for an unprepared claim");

    namespaces
        .delete(SCALE_NAMESPACE, &DeleteParams::default())
        .await?;
    Ok(())
}

/// Makes a kubelet call as the kubelet does: a call that runs past its deadline is made again
/// (the claims done by then answer from kubedev's checkpoint), at most twice more. The last
/// outcome, and how many calls ran past the deadline before it.
async fn as_the_kubelet_retries<T, F>(
    what: &str,
    mut call: impl FnMut() -> F,
) -> (anyhow::Result<T>, usize)
where
    F: std::future::Future<Output = anyhow::Result<T>>,
{
    let mut timed_out = 0;
    loop {
        match call().await {
            Err(e) if timed_out < 2 && past_deadline(&e) => {
                timed_out += 1;
                eprintln!("  {what} ran past the kubelet's deadline; calling again");
            }
            other => return (other, timed_out),
        }
    }
}

/// Whether a call failed because it ran past its deadline.
fn past_deadline(e: &anyhow::Error) -> bool {
    e.chain()
        .filter_map(|c| c.downcast_ref::<tonic::Status>())
        .any(|s| {
            matches!(
                s.code(),
                tonic::Code::Cancelled | tonic::Code::DeadlineExceeded
            )
        })
}

/// How often kubedev's containers have restarted.
fn daemon_restarts(node: &Node) -> anyhow::Result<i64> {
    let pods = get_json(node, &["pods", "-n", KUBEDEV_NAMESPACE])?;
    Ok(pods["items"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|p| {
            p["status"]["containerStatuses"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .filter_map(|c| c["restartCount"].as_i64())
        .sum())
}

/// A client of the admin kubeconfig.
async fn admin_client(node: &Node) -> anyhow::Result<kube::Client> {
    let config = kube::config::Kubeconfig::read_from(node.kubeconfig())?;
    let config =
        kube::Config::from_custom_kubeconfig(config, &kube::config::KubeConfigOptions::default())
            .await?;
    Ok(kube::Client::try_from(config)?)
}

/// The pool and name of one device kubedev publishes for DRA.
fn one_dra_device(node: &Node) -> anyhow::Result<(String, String)> {
    let slices = get_json(node, &["resourceslices"])?;
    let wanted = dra_devices();
    for slice in slices["items"].as_array().into_iter().flatten() {
        if slice["spec"]["driver"] != DRIVER {
            continue;
        }
        let pool = slice["spec"]["pool"]["name"].as_str().unwrap_or_default();
        for d in slice["spec"]["devices"].as_array().into_iter().flatten() {
            if let Some(name) = d["name"].as_str()
                && wanted.contains(name)
            {
                return Ok((pool.to_string(), name.to_string()));
            }
        }
    }
    bail!("kubedev publishes none of {wanted:?}")
}

/// Creates the claims (64 at a time), each with admin access to `pool`/`device` on node
/// `node_name` written into its status as the scheduler would; returns (name, UID) of each.
async fn create_allocated(
    claims: &Api<ResourceClaim>,
    node_name: &str,
    pool: &str,
    device: &str,
) -> anyhow::Result<Vec<(String, String)>> {
    let template: ResourceClaim = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "x"},
        "spec": {"devices": {"requests": [{
            "name": "r",
            "exactly": {"deviceClassName": CLASS, "adminAccess": true},
        }]}},
    }))?;
    let status = serde_json::json!({"status": {"allocation": {"devices": {"results": [{
        "request": "r",
        "driver": DRIVER,
        "pool": pool,
        "device": device,
        "adminAccess": true,
    }]},
    // The node, as the scheduler writes it for a node's own pool: what lets the driver, whose
    // permission covers only claims of its node, write the claim's status.
    "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [{
        "key": "metadata.name", "operator": "In", "values": [node_name],
    }]}]}}}});
    let next = Arc::new(AtomicUsize::new(0));
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..64 {
        let (claims, template, status, next) = (
            claims.clone(),
            template.clone(),
            status.clone(),
            next.clone(),
        );
        workers.spawn(async move {
            let mut made = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= CLAIMS {
                    return anyhow::Ok(made);
                }
                let name = format!("scale-{i:05}");
                let mut claim = template.clone();
                claim.metadata.name = Some(name.clone());
                let created = claims.create(&PostParams::default(), &claim).await?;
                claims
                    .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
                    .await
                    .with_context(|| format!("allocating {name}"))?;
                made.push((name, created.metadata.uid.unwrap_or_default()));
            }
        });
    }
    let mut all = Vec::with_capacity(CLAIMS);
    while let Some(made) = workers.join_next().await {
        all.extend(made??);
    }
    all.sort();
    Ok(all)
}

/// kubedev's DRA socket under the kubelet's plugins directory.
fn dra_socket() -> anyhow::Result<PathBuf> {
    let dir = Path::new("/var/lib/kubelet/plugins").join(DRIVER);
    std::fs::read_dir(&dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "sock"))
        .with_context(|| format!("no socket in {}", dir.display()))
}

/// The process ID of kubedev's daemon in its pod, as the host sees it.
pub(super) fn daemon_pid() -> anyhow::Result<u32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc")?.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let first = cmdline.split(|b| *b == 0).next().unwrap_or_default();
        // Only the pod's: a daemon run by hand or by another test is no part of the cluster.
        let cgroup = std::fs::read_to_string(entry.path().join("cgroup")).unwrap_or_default();
        if Path::new(&*String::from_utf8_lossy(first)).file_name() == Some("kubedev".as_ref())
            && cgroup.contains("kubepods")
        {
            found.push(pid);
        }
    }
    match found[..] {
        [pid] => Ok(pid),
        _ => bail!("expected one kubedev process in a pod, found {found:?}"),
    }
}

/// The TCP connections process `pid` holds to the API server's port now.
fn api_connections(pid: u32) -> usize {
    let inodes: std::collections::BTreeSet<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .filter_map(|l| {
            let l = l.to_string_lossy().into_owned();
            l.strip_prefix("socket:[")
                .and_then(|s| s.strip_suffix(']'))
                .map(str::to_string)
        })
        .collect();
    let port = format!(":{API_PORT:04X}");
    let mut count = 0;
    // The tables of the process's own network namespace (its pod's).
    for file in ["tcp", "tcp6"] {
        let text = std::fs::read_to_string(format!("/proc/{pid}/net/{file}")).unwrap_or_default();
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() > 9 && f[2].ends_with(&port) && inodes.contains(f[9]) {
                count += 1;
            }
        }
    }
    count
}
