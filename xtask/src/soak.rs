//! `cargo xtask soak`: the release daemon on a busy node for a long time, through its real
//! sockets, with the API-server and kubelet emulators around a `kubedev run` process.
//!
//! Three workloads, one daemon each (`soak/dra.rs`, `soak/device_plugin.rs`,
//! `soak/watches.rs`): claims prepared and unprepared in DRA mode, pods given devices in
//! device-plugin mode across kubelet restarts, each with failures mixed in, and the daemon's
//! watches (presence polls, configuration reloads, the API server's watches, USB, VFIO and NVML
//! hardware coming and going) compressed in time. After a warm-up the daemon is left alone for
//! [`IDLE`] and measured: resident memory, open files, threads, the checkpoint, files on disk
//! and metric series; then the workload runs with a measurement every `--sample-every` units,
//! and after another idle pause the last measurement must match the first.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};

pub(crate) mod burst;
mod device_plugin;
mod dra;
mod hardware;
mod watches;

/// How long to wait for the daemon to register, answer or stop.
const WAIT: Duration = Duration::from_secs(30);

/// How long the daemon is left alone before the measurements that are compared: longer than
/// the runtime keeps an idle thread for blocking work (10 s), so only threads that live for the
/// daemon's whole life remain.
const IDLE: Duration = Duration::from_secs(11);

/// Where each soak's report goes, under the target directory; `cargo xtask bench` adds their
/// `| soak` rows to its own report.
pub(crate) const REPORT_DIR: &str = "soak";

/// `cargo xtask soak`'s options.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct Args {
    /// DRA claims prepared and unprepared after the warm-up (0: no DRA soak).
    #[arg(long, default_value_t = 20_000)]
    pub(crate) claims: u64,
    /// Pods given devices through the device plugin after the warm-up (0: no device-plugin
    /// soak).
    #[arg(long, default_value_t = 20_000)]
    pub(crate) pods: u64,
    /// Events of the watches soak after its warm-up (0: none): the presence poll every 10 ms,
    /// a device flapping each event, the configuration replaced every 2nd, the API server's
    /// watches dropped every 10th, a USB key replugged, a VFIO group node or an NVML GPU lost
    /// and back each event in turn, an Xid every 25th; memory may grow by at most 384 KiB there.
    #[arg(long, default_value_t = 400)]
    pub(crate) watch_events: u64,
    /// Claims in the burst: one `NodePrepareResources` call of them all, answered within the
    /// kubelet's 45 s with the daemon under 160 MiB and at most 64 connections to the API
    /// server (0: no burst).
    #[arg(long, default_value_t = 10_000)]
    pub(crate) burst: u64,
    /// Pods between two replacements of the device plugin's selection policy (0: never). Each
    /// new module takes slots of the sandbox's instance pool, whose pages stay resident up to a
    /// bound (32 slots of at most 320 KiB), so memory settles only after a few thousand reloads:
    /// `--pods 20000 --reload-every 2` reloads 10,000 times.
    #[arg(long, default_value_t = 0)]
    pub(crate) reload_every: u64,
    /// Claims or pods before the first measurement that counts.
    #[arg(long, default_value_t = 2_000)]
    pub(crate) warmup: u64,
    /// How many claims or pods between two measurements.
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
    /// Copies the daemon's `/proc/<pid>/smaps` into this directory at each idle measurement
    /// (`<mode>-<claims or pods>.smaps`), to tell which mappings grew.
    #[arg(long)]
    pub(crate) smaps_dir: Option<PathBuf>,
    /// Measure and report only: no limit is enforced.
    #[arg(long)]
    pub(crate) measure_only: bool,
}

impl Args {
    /// The soaks CI runs: the defaults.
    pub(crate) fn ci() -> Args {
        Args {
            claims: 20_000,
            pods: 20_000,
            watch_events: 400,
            burst: 10_000,
            reload_every: 0,
            warmup: 2_000,
            sample_every: 2_000,
            max_growth_kib: 2048,
            binary: None,
            dir: None,
            smaps_dir: None,
            measure_only: false,
        }
    }

    /// The directory the node's files go under.
    fn parent_dir(&self) -> Option<&Path> {
        let shm = Path::new("/dev/shm");
        self.dir.as_deref().or(shm.is_dir().then_some(shm))
    }
}

/// Runs the soaks; fails when something grew that must not.
pub(crate) fn soak(root: &Path, args: &Args) -> anyhow::Result<()> {
    let bin = match &args.binary {
        Some(b) => b.clone(),
        None => {
            crate::commands::run(
                root,
                "cargo",
                &["build", "--release", "-p", "kubedev", "--bin", "kubedev"],
            )?;
            crate::commands::target_dir(root)
                .join("release")
                .join("kubedev")
        }
    };
    ensure!(bin.exists(), "no daemon binary at {}", bin.display());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let dir = crate::commands::target_dir(root).join(REPORT_DIR);
    std::fs::create_dir_all(&dir)?;
    let mut failures = Vec::new();
    let runs = [
        (args.claims, "dra"),
        (args.pods, "device-plugin"),
        (args.watch_events, "watches"),
    ];
    for (count, name) in runs.iter().filter(|(n, _)| *n > 0) {
        let soak = match *name {
            "dra" => rt.block_on(dra::run(&bin, args))?,
            "watches" => rt.block_on(watches::run(&bin, args))?,
            _ => rt.block_on(device_plugin::run(root, &bin, args))?,
        };
        let report = soak.report();
        println!("\n{report}");
        let file = dir.join(format!("{name}-{count}.md"));
        std::fs::write(&file, &report).with_context(|| format!("writing {}", file.display()))?;
        println!("written to {}", file.display());
        let limit = if *name == "watches" {
            args.max_growth_kib.min(watches::MAX_GROWTH_KIB)
        } else {
            args.max_growth_kib
        };
        match soak.judge(limit) {
            Ok(summary) => println!("{summary}"),
            Err(e) => failures.push(format!("{e:#}")),
        }
    }
    if args.burst > 0 {
        match rt.block_on(burst::run(&bin, args)) {
            Ok(report) => {
                let file = dir.join(format!("burst-{}.md", args.burst));
                std::fs::write(&file, &report)
                    .with_context(|| format!("writing {}", file.display()))?;
            }
            Err(e) => failures.push(format!("the burst: {e:#}")),
        }
    }
    if !args.measure_only && !failures.is_empty() {
        bail!("{}", failures.join("\n"));
    }
    Ok(())
}

/// A workload the daemon is put through, one step at a time.
trait Workload {
    /// One step (a pod's claims, or a pod's devices); returns how many claims or pods it was.
    async fn step(&mut self) -> anyhow::Result<u64>;

    /// The daemon's log, for a failing step.
    fn log(&self) -> String;
}

/// One measurement of the daemon.
#[derive(Debug, Clone, PartialEq)]
struct Sample {
    /// Claims or pods done so far (warm-up included).
    done: u64,
    /// Seconds since the first step.
    seconds: f64,
    /// Taken after the daemon was left alone for [`IDLE`].
    idle: bool,
    rss_kib: u64,
    /// Open files but the pooled connections to the API server.
    open_files: usize,
    /// TCP connections to the API server: the client's pool keeps as many as calls ran at
    /// once, each closed after 90 s unused.
    api_connections: usize,
    threads: usize,
    /// The checkpoint file's size in bytes (DRA mode).
    checkpoint_bytes: Option<u64>,
    /// Files and directories under the directories the daemon writes per claim or pod.
    files_on_disk: usize,
    /// Metric series the daemon exposes (name and labels).
    series: BTreeSet<String>,
}

/// Where a daemon's resources are read.
struct Probe {
    pid: u32,
    /// Where idle measurements copy the daemon's memory mappings, named `<mode>-<done>.smaps`.
    smaps: Option<(PathBuf, &'static str)>,
    metrics_port: u16,
    /// The checkpoint file (DRA mode).
    checkpoint: Option<PathBuf>,
    /// Directories the daemon writes into per claim or pod, empty when none is in use.
    dirs: Vec<PathBuf>,
    /// The API server's port (DRA mode).
    api_port: Option<u16>,
}

impl Probe {
    /// Reads the daemon's resources.
    fn sample(&self, done: u64, started: Instant, idle: bool) -> anyhow::Result<Sample> {
        let pid = self.pid;
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
            .with_context(|| format!("the daemon (process {pid}) is gone"))?;
        let field = |name: &str| -> anyhow::Result<u64> {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse().ok())
                .with_context(|| format!("no {name} in /proc/{pid}/status"))
        };
        let checkpoint_bytes = match &self.checkpoint {
            Some(p) => Some(
                std::fs::metadata(p)
                    .with_context(|| format!("reading {}", p.display()))?
                    .len(),
            ),
            None => None,
        };
        if let (Some((dir, mode)), true) = (&self.smaps, idle) {
            std::fs::create_dir_all(dir)?;
            std::fs::copy(
                format!("/proc/{pid}/smaps"),
                dir.join(format!("{mode}-{done}.smaps")),
            )?;
        }
        let fds: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))?
            .filter_map(Result::ok)
            .filter_map(|e| std::fs::read_link(e.path()).ok())
            .map(|l| l.to_string_lossy().into_owned())
            .collect();
        let api_sockets = self
            .api_port
            .map_or_else(BTreeSet::new, |port| tcp_sockets_to(pid, port));
        let api_connections = fds
            .iter()
            .filter(|l| {
                l.strip_prefix("socket:[")
                    .and_then(|i| i.strip_suffix(']'))
                    .is_some_and(|inode| api_sockets.contains(inode))
            })
            .count();
        let sample = Sample {
            done,
            seconds: started.elapsed().as_secs_f64(),
            idle,
            rss_kib: field("VmRSS:")?,
            open_files: fds.len() - api_connections,
            api_connections,
            threads: usize::try_from(field("Threads:")?)?,
            checkpoint_bytes,
            files_on_disk: self.dirs.iter().map(|d| entries_under(d)).sum(),
            series: self.series()?,
        };
        eprintln!(
            "soak: {:>8} {:>7.1}s{} rss {:>7} KiB  files {:>3} (+{} to the API server)  threads {:>2}  checkpoint {:>4} B  on disk {}  series {}",
            sample.done,
            sample.seconds,
            if idle { " (idle)" } else { "       " },
            sample.rss_kib,
            sample.open_files,
            sample.api_connections,
            sample.threads,
            sample.checkpoint_bytes.unwrap_or(0),
            sample.files_on_disk,
            sample.series.len()
        );
        Ok(sample)
    }

    /// The metric series the daemon exposes (name and labels), from `/metrics`.
    fn series(&self) -> anyhow::Result<BTreeSet<String>> {
        let body = metrics(self.metrics_port)?;
        Ok(body
            .lines()
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
            .filter_map(|l| l.rsplit_once(' ').map(|(s, _)| s.to_string()))
            .collect())
    }
}

/// What one soak measured.
struct Soak {
    /// What ran, for the report: the mode, how many units after how long a warm-up.
    what: String,
    /// What a step counts: `claims` or `pods`.
    unit: &'static str,
    /// Every measurement, in order; the first is the idle one after the warm-up, the last the
    /// idle one at the end.
    samples: Vec<Sample>,
    /// Metric series that appeared after the warm-up, or that name a claim or pod.
    new_series: Vec<String>,
    /// Units per second after the warm-up.
    per_second: f64,
}

/// The warm-up, an idle measurement, the workload with a measurement every `sample_every`
/// units, and a last idle measurement. `per_unit` picks out series named after a claim or pod.
async fn drive(
    probe: &Probe,
    work: &mut impl Workload,
    args: &Args,
    total: u64,
    per_unit: impl Fn(&str) -> bool,
) -> anyhow::Result<(Vec<Sample>, Vec<String>, f64)> {
    let started = Instant::now();
    let mut done = 0u64;
    let mut step = async |done: &mut u64| -> anyhow::Result<()> {
        let n = work
            .step()
            .await
            .with_context(|| format!("after {done}; the daemon's log:\n{}", tail(&work.log())))?;
        *done += n;
        Ok(())
    };
    while done < args.warmup {
        step(&mut done).await?;
    }
    tokio::time::sleep(IDLE).await;
    let mut samples = vec![probe.sample(done, started, true)?];
    let measured_from = (Instant::now(), done);
    let end = args.warmup + total;
    let mut next = done + args.sample_every;
    while done < end {
        step(&mut done).await?;
        if done >= next && done < end {
            samples.push(probe.sample(done, started, false)?);
            next += args.sample_every;
        }
    }
    let per_second = (done - measured_from.1) as f64 / measured_from.0.elapsed().as_secs_f64();
    tokio::time::sleep(IDLE).await;
    samples.push(probe.sample(done, started, true)?);
    let (baseline, series) = (&samples[0].series, &samples[samples.len() - 1].series);
    let mut new: Vec<String> = series.difference(baseline).cloned().collect();
    new.extend(series.iter().filter(|s| per_unit(s)).cloned());
    Ok((samples, new, per_second))
}

impl Soak {
    /// The measurements as Markdown: `| soak …` rows for `cargo xtask bench`, then every
    /// measurement.
    fn report(&self) -> String {
        let (Some(base), Some(end)) = (self.samples.first(), self.samples.last()) else {
            return String::new();
        };
        let what = &self.what;
        let unit = self.unit;
        let mut t = format!(
            "| measure | value |\n|---|---|\n\
             | soak, {what}: {unit} per second | {:.0} |\n\
             | soak, {what}: resident memory after the warm-up → at the end, both idle | {} → {} KiB ({:+} KiB) |\n\
             | soak, {what}: open files (connections to the API server apart), threads after the warm-up → at the end, both idle | {} → {}, {} → {} |\n\n",
            self.per_second,
            base.rss_kib,
            end.rss_kib,
            i128::from(end.rss_kib) - i128::from(base.rss_kib),
            base.open_files,
            end.open_files,
            base.threads,
            end.threads,
        );
        t.push_str(&format!(
            "| {unit} | seconds | idle | resident memory (KiB) | since the warm-up (KiB) | open files | API server connections | threads | checkpoint (bytes) | files on disk | metric series |\n|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|\n"
        ));
        for s in &self.samples {
            t.push_str(&format!(
                "| {} | {:.1} | {} | {} | {:+} | {} | {} | {} | {} | {} | {} |\n",
                s.done,
                s.seconds,
                if s.idle { "yes" } else { "" },
                s.rss_kib,
                i128::from(s.rss_kib) - i128::from(base.rss_kib),
                s.open_files,
                s.api_connections,
                s.threads,
                s.checkpoint_bytes
                    .map_or_else(|| "-".to_string(), |b| b.to_string()),
                s.files_on_disk,
                s.series.len()
            ));
        }
        t
    }

    /// A line saying what stayed flat, or an error naming what grew after the warm-up.
    fn judge(&self, max_growth_kib: u64) -> anyhow::Result<String> {
        let (Some(first), Some(last)) = (self.samples.first(), self.samples.last()) else {
            bail!("soak, {}: no measurement was taken", self.what);
        };
        let mut wrong = Vec::new();
        let growth = last.rss_kib.saturating_sub(first.rss_kib);
        if growth > max_growth_kib {
            wrong.push(format!(
                "resident memory grew by {growth} KiB over {} {} (at most {max_growth_kib} KiB)",
                last.done - first.done,
                self.unit
            ));
        }
        if last.api_connections > API_POOL_BOUND {
            wrong.push(format!(
                "{} connections to the API server are open after the idle pause (its client \
                 pools at most {API_POOL_BOUND})",
                last.api_connections
            ));
        }
        if last.open_files > first.open_files {
            wrong.push(format!(
                "open files (but connections to the API server) grew from {} to {}",
                first.open_files, last.open_files
            ));
        }
        // One thread of slack: the runtime keeps a thread for blocking work alive while
        // periodic work (the presence poll) finds it within its 10 s keep-alive, and which of
        // two such threads survives an idle pause is the scheduler's choice. A thread left
        // behind per claim, pod or kubelet restart shows as thousands, or as tens.
        if last.threads > first.threads + 1 {
            wrong.push(format!(
                "threads grew from {} to {}",
                first.threads, last.threads
            ));
        }
        if last.checkpoint_bytes != first.checkpoint_bytes {
            wrong.push(format!(
                "the checkpoint is {:?} bytes with nothing prepared after the warm-up, {:?} at \
                 the end",
                first.checkpoint_bytes, last.checkpoint_bytes
            ));
        }
        if last.files_on_disk != 0 {
            wrong.push(format!(
                "{} files and directories are left where the daemon writes per {}",
                last.files_on_disk,
                self.unit.trim_end_matches('s')
            ));
        }
        if !self.new_series.is_empty() {
            wrong.push(format!(
                "metric series appeared after the warm-up or name a claim or pod: {}",
                self.new_series.join(", ")
            ));
        }
        if !wrong.is_empty() {
            bail!("soak, {}, failed: {}", self.what, wrong.join("; "));
        }
        Ok(format!(
            "soak, {}: passed: resident memory {:+} KiB, open files {}, threads {}",
            self.what,
            i128::from(last.rss_kib) - i128::from(first.rss_kib),
            last.open_files,
            last.threads
        ))
    }
}

/// A daemon process, killed when dropped.
struct Daemon(Child);

impl Daemon {
    /// Starts `bin run --config <config>` in the environment kubedev's image gives it, its
    /// standard error appended to `log`.
    fn spawn(bin: &Path, config: &Path, log: &Path) -> anyhow::Result<Daemon> {
        let log = std::fs::File::create(log)?;
        let child = Command::new(bin)
            .args(["run", "--config"])
            .arg(config)
            .envs(crate::cluster::image::KUBEDEV_ENV.iter().copied())
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        Ok(Daemon(child))
    }

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

/// A new directory for a node's files under `parent` (the system's temporary directory when
/// `None`).
fn node_dir(parent: Option<&Path>) -> anyhow::Result<tempfile::TempDir> {
    let mut builder = tempfile::Builder::new();
    builder.prefix("kubedev-soak");
    match parent {
        Some(p) => builder
            .tempdir_in(p)
            .with_context(|| format!("creating a directory in {}", p.display())),
        None => Ok(builder.tempdir()?),
    }
}

/// Regular files and directories under `dir`, at any depth.
fn entries_under(dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .filter_map(Result::ok)
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => 1 + entries_under(&e.path()),
            Ok(t) if t.is_file() => 1,
            _ => 0,
        })
        .sum()
}

/// The inodes of process `pid`'s TCP sockets connected to `port` (from `/proc/<pid>/net/tcp`
/// and `tcp6`).
fn tcp_sockets_to(pid: u32, port: u16) -> BTreeSet<String> {
    let remote = format!(":{port:04X}");
    ["tcp", "tcp6"]
        .iter()
        .filter_map(|t| std::fs::read_to_string(format!("/proc/{pid}/net/{t}")).ok())
        .flat_map(|text| {
            text.lines()
                .skip(1)
                .filter_map(|l| {
                    let f: Vec<&str> = l.split_whitespace().collect();
                    (f.len() > 9 && f[2].ends_with(&remote)).then(|| f[9].to_string())
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

/// How many pooled connections to the API server an idle daemon may keep: the claim reads of
/// one pod's prepare run at once, beside the status writer and the slice publisher.
const API_POOL_BOUND: usize = 16;

/// A port on 127.0.0.1 nothing listens on now.
fn free_port() -> anyhow::Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

/// The daemon's `/metrics` text from `port` on loopback.
fn metrics(port: u16) -> anyhow::Result<String> {
    crate::commands::http_get(&format!("127.0.0.1:{port}"), "/metrics", WAIT)
}

/// The last lines of a log.
fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}
