//! `cargo xtask e2e`: whole scenarios through the real `kubedev` binary, per backend and mode,
//! against the emulated kubelet (both APIs) and API server, fake host roots and the NVML
//! stand-in — with a kubelet restart, API-server faults and `kill -9` of the daemon at random
//! points — and a summary table at the end.
//!
//! DRA: discovery → ResourceSlices in the API server (while its slice writes fail) → the
//! allocator picks distinct devices for several claims as the scheduler would → the claims are
//! written with their allocations → prepare → the CDI spec holds the backend's edits → `kill -9`
//! → restart → prepare again gives the same answer → unprepare removes the CDI spec. Then the
//! crash rounds: each round the emulated kubelet sends concurrent prepare and unprepare calls
//! for a random mix of the claims (batched as one pod or one call per claim, sometimes with a
//! duplicate) and the daemon is killed with `kill -9` after a random delay, so the kill lands
//! before, during or after the requests; sometimes the restarted daemon is killed once more
//! during its start-up (recovery, registration) while the kubelet is already retrying. After
//! the last restart the kubelet drives every claim to the state it wants, as the real kubelet
//! retries: each claim it wants prepared answers with the devices and CDI IDs of its first
//! clean prepare, each claim it wants unprepared unprepares, and the CDI directory holds exactly
//! the spec files of the prepared claims. At the end everything is unprepared, no spec file is
//! left, and a last prepare and unprepare still work. Before that, damage rounds: every
//! prepared claim is reserved for a pod, the daemon is killed, and while it is down the
//! checkpoint is damaged at random (cut short, garbage, deleted, or left alone), specs of
//! prepared claims are damaged at random (cut short, garbage, deleted, a directory or a link in
//! their place) and sometimes a pod is deleted (its claim no longer reserved). As soon as the
//! restarted daemon registers — before the kubelet calls it — every claim whose pod still exists
//! has exactly the spec it had before the damage.
//!
//! Device plugin: registration → capacity → Allocate edits → kubelet restart → re-registered
//! with the same devices. Then crash rounds: the daemon is killed after a random delay either
//! while concurrent Allocate calls run or during a fresh start (registration, ListAndWatch); the
//! restarted daemon must register again with the same device IDs, and Allocate must still
//! answer with the backend's device node.
//!
//! Every random choice comes from one seed, printed at the start and in the summary: set
//! `KUBEDEV_E2E_SEED` to replay a run with the same kill points (only the timing differs).
//! Each scenario draws from its own generator, derived from the seed and its name, and draws
//! each round's choices before the round acts, so a replay makes the same choices whatever the
//! timing was. `KUBEDEV_E2E_VERBOSE=1` prints what every crash round sent and what its kill
//! hit (a failing scenario always prints it).

mod dp;
mod dra;
mod dra_damage;
mod dra_rounds;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use kubedev_testkit::apiserver::KubeRelease;
use kubedev_testkit::machines;

const WAIT: Duration = Duration::from_secs(20);
const NODE: &str = "e2e-node";
const DRIVER: &str = "devices.e2e.kubedev.io";
/// The environment variable that fixes the seed of the random choices.
const SEED_ENV: &str = "KUBEDEV_E2E_SEED";
/// At most this many claims take part in the DRA crash rounds (fewer when the backend has
/// fewer devices).
const CRASH_CLAIMS: usize = 3;
/// Kills per DRA scenario with requests in flight.
const DRA_CRASH_ROUNDS: usize = 3;
/// DRA damage rounds (checkpoint and CDI specs damaged while the daemon is down).
const DRA_DAMAGE_ROUNDS: usize = 3;
/// Kills per device-plugin scenario.
const DP_CRASH_ROUNDS: usize = 2;
// The windows the random delays are drawn from (`0..=` each), measured on the 2-core
// machine with a debug build: a DRA call is answered 1.5–13 ms after it is sent (most within
// 2–10 ms), an Allocate call after 1.3–4 ms (up to 9 under load); a restarted DRA daemon has
// answered the kubelet's retries about 45–50 ms after its spawn, a device-plugin daemon has
// registered 9–21 ms after it. Each window reaches into or a little past the work it aims at,
// so a kill lands before, during or after it: over 10 seeds about two thirds of the DRA kills
// and 40% of the Allocate kills cut off a call in flight.
/// DRA: the kill comes this long at most after the calls were sent.
const DRA_KILL_WINDOW: Duration = Duration::from_millis(12);
/// DRA: a kill during start-up comes this long at most after the spawn.
const DRA_START_KILL_WINDOW: Duration = Duration::from_millis(50);
/// Device plugin: the kill comes this long at most after the Allocate calls were sent.
const DP_KILL_WINDOW: Duration = Duration::from_millis(3);
/// Device plugin: a kill during start-up comes this long at most after the spawn.
const DP_START_KILL_WINDOW: Duration = Duration::from_millis(30);
/// How often the emulated kubelet retries a call that did not succeed.
const RETRY: Duration = Duration::from_millis(20);

/// One backend set up on a fresh host root.
struct Backend {
    name: &'static str,
    /// The `backends:` section.
    config: String,
    /// The extended resource the device-plugin run serves.
    resource: &'static str,
    /// A device-node path every prepared device of this backend gives the container.
    node: &'static str,
    /// Keeps the fake host root (and the NVML copy) alive.
    _root: Option<kubedev_testkit::hostroot::HostRoot>,
    host: PathBuf,
}

fn backends(dir: &Path) -> anyhow::Result<Vec<Backend>> {
    let mut out = Vec::new();
    // static: devices listed in the configuration.
    out.push(Backend {
        name: "static",
        config: format!(
            "  static:\n    pool: {NODE}\n    devices:\n      - {{name: dev-0, deviceNodes: [/dev/null]}}\n      - {{name: dev-1, deviceNodes: [/dev/null]}}\n"
        ),
        resource: "example.com/dev",
        node: "/dev/null",
        _root: None,
        host: PathBuf::from("/"),
    });
    // host: /dev/kvm slots on a fake root.
    let root = kubedev_testkit::hostroot::HostRoot::new()?;
    root.device_node("/dev/kvm")?;
    out.push(Backend {
        name: "host",
        config: "  host:\n    characterDevices:\n      - {name: kvm, path: /dev/kvm, slots: 3}\n"
            .into(),
        resource: "devices.kubevirt.io/kvm",
        node: "/dev/kvm",
        host: root.path().to_path_buf(),
        _root: Some(root),
    });
    // usb: two identical keys and a serial adapter.
    let root = machines::usb::three_devices()?;
    out.push(Backend {
        name: "usb",
        config: "  usb:\n    resources:\n      - {name: example.com/yubikey, selectors: [\"1050:0407\"]}\n"
            .into(),
        resource: "example.com/yubikey",
        node: "/dev/bus/usb/001/",
        host: root.path().to_path_buf(),
        _root: Some(root),
    });
    // vfio: four GPUs on vfio-pci.
    let root = machines::pci::dual_socket_gpu_server()?;
    out.push(Backend {
        name: "vfio",
        config: "  vfio:\n    pciDevices:\n      - {selector: \"10de:2236\", resourceName: nvidia.com/GA102GL_A10}\n"
            .into(),
        resource: "nvidia.com/GA102GL_A10",
        node: "/dev/vfio/",
        host: root.path().to_path_buf(),
        _root: Some(root),
    });
    // nvidia: a DGX A100 through the NVML stand-in.
    let lib = nvml_mock::isolated_library(dir, &nvml_mock::machine_path("dgx-a100"), None)
        .context("the NVML stand-in (cargo build -p kubedev-nvml-mock)")?;
    out.push(Backend {
        name: "nvidia",
        config: format!("  nvidia:\n    libraryPath: {}\n", lib.display()),
        resource: "nvidia.com/gpu",
        node: "/dev/nvidia",
        _root: None,
        host: dir.join("nvidia-host"),
    });
    Ok(out)
}

/// A running daemon; dropping it kills it with SIGKILL (`kill -9`) and reaps it.
struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Daemon {
    /// `kill -9` `delay` after `from`, timed on a thread of its own so the requests in flight
    /// keep both runtime workers; returns once the process is gone, with the time the signal
    /// was sent.
    async fn kill_after(self, from: Instant, delay: Duration) -> anyhow::Result<Instant> {
        tokio::task::spawn_blocking(move || {
            std::thread::sleep((from + delay).saturating_duration_since(Instant::now()));
            let at = Instant::now();
            drop(self);
            at
        })
        .await
        .context("the killer thread failed")
    }

    /// Fails when the daemon exited on its own.
    fn check_alive(&mut self) -> anyhow::Result<()> {
        if let Some(status) = self.0.try_wait()? {
            bail!("the daemon exited on its own: {status}");
        }
        Ok(())
    }
}

fn start(bin: &Path, config: &Path) -> anyhow::Result<Daemon> {
    Ok(Daemon(
        Command::new(bin)
            .args(["run", "--config"])
            .arg(config)
            .env("RUST_LOG", "error")
            .stdin(Stdio::null())
            .spawn()
            .context("starting kubedev")?,
    ))
}

/// The steps one scenario passed, for the summary, and what its random kills hit.
#[derive(Default)]
struct Record {
    steps: Vec<String>,
    /// Random kills.
    kills: usize,
    /// Random kills that cut off at least one request in flight.
    in_flight: usize,
    /// Random kills during a start-up (recovery, registration) of the daemon.
    start_up: usize,
    /// One line per crash round, printed when the scenario fails.
    rounds: Vec<String>,
}

impl Record {
    fn ok(&mut self, step: impl Into<String>) {
        self.steps.push(step.into());
    }
}

/// The seed of this run: `KUBEDEV_E2E_SEED` when set, else a fresh random one.
fn seed() -> anyhow::Result<u64> {
    match std::env::var(SEED_ENV) {
        Ok(v) => v
            .trim()
            .parse()
            .with_context(|| format!("{SEED_ENV}={v:?} is not an unsigned 64-bit number")),
        Err(std::env::VarError::NotPresent) => Ok(fastrand::u64(..)),
        Err(e) => bail!("{SEED_ENV}: {e}"),
    }
}

/// The generator of one scenario: the seed mixed with the scenario's name (FNV-1a, stable
/// across Rust versions), so each scenario's choices depend on the seed alone.
fn scenario_rng(seed: u64, backend: &str, mode: &str) -> fastrand::Rng {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in backend.bytes().chain([b'/']).chain(mode.bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    fastrand::Rng::with_seed(seed ^ h)
}

/// A delay drawn from `0..=max`, in microseconds.
fn draw_delay(rng: &mut fastrand::Rng, max: Duration) -> Duration {
    let max = u64::try_from(max.as_micros()).unwrap_or(u64::MAX);
    Duration::from_micros(rng.u64(0..=max))
}

/// Runs every scenario and prints the table; fails when one failed.
pub(crate) fn e2e(root: &Path) -> anyhow::Result<()> {
    let seed = seed()?;
    eprintln!("e2e seed {seed} (replay with {SEED_ENV}={seed})");
    let bin = crate::commands::build_daemon(root)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let dir = tempfile::Builder::new().prefix("kubedev-e2e").tempdir()?;
    let list = backends(dir.path())?;
    let mut rows = Vec::new();
    let run_started = Instant::now();
    for b in &list {
        // DRA against the oldest and the newest supported Kubernetes release.
        for mode in ["device-plugin", "dra 1.34", "dra 1.38"] {
            let started = Instant::now();
            let mut rec = Record::default();
            let mut rng = scenario_rng(seed, b.name, mode);
            let result = rt.block_on(async {
                match mode.strip_prefix("dra ") {
                    Some(release) => {
                        let release = release
                            .strip_prefix("1.")
                            .and_then(|m| m.parse().ok())
                            .and_then(KubeRelease::from_minor)
                            .context("a DRA mode names a Kubernetes release")?;
                        dra::dra_scenario(&bin, b, release, dir.path(), &mut rng, &mut rec).await
                    }
                    None => dp::dp_scenario(&bin, b, dir.path(), &mut rng, &mut rec).await,
                }
            });
            let took = started.elapsed();
            let outcome = match &result {
                Ok(()) => "pass".to_string(),
                Err(e) => format!("FAIL: {e:#}"),
            };
            eprintln!("e2e {} / {mode}: {outcome}", b.name);
            if result.is_err() || std::env::var_os("KUBEDEV_E2E_VERBOSE").is_some() {
                for (i, line) in rec.rounds.iter().enumerate() {
                    eprintln!("  crash round {}: {line}", i + 1);
                }
            }
            rows.push((b.name, mode, took, result.is_ok(), outcome, rec));
        }
    }
    println!("\n| backend | mode | steps passed | time | result |\n|---|---|---|---|---|");
    for (name, mode, took, _, outcome, rec) in &rows {
        println!(
            "| {name} | {mode} | {} | {took:.1?} | {outcome} |",
            rec.steps.join(" → ")
        );
    }
    let kills: usize = rows.iter().map(|r| r.5.kills).sum();
    let in_flight: usize = rows.iter().map(|r| r.5.in_flight).sum();
    let start_up: usize = rows.iter().map(|r| r.5.start_up).sum();
    let figures = format!(
        "seed {seed}; {kills} random kills, {in_flight} of them with requests in flight, {start_up} during start-up; {:.1?}",
        run_started.elapsed()
    );
    let failed = rows.iter().filter(|r| !r.3).count();
    if failed > 0 {
        bail!(
            "{failed} of {} scenarios failed ({figures}); replay with {SEED_ENV}={seed}",
            rows.len()
        );
    }
    println!("\nall {} scenarios passed ({figures})", rows.len());
    Ok(())
}
