//! `cargo xtask soak`: the release daemon in DRA mode on a busy node, through its real sockets.
//!
//! The API-server and kubelet emulators stand around a `kubedev run` process with the static
//! backend. Each cycle creates a pod's claims in the API server, prepares them in one
//! `NodePrepareResources` call, unprepares them in the next and deletes them, as happens when
//! the pod goes away. Mixed in: claims the API server does not have, claims of a device the
//! backend cannot prepare, claims deleted while still prepared, unprepare of claims never
//! prepared, and a device that goes missing and comes back. Every `--sample-every` claims the
//! daemon's resident memory, open files, threads, checkpoint, files on disk and metric series
//! are read; after the warm-up they must stay flat.

use std::collections::BTreeSet;
use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use kubedev_testkit::apiserver::{ApiServer, Resource};
use kubedev_testkit::kubelet::{ClaimId, DraKubelet};
use serde_json::json;

const DRIVER: &str = "gpu.example.com";
const NODE: &str = "node-soak";
/// The namespace of every claim: a metric series that names it is a series per claim.
const NAMESPACE: &str = "churn";
/// Devices every cycle's claims get, one each.
const DEVICES: usize = 4;
/// The device that goes missing and comes back (never claimed).
const FLAKY: &str = "gpu-flaky";
const WAIT: Duration = Duration::from_secs(30);

/// `cargo xtask soak`'s options.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// How many claims are prepared and unprepared after the warm-up.
    #[arg(long, default_value_t = 20_000)]
    pub(crate) claims: u64,
    /// Claims prepared and unprepared before the first measurement that counts.
    #[arg(long, default_value_t = 2_000)]
    pub(crate) warmup: u64,
    /// How many claims between two measurements.
    #[arg(long, default_value_t = 2_000)]
    pub(crate) sample_every: u64,
    /// The most resident memory may grow from the warm-up to the end, in KiB.
    #[arg(long, default_value_t = 2048)]
    pub(crate) max_growth_kib: u64,
    /// The daemon binary (default: `cargo build --release` of kubedev).
    #[arg(long)]
    pub(crate) binary: Option<PathBuf>,
    /// Where the node's files go (default: /dev/shm when there is one, as the CDI directory
    /// is on tmpfs on a node; the system's temporary directory otherwise).
    #[arg(long)]
    pub(crate) dir: Option<PathBuf>,
    /// Measure and print only: no limit is enforced.
    #[arg(long)]
    pub(crate) measure_only: bool,
}

impl Args {
    /// The soak CI runs: the defaults.
    pub(crate) fn ci() -> Args {
        Args {
            claims: 20_000,
            warmup: 2_000,
            sample_every: 2_000,
            max_growth_kib: 2048,
            binary: None,
            dir: None,
            measure_only: false,
        }
    }
}

/// One measurement of the daemon.
#[derive(Debug, Clone, PartialEq)]
struct Sample {
    /// Claims prepared and unprepared so far (warm-up included).
    claims: u64,
    /// Seconds since the first cycle.
    seconds: f64,
    /// Taken after the daemon was left alone for [`IDLE`].
    idle: bool,
    rss_kib: u64,
    open_files: usize,
    threads: usize,
    /// The checkpoint file's size in bytes.
    checkpoint_bytes: u64,
    /// Files and directories in the CDI directory and under the device metadata root.
    files_on_disk: usize,
    /// Metric series the daemon exposes.
    series: usize,
}

/// Runs the soak; fails when something grew that must not.
pub(crate) fn soak(root: &Path, args: &Args) -> anyhow::Result<()> {
    let bin = match &args.binary {
        Some(b) => b.clone(),
        None => {
            crate::ci::run(
                root,
                "cargo",
                &["build", "--release", "-p", "kubedev", "--bin", "kubedev"],
            )?;
            crate::ci::target_dir(root).join("release").join("kubedev")
        }
    };
    ensure!(bin.exists(), "no daemon binary at {}", bin.display());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let soak = rt.block_on(run(&bin, args))?;
    let report = report(&soak, args);
    println!("\n{report}");
    let dir = crate::ci::target_dir(root).join(REPORT_DIR);
    std::fs::create_dir_all(&dir)?;
    let file = dir.join(format!("dra-{}.md", args.claims));
    std::fs::write(&file, &report).with_context(|| format!("writing {}", file.display()))?;
    println!("written to {}", file.display());
    if args.measure_only {
        return Ok(());
    }
    judge(&soak, args)
}

/// Where each soak's report goes, under the target directory; `cargo xtask bench` adds their
/// `| soak` rows to its own report.
pub(crate) const REPORT_DIR: &str = "soak";

/// The working directory, the emulators and the daemon.
struct Node {
    dir: tempfile::TempDir,
    api: ApiServer,
    kubelet: DraKubelet,
    metrics_port: u16,
}

impl Node {
    /// The node's files in a new directory under `parent` (the system's temporary directory
    /// when `None`).
    async fn new(parent: Option<&Path>) -> anyhow::Result<Node> {
        let mut builder = tempfile::Builder::new();
        builder.prefix("kubedev-soak");
        let dir = match parent {
            Some(p) => builder
                .tempdir_in(p)
                .with_context(|| format!("creating a directory in {}", p.display()))?,
            None => builder.tempdir()?,
        };
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
        let metrics_port = free_port()?;
        std::fs::write(
            r.join("kubedev.yaml"),
            format!(
                "nodeName: {NODE}\nstateDir: {r}/backend-state\nmetrics:\n  address: 127.0.0.1:{metrics_port}\n  podResourcesSocket: {r}/pod-resources.sock\ndra:\n  enabled: true\n  driverName: {DRIVER}\n  kubeconfig: {r}/kubeconfig\n  pluginDir: {r}/plugins\n  registryDir: {r}/registry\n  cdiDir: {r}/cdi\n  stateDir: {r}/state\n  bootIdPath: {r}/boot_id\n  deviceMetadata: true\nbackends:\n  static:\n    pool: {NODE}\n    pollIntervalMs: 20\n    devices:\n{devices}",
                r = r.display()
            ),
        )?;
        let kubelet = DraKubelet::start(r.join("registry"))?;
        Ok(Node {
            dir,
            api,
            kubelet,
            metrics_port,
        })
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Starts the daemon and waits until it registered with the kubelet.
    async fn start(&self, bin: &Path) -> anyhow::Result<Daemon> {
        let log = std::fs::File::create(self.path().join("daemon.log"))?;
        let child = Command::new(bin)
            .args(["run", "--config"])
            .arg(self.path().join("kubedev.yaml"))
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let daemon = Daemon(child);
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

    fn log(&self) -> String {
        std::fs::read_to_string(self.path().join("daemon.log")).unwrap_or_default()
    }

    /// Puts the claim `name` allocated `device` into the API server.
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

    fn set_present(&self, name: &str, present: bool) -> anyhow::Result<()> {
        let path = self.path().join("present").join(name);
        if present {
            std::fs::write(path, "")?;
        } else {
            std::fs::remove_file(path)?;
        }
        Ok(())
    }

    /// Reads the daemon's resources.
    fn sample(
        &self,
        daemon: &Daemon,
        claims: u64,
        started: Instant,
        idle: bool,
    ) -> anyhow::Result<Sample> {
        let pid = daemon.0.id();
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
        let field = |name: &str| -> anyhow::Result<u64> {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse().ok())
                .with_context(|| format!("no {name} in /proc/{pid}/status"))
        };
        let checkpoint = self.path().join("state").join("kubedev-checkpoint.json");
        let sample = Sample {
            claims,
            seconds: started.elapsed().as_secs_f64(),
            idle,
            rss_kib: field("VmRSS:")?,
            open_files: std::fs::read_dir(format!("/proc/{pid}/fd"))?.count(),
            threads: usize::try_from(field("Threads:")?)?,
            checkpoint_bytes: std::fs::metadata(&checkpoint)
                .with_context(|| format!("reading {}", checkpoint.display()))?
                .len(),
            files_on_disk: files_under(&self.path().join("cdi"))
                + files_under(&self.path().join("plugins").join("dra-device-metadata")),
            series: self.series()?.len(),
        };
        eprintln!(
            "soak: {:>8} claims {:>7.1}s{} rss {:>7} KiB  files {:>3}  threads {:>2}  checkpoint {:>4} B  on disk {}  series {}",
            sample.claims,
            sample.seconds,
            if idle { " (idle)" } else { "       " },
            sample.rss_kib,
            sample.open_files,
            sample.threads,
            sample.checkpoint_bytes,
            sample.files_on_disk,
            sample.series
        );
        Ok(sample)
    }

    /// The metric series the daemon exposes (name and labels), from `/metrics`.
    fn series(&self) -> anyhow::Result<BTreeSet<String>> {
        let body = http_get(self.metrics_port, "/metrics")?;
        Ok(body
            .lines()
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
            .filter_map(|l| l.rsplit_once(' ').map(|(s, _)| s.to_string()))
            .collect())
    }
}

/// A daemon process, killed when dropped.
struct Daemon(Child);

impl Daemon {
    /// Stops the daemon as Kubernetes does (SIGTERM); fails unless it exits cleanly in time.
    fn stop(mut self) -> anyhow::Result<()> {
        let pid = rustix::process::Pid::from_raw(i32::try_from(self.0.id())?)
            .context("the daemon's process ID")?;
        rustix::process::kill_process(pid, rustix::process::Signal::TERM)?;
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(status) = self.0.try_wait()? {
                ensure!(
                    status.success(),
                    "the daemon exited with {status} when stopped"
                );
                return Ok(());
            }
            ensure!(
                Instant::now() < deadline,
                "the daemon did not stop within {WAIT:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Regular files and directories under `dir`, at any depth.
fn files_under(dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .filter_map(Result::ok)
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => 1 + files_under(&e.path()),
            Ok(t) if t.is_file() => 1,
            _ => 0,
        })
        .sum()
}

/// A port on 127.0.0.1 nothing listens on now.
fn free_port() -> anyhow::Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

/// The body of `GET path` on 127.0.0.1:`port` (HTTP/1.0, so the server closes).
fn http_get(port: u16, path: &str) -> anyhow::Result<String> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(WAIT))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")?;
    let mut text = String::new();
    s.read_to_string(&mut text)?;
    let (head, body) = text
        .split_once("\r\n\r\n")
        .context("metrics answer without a header")?;
    ensure!(
        head.starts_with("HTTP/1.") && head.contains(" 200 "),
        "GET {path}: {head}"
    );
    Ok(body.to_string())
}

/// How long the daemon is left alone before the measurements that are compared: longer than
/// the runtime keeps an idle thread for blocking work (10 s), so only threads that live for the
/// daemon's whole life remain.
const IDLE: Duration = Duration::from_secs(11);

/// What a soak measured.
struct Soak {
    /// Every measurement, in order.
    samples: Vec<Sample>,
    /// Index in `samples` of the measurement after the warm-up, the daemon idle.
    baseline: usize,
    /// Metric series that appeared after the warm-up.
    new_series: Vec<String>,
    /// Claims prepared and unprepared per second after the warm-up.
    claims_per_second: f64,
}

/// The warm-up, an idle measurement, the cycles with a measurement every `sample_every`
/// claims, and a last idle measurement.
async fn run(bin: &Path, args: &Args) -> anyhow::Result<Soak> {
    let shm = Path::new("/dev/shm");
    let parent = args.dir.as_deref().or(shm.is_dir().then_some(shm));
    let node = Node::new(parent).await?;
    let daemon = node.start(bin).await?;
    let started = Instant::now();
    let mut samples = Vec::new();
    let mut cycle = 0u64;
    let mut done = 0u64;
    while done < args.warmup {
        cycle_once(&node, &mut cycle, &mut done).await?;
    }
    tokio::time::sleep(IDLE).await;
    samples.push(node.sample(&daemon, done, started, true)?);
    let baseline_series = node.series()?;
    let soak_started = Instant::now();
    let total = args.warmup + args.claims;
    let mut next_sample = done + args.sample_every;
    while done < total {
        cycle_once(&node, &mut cycle, &mut done).await?;
        if done >= next_sample && done < total {
            samples.push(node.sample(&daemon, done, started, false)?);
            next_sample += args.sample_every;
        }
    }
    let claims_per_second = (done - args.warmup) as f64 / soak_started.elapsed().as_secs_f64();
    tokio::time::sleep(IDLE).await;
    samples.push(node.sample(&daemon, done, started, true)?);
    let series = node.series()?;
    let mut new_series: Vec<String> = series.difference(&baseline_series).cloned().collect();
    new_series.extend(series.iter().filter(|s| s.contains(NAMESPACE)).cloned());
    daemon.stop()?;
    node.kubelet.stop().await;
    node.api.shutdown().await;
    Ok(Soak {
        samples,
        baseline: 0,
        new_series,
        claims_per_second,
    })
}

/// The last lines of a log.
fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

/// One pod's life: its claims created, prepared, unprepared and deleted, with this cycle's
/// failures mixed in.
async fn cycle_once(node: &Node, cycle: &mut u64, done: &mut u64) -> anyhow::Result<()> {
    one_pod(node, *cycle)
        .await
        .with_context(|| format!("cycle {cycle}; the daemon's log:\n{}", tail(&node.log())))?;
    *cycle += 1;
    *done += DEVICES as u64;
    Ok(())
}

/// The claims of pod number `cycle`.
async fn one_pod(node: &Node, cycle: u64) -> anyhow::Result<()> {
    let mut claims = Vec::with_capacity(DEVICES + 2);
    for i in 0..DEVICES {
        let name = format!("c{cycle}-{i}");
        claims.push(node.put_claim(&name, &format!("u{cycle}-{i}"), &format!("gpu-{i}"))?);
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
        Some(node.put_claim(
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
    let answers = node.kubelet.prepare(DRIVER, &call).await?;
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
        node.set_present(FLAKY, !cycle.is_multiple_of(50))?;
    }
    // The pod went away and the claim with it before the kubelet unprepared it.
    if cycle % 10 == 8 {
        node.delete_claim(&claims[0])?;
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
    let answers = node.kubelet.unprepare(DRIVER, &un).await?;
    for id in &un {
        match answers.get(&id.uid) {
            Some(Ok(())) => {}
            other => bail!("unprepare of {}: {other:?}", id.name),
        }
    }
    for (i, id) in claims.iter().enumerate() {
        if !(cycle % 10 == 8 && i == 0) {
            node.delete_claim(id)?;
        }
    }
    if let Some(id) = &broken {
        node.delete_claim(id)?;
    }
    Ok(())
}

/// The measurements as Markdown: a `| measure | value |` table for `cargo xtask bench`, then
/// every measurement.
fn report(soak: &Soak, args: &Args) -> String {
    let base = &soak.samples[soak.baseline];
    let Some(end) = soak.samples.last() else {
        return String::new();
    };
    let run = format!(
        "soak, DRA, {} claims after {} of warm-up (release daemon, static backend, {} claims a call)",
        args.claims, args.warmup, DEVICES
    );
    let mut t = format!(
        "| measure | value |\n|---|---|\n\
         | {run}: claims prepared and unprepared per second | {:.0} |\n\
         | {run}: resident memory after the warm-up → at the end, both idle | {} → {} KiB ({:+} KiB) |\n\
         | {run}: open files, threads after the warm-up → at the end, both idle | {} → {}, {} → {} |\n\n",
        soak.claims_per_second,
        base.rss_kib,
        end.rss_kib,
        i128::from(end.rss_kib) - i128::from(base.rss_kib),
        base.open_files,
        end.open_files,
        base.threads,
        end.threads,
    );
    t.push_str(
        "| claims | seconds | idle | resident memory (KiB) | since the warm-up (KiB) | open files | threads | checkpoint (bytes) | files on disk | metric series |\n|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for s in &soak.samples {
        t.push_str(&format!(
            "| {} | {:.1} | {} | {} | {:+} | {} | {} | {} | {} | {} |\n",
            s.claims,
            s.seconds,
            if s.idle { "yes" } else { "" },
            s.rss_kib,
            i128::from(s.rss_kib) - i128::from(base.rss_kib),
            s.open_files,
            s.threads,
            s.checkpoint_bytes,
            s.files_on_disk,
            s.series
        ));
    }
    t
}

/// Fails naming what grew after the warm-up.
fn judge(soak: &Soak, args: &Args) -> anyhow::Result<()> {
    let first = &soak.samples[soak.baseline];
    let Some(last) = soak.samples.last() else {
        bail!("no measurement was taken");
    };
    let mut wrong = Vec::new();
    let growth = last.rss_kib.saturating_sub(first.rss_kib);
    if growth > args.max_growth_kib {
        wrong.push(format!(
            "resident memory grew by {growth} KiB over {} claims (at most {} KiB)",
            last.claims - first.claims,
            args.max_growth_kib
        ));
    }
    if last.open_files > first.open_files {
        wrong.push(format!(
            "open files grew from {} to {}",
            first.open_files, last.open_files
        ));
    }
    if last.threads > first.threads {
        wrong.push(format!(
            "threads grew from {} to {}",
            first.threads, last.threads
        ));
    }
    if last.checkpoint_bytes != first.checkpoint_bytes {
        wrong.push(format!(
            "the checkpoint is {} bytes with no claim prepared after the warm-up, {} at the end",
            first.checkpoint_bytes, last.checkpoint_bytes
        ));
    }
    if last.files_on_disk != 0 {
        wrong.push(format!(
            "{} files and directories are left in the CDI directory and under the device \
             metadata root",
            last.files_on_disk
        ));
    }
    if !soak.new_series.is_empty() {
        wrong.push(format!(
            "metric series appeared after the warm-up: {}",
            soak.new_series.join(", ")
        ));
    }
    if !wrong.is_empty() {
        bail!("the soak failed: {}", wrong.join("; "));
    }
    println!(
        "soak passed: {} claims after the warm-up, resident memory {:+} KiB, open files {}, threads {}",
        last.claims - first.claims,
        i128::from(last.rss_kib) - i128::from(first.rss_kib),
        last.open_files,
        last.threads
    );
    Ok(())
}
