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

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use kubedev_testkit::apiserver::{ApiServer, Fault, KubeRelease, Resource, Verb};
use kubedev_testkit::kubelet::{ClaimId, DraKubelet, KubeletEmulator, PreparedDeviceAnswer};
use kubedev_testkit::machines;
use serde_json::json;

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

/// What the kubelet wants for a claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Want {
    Prepared,
    Unprepared,
}

impl std::fmt::Display for Want {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Want::Prepared => "prepare",
            Want::Unprepared => "unprepare",
        })
    }
}

/// One NodePrepareResources or NodeUnprepareResources call: the claims by index.
#[derive(Debug, Clone)]
struct Call {
    op: Want,
    claims: Vec<usize>,
}

/// The random choices of one DRA crash round, all drawn before it acts.
#[derive(Debug)]
struct RoundPlan {
    calls: Vec<Call>,
    kill_after: Duration,
    /// Kill the restarted daemon once more this long after its start.
    start_kill: Option<Duration>,
}

fn plan_round(rng: &mut fastrand::Rng, claims: usize) -> RoundPlan {
    let ops: Vec<Want> = (0..claims)
        .map(|_| {
            if rng.bool() {
                Want::Prepared
            } else {
                Want::Unprepared
            }
        })
        .collect();
    let mut calls = Vec::new();
    if rng.bool() {
        // One pod with all the claims: one call per direction.
        for op in [Want::Prepared, Want::Unprepared] {
            let of_op: Vec<usize> = (0..claims).filter(|&i| ops[i] == op).collect();
            if !of_op.is_empty() {
                calls.push(Call { op, claims: of_op });
            }
        }
    } else {
        // One pod per claim.
        calls.extend(ops.iter().enumerate().map(|(i, &op)| Call {
            op,
            claims: vec![i],
        }));
    }
    if rng.u8(..4) == 0 {
        // The kubelet retries a call that is still running (its own timeout fired).
        let dup = calls[rng.usize(..calls.len())].clone();
        calls.push(dup);
    }
    rng.shuffle(&mut calls);
    let kill_after = draw_delay(rng, DRA_KILL_WINDOW);
    let start_kill = (rng.u8(..3) == 0).then(|| draw_delay(rng, DRA_START_KILL_WINDOW));
    RoundPlan {
        calls,
        kill_after,
        start_kill,
    }
}

/// Per claim UID: the prepared devices (prepare), nothing (unprepare), or the daemon's error.
type Answers = BTreeMap<String, Result<Option<Vec<PreparedDeviceAnswer>>, String>>;

/// Why a call got no answer: `sent` is false when it never reached the daemon (dialing failed,
/// or the kubelet had no registration).
struct NoAnswer {
    sent: bool,
    message: String,
}

async fn send(kubelet: &DraKubelet, op: Want, ids: &[ClaimId]) -> Result<Answers, NoAnswer> {
    let result = match op {
        Want::Prepared => kubelet.prepare(DRIVER, ids).await.map(|a| {
            a.into_iter()
                .map(|(uid, r)| (uid, r.map(Some)))
                .collect::<Answers>()
        }),
        Want::Unprepared => kubelet.unprepare(DRIVER, ids).await.map(|a| {
            a.into_iter()
                .map(|(uid, r)| (uid, r.map(|()| None)))
                .collect()
        }),
    };
    result.map_err(|s| {
        let message = s.message().to_string();
        NoAnswer {
            // The emulated kubelet's own errors before it reaches the daemon.
            sent: !(message.starts_with("dialing ") || message.contains("is not registered")),
            message,
        }
    })
}

/// Checks a daemon's answer to a call: every claim answered, without error, and prepared
/// claims with the reference devices.
fn check_answers(
    call: &Call,
    claims: &[ClaimId],
    reference: &BTreeMap<String, Vec<PreparedDeviceAnswer>>,
    answers: &Answers,
) -> anyhow::Result<()> {
    for &i in &call.claims {
        let uid = &claims[i].uid;
        match answers.get(uid) {
            None => bail!("{} answered nothing for claim {uid}", call.op),
            Some(Err(e)) => bail!("{} of claim {uid} failed: {e}", call.op),
            Some(Ok(Some(devs))) => ensure!(
                Some(devs) == reference.get(uid),
                "prepare of claim {uid} answered {devs:?}, not {:?} as before",
                reference.get(uid)
            ),
            Some(Ok(None)) => {}
        }
    }
    Ok(())
}

/// Drives every claim to what the kubelet wants, retrying as the kubelet does, and checks
/// the answers; fails after [`WAIT`].
async fn converge(
    kubelet: &DraKubelet,
    want: &[(ClaimId, Want)],
    reference: &BTreeMap<String, Vec<PreparedDeviceAnswer>>,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + WAIT;
    let claims: Vec<ClaimId> = want.iter().map(|(c, _)| c.clone()).collect();
    for (i, (claim, op)) in want.iter().enumerate() {
        let call = Call {
            op: *op,
            claims: vec![i],
        };
        loop {
            let last = match send(kubelet, *op, std::slice::from_ref(claim)).await {
                Ok(answers) => {
                    // A wrong answer fails at once; an error answer is retried.
                    if let Some(Ok(_)) = answers.get(&claim.uid) {
                        check_answers(&call, &claims, reference, &answers)?;
                        break;
                    }
                    format!("{answers:?}")
                }
                Err(e) => e.message,
            };
            ensure!(
                Instant::now() < deadline,
                "{op} of claim {} did not succeed within {WAIT:?}; last: {last}",
                claim.uid
            );
            tokio::time::sleep(RETRY).await;
        }
    }
    Ok(())
}

/// The CDI spec files (`*.json`, `*.yaml`) and the temporary files of interrupted writes
/// (`.<name>.tmp-*`) in `dir`, by name.
fn cdi_files(dir: &Path) -> anyhow::Result<(Vec<String>, Vec<String>)> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Default::default()),
        Err(e) => return Err(e).with_context(|| format!("reading {}", dir.display())),
    };
    let (mut specs, mut temps) = (Vec::new(), Vec::new());
    for e in entries {
        let name = e?.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') {
            temps.push(name);
        } else if name.ends_with(".json") || name.ends_with(".yaml") {
            specs.push(name);
        }
    }
    specs.sort();
    temps.sort();
    Ok((specs, temps))
}

/// The CDI directory holds one spec file per prepared claim and nothing else.
fn check_cdi(dir: &Path, want: &[(ClaimId, Want)]) -> anyhow::Result<()> {
    let (specs, _) = cdi_files(dir)?;
    for (claim, op) in want {
        let n = specs.iter().filter(|f| f.contains(&claim.uid)).count();
        let expected = usize::from(*op == Want::Prepared);
        ensure!(
            n == expected,
            "claim {} ({op}d): {n} CDI spec files, expected {expected}; the directory holds {specs:?}",
            claim.uid
        );
    }
    let prepared = want.iter().filter(|(_, op)| *op == Want::Prepared).count();
    ensure!(
        specs.len() == prepared,
        "CDI spec files no prepared claim owns: {specs:?}"
    );
    Ok(())
}

/// Everything a DRA crash round needs.
struct DraCrash<'a> {
    bin: &'a Path,
    config: &'a Path,
    api: &'a ApiServer,
    checkpoint: PathBuf,
    cdi: PathBuf,
    kubelet: Arc<DraKubelet>,
    claims: Arc<Vec<ClaimId>>,
    reference: Arc<BTreeMap<String, Vec<PreparedDeviceAnswer>>>,
    want: Vec<Want>,
}

impl DraCrash<'_> {
    fn wanted(&self) -> Vec<(ClaimId, Want)> {
        self.claims
            .iter()
            .cloned()
            .zip(self.want.iter().copied())
            .collect()
    }

    /// One round: concurrent calls, `kill -9` after the planned delay, a restart (killed once
    /// more during start-up if planned), then convergence. Returns the running daemon; counts
    /// the kills in `rec` and adds a line that tells what they hit.
    async fn round(
        &mut self,
        plan: &RoundPlan,
        daemon: Daemon,
        rec: &mut Record,
    ) -> anyhow::Result<Daemon> {
        let sent_at = Instant::now();
        let handles: Vec<_> = plan
            .calls
            .iter()
            .map(|c| {
                let kubelet = self.kubelet.clone();
                let ids: Vec<ClaimId> = c.claims.iter().map(|&i| self.claims[i].clone()).collect();
                let op = c.op;
                tokio::spawn(async move {
                    let r = tokio::time::timeout(WAIT, send(&kubelet, op, &ids)).await;
                    (r, sent_at.elapsed())
                })
            })
            .collect();
        let killed_at = daemon.kill_after(sent_at, plan.kill_after).await? - sent_at;
        let (mut answered, mut cut, mut unsent) = (Vec::new(), 0, 0);
        let mut failure = None;
        for (h, call) in handles.into_iter().zip(&plan.calls) {
            let (r, took) = h.await.context("a kubelet call panicked")?;
            match r {
                Err(_) => {
                    failure.get_or_insert(anyhow::anyhow!("a {} call hung after kill -9", call.op));
                }
                Ok(Ok(answers)) => {
                    if let Err(e) = check_answers(call, &self.claims, &self.reference, &answers) {
                        failure.get_or_insert(e.context("answered before kill -9"));
                    }
                    answered.push(took);
                }
                Ok(Err(NoAnswer { sent: true, .. })) => cut += 1,
                Ok(Err(NoAnswer { sent: false, .. })) => unsent += 1,
            }
        }
        for call in &plan.calls {
            for &i in &call.claims {
                self.want[i] = call.op;
            }
        }
        rec.kills += 1;
        if cut > 0 {
            rec.in_flight += 1;
        }
        let mut line = format!(
            "{} calls {:?}, kill -9 at {killed_at:.1?}: {} answered after {answered:.1?}, {cut} cut off, {unsent} not sent",
            plan.calls.len(),
            plan.calls
                .iter()
                .map(|c| format!("{} {:?}", c.op, c.claims))
                .collect::<Vec<_>>(),
            answered.len(),
        );
        if let Some(e) = failure {
            rec.rounds.push(line);
            return Err(e);
        }

        let wanted = self.wanted();
        let mut daemon = start(self.bin, self.config)?;
        let spawned = Instant::now();
        let retry = {
            let (kubelet, wanted, reference) =
                (self.kubelet.clone(), wanted.clone(), self.reference.clone());
            tokio::spawn(async move { converge(&kubelet, &wanted, &reference).await })
        };
        if let Some(delay) = plan.start_kill {
            let at = daemon.kill_after(spawned, delay).await? - spawned;
            let converged = retry.is_finished();
            rec.kills += 1;
            rec.start_up += 1;
            line.push_str(&format!(
                "; start-up kill -9 at {at:.1?} ({})",
                if converged {
                    "kubelet already converged"
                } else {
                    "kubelet still retrying"
                }
            ));
            daemon = start(self.bin, self.config)?;
        }
        rec.rounds.push(line);
        retry.await.context("the kubelet's retries panicked")??;
        // Once more against the daemon that runs now: what held must still hold.
        converge(&self.kubelet, &wanted, &self.reference).await?;
        daemon.check_alive()?;
        check_cdi(&self.cdi, &wanted)?;
        Ok(daemon)
    }
}

/// How one damage round damages a file kubedev owns.
#[derive(Debug, Clone, Copy)]
enum Damage {
    Truncate(u64),
    Garbage,
    Delete,
    Directory,
    Symlink,
}

impl Damage {
    fn draw(rng: &mut fastrand::Rng, len: u64) -> Damage {
        match rng.u8(..5) {
            0 => Damage::Truncate(rng.u64(..len.max(1))),
            1 => Damage::Garbage,
            2 => Damage::Delete,
            3 => Damage::Directory,
            _ => Damage::Symlink,
        }
    }

    fn apply(self, path: &Path, elsewhere: &Path) -> anyhow::Result<()> {
        match self {
            Damage::Truncate(n) => std::fs::OpenOptions::new()
                .write(true)
                .open(path)?
                .set_len(n)?,
            Damage::Garbage => std::fs::write(path, [0xa5u8; 777])?,
            Damage::Delete => std::fs::remove_file(path)?,
            Damage::Directory => {
                std::fs::remove_file(path)?;
                std::fs::create_dir(path)?;
            }
            Damage::Symlink => {
                std::fs::remove_file(path)?;
                std::os::unix::fs::symlink(elsewhere, path)?;
            }
        }
        Ok(())
    }
}

impl DraCrash<'_> {
    /// Sets or clears the consumers of claim `i`, as the scheduler and the claim controller do.
    fn reserve(&self, i: usize, reserved: bool) -> anyhow::Result<()> {
        let c = &self.claims[i];
        let mut claim = self
            .api
            .get(Resource::ResourceClaims, Some(&c.namespace), &c.name)
            .with_context(|| format!("claim {} is gone", c.name))?;
        claim["status"]["reservedFor"] = if reserved {
            json!([{"resource": "pods", "name": format!("pod-{}", c.name), "uid": format!("pod-{}", c.uid)}])
        } else {
            json!([])
        };
        self.api.put_raw(Resource::ResourceClaims, claim)?;
        Ok(())
    }

    /// One damage round (see the module docs): returns the running daemon and adds a line that
    /// tells what was damaged.
    async fn damage_round(
        &mut self,
        rng: &mut fastrand::Rng,
        daemon: Daemon,
        rec: &mut Record,
    ) -> anyhow::Result<Daemon> {
        // Every choice first, so a replay makes the same ones.
        let checkpoint_len = std::fs::metadata(&self.checkpoint)
            .map(|m| m.len())
            .unwrap_or(0);
        let checkpoint_damage = match rng.u8(..4) {
            0 => None,
            _ => Some(Damage::draw(rng, checkpoint_len)),
        };
        let prepared: Vec<usize> = (0..self.claims.len())
            .filter(|&i| self.want[i] == Want::Prepared)
            .collect();
        let spec_damage: Vec<Option<Damage>> = prepared
            .iter()
            .map(|_| rng.bool().then(|| Damage::draw(rng, 400)))
            .collect();
        let pod_gone = (!prepared.is_empty() && rng.u8(..3) == 0)
            .then(|| prepared[rng.usize(..prepared.len())]);

        let specs: BTreeMap<usize, (PathBuf, Vec<u8>)> = prepared
            .iter()
            .map(|&i| {
                let uid = &self.claims[i].uid;
                let path = cdi_files(&self.cdi)?
                    .0
                    .into_iter()
                    .find(|f| f.contains(uid.as_str()))
                    .map(|f| self.cdi.join(f))
                    .with_context(|| format!("prepared claim {uid} has no CDI spec"))?;
                let bytes = std::fs::read(&path)?;
                Ok((i, (path, bytes)))
            })
            .collect::<anyhow::Result<_>>()?;
        let before = self.kubelet.registrations();
        drop(daemon);
        ensure!(
            prepared.is_empty() || self.checkpoint.exists(),
            "claims are prepared but there is no checkpoint at {}",
            self.checkpoint.display()
        );
        let elsewhere = self.cdi.parent().unwrap_or(&self.cdi).join("not-a-spec");
        std::fs::write(&elsewhere, "a file a planted link points at")?;
        if let Some(d) = checkpoint_damage
            && self.checkpoint.exists()
        {
            d.apply(&self.checkpoint, &elsewhere)
                .with_context(|| format!("damaging the checkpoint with {d:?}"))?;
        }
        for (&i, d) in prepared.iter().zip(&spec_damage) {
            if let Some(d) = d {
                d.apply(&specs[&i].0, &elsewhere)
                    .with_context(|| format!("damaging a CDI spec with {d:?}"))?;
            }
        }
        if let Some(i) = pod_gone {
            self.reserve(i, false)?;
            self.want[i] = Want::Unprepared;
        }
        rec.rounds.push(format!(
            "damage: checkpoint {checkpoint_damage:?}, specs {:?}, pod of claim {pod_gone:?} deleted",
            prepared.iter().zip(&spec_damage).collect::<Vec<_>>()
        ));

        let daemon = start(self.bin, self.config)?;
        ensure!(
            self.kubelet
                .wait_until(WAIT, |k| k.registrations() > before)
                .await,
            "the daemon did not register after the damage"
        );
        // The pods that still run see their specs as they were, before any kubelet call.
        for (&i, (path, bytes)) in &specs {
            if Some(i) == pod_gone {
                continue;
            }
            let now = std::fs::symlink_metadata(path)
                .ok()
                .filter(|m| m.is_file())
                .and_then(|_| std::fs::read(path).ok());
            ensure!(
                now.as_deref() == Some(bytes.as_slice()),
                "after the damage, claim {} (its pod still runs) has no correct CDI spec at {}",
                self.claims[i].uid,
                path.display()
            );
        }
        ensure!(
            std::fs::read_to_string(&elsewhere)? == "a file a planted link points at",
            "a planted link was written through"
        );
        let wanted = self.wanted();
        converge(&self.kubelet, &wanted, &self.reference).await?;
        check_cdi(&self.cdi, &wanted)?;
        Ok(daemon)
    }
}

/// What one DRA scenario runs against: its directory, the API server of the release, the DRA
/// kubelet emulator and the daemon's configuration file. Fields drop in the reverse order of
/// creation.
struct DraEnv {
    config: PathBuf,
    kubelet: Arc<DraKubelet>,
    api: ApiServer,
    root: PathBuf,
}

impl DraEnv {
    /// Creates the scenario's directory and boot id, starts the API server of `release` (its
    /// first slice writes failing) and the DRA kubelet, and writes the configuration for
    /// backend `b`.
    async fn start(b: &Backend, release: KubeRelease, dir: &Path) -> anyhow::Result<DraEnv> {
        let root = dir.join(format!("dra-{}-{release}", b.name));
        std::fs::create_dir_all(&root)?;
        std::fs::create_dir_all(b.host.join("dev"))?;
        std::fs::write(
            root.join("boot_id"),
            "e2e00000-0000-4000-8000-000000000001\n",
        )?;
        // The API server of the release, with its default feature gates.
        let api = ApiServer::builder().kubernetes(release).start().await?;
        api.write_kubeconfig(&root.join("kubeconfig"))?;
        api.put_raw(
            Resource::Nodes,
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}}),
        )?;
        // The first slice writes fail: the publisher must retry until they land.
        api.fail_next(
            Verb::Create,
            Resource::ResourceSlices,
            3,
            Fault::ServiceUnavailable,
        );
        let kubelet = Arc::new(DraKubelet::start(root.join("registry"))?);
        let config = root.join("kubedev.yaml");
        std::fs::write(
            &config,
            format!(
                "nodeName: {NODE}\nhostRoot: {host}\nstateDir: {r}/state\ndevicePlugin:\n  enabled: false\ndra:\n  enabled: true\n  driverName: {DRIVER}\n  kubeconfig: {r}/kubeconfig\n  pluginDir: {r}/plugins\n  registryDir: {r}/registry\n  cdiDir: {r}/cdi\n  bootIdPath: {r}/boot_id\nbackends:\n{}",
                b.config,
                host = b.host.display(),
                r = root.display()
            ),
        )?;
        Ok(DraEnv {
            config,
            kubelet,
            api,
            root,
        })
    }
}

/// One DRA scenario (see the module docs): registration, slices published through API
/// faults, claims allocated, the first claim prepared and surviving `kill -9`, then crash
/// rounds, damage rounds, and everything unprepared.
async fn dra_scenario(
    bin: &Path,
    b: &Backend,
    release: KubeRelease,
    dir: &Path,
    rng: &mut fastrand::Rng,
    rec: &mut Record,
) -> anyhow::Result<()> {
    let env = DraEnv::start(b, release, dir).await?;
    let kubelet = &env.kubelet;
    let daemon = start(bin, &env.config)?;
    ensure!(
        kubelet
            .wait_until(WAIT, |k| k.drivers().contains_key(DRIVER))
            .await,
        "the DRA driver did not register: {:?}",
        kubelet.rejected()
    );
    rec.ok("registered");

    let slices = published_slices(&env.api).await?;
    rec.ok("published through API faults");

    let claims = allocate_claims(&env.api, slices)?;
    let n = claims.len();
    rec.ok(format!("{n} claims allocated"));

    let id = claims[0].clone();
    let (daemon, again) = first_claim_survives_kill(bin, b, &env, &id, daemon, rec).await?;

    // The reference answers: the first clean prepare of every claim.
    let reference = reference_answers(kubelet, &claims, &id, again).await?;
    let mut want = vec![Want::Prepared; n];
    want[0] = Want::Unprepared;
    let cdi_dir = env.root.join("cdi");
    let mut crash = DraCrash {
        bin,
        config: &env.config,
        api: &env.api,
        // `kubedev::checkpoint::CHECKPOINT_FILE` (xtask does not link the daemon's library); a
        // damage round with prepared claims and no file there fails.
        checkpoint: env.root.join("plugins").join("kubedev-checkpoint.json"),
        cdi: cdi_dir.clone(),
        kubelet: kubelet.clone(),
        claims: Arc::new(claims),
        reference: Arc::new(reference),
        want,
    };
    check_cdi(&cdi_dir, &crash.wanted())?;

    let mut daemon = daemon;
    for _ in 0..DRA_CRASH_ROUNDS {
        let plan = plan_round(rng, n);
        daemon = crash.round(&plan, daemon, rec).await?;
    }
    rec.ok(format!(
        "{} random kills ({} in flight, {} in start-up), converged",
        rec.kills, rec.in_flight, rec.start_up
    ));

    // Pods run for the prepared claims; their state is damaged between restarts.
    for i in 0..n {
        crash.reserve(i, crash.want[i] == Want::Prepared)?;
    }
    for _ in 0..DRA_DAMAGE_ROUNDS {
        daemon = crash.damage_round(rng, daemon, rec).await?;
    }
    rec.ok(format!(
        "{DRA_DAMAGE_ROUNDS} rounds of damaged checkpoint and CDI specs, running pods kept their specs"
    ));

    unprepare_all(&mut crash, &id).await?;
    daemon.check_alive()?;
    rec.ok("all unprepared, no CDI file left, prepare again works");
    drop(daemon);
    drop(crash);
    let DraEnv { kubelet, api, .. } = env;
    if let Ok(k) = Arc::try_unwrap(kubelet) {
        k.stop().await;
    }
    api.shutdown().await;
    Ok(())
}

/// Waits until the daemon's ResourceSlices with devices are in the API server; returns them.
async fn published_slices(api: &ApiServer) -> anyhow::Result<Vec<serde_json::Value>> {
    let deadline = Instant::now() + WAIT;
    loop {
        let s: Vec<_> = api
            .objects(Resource::ResourceSlices)
            .into_iter()
            .filter(|s| s["spec"]["driver"] == DRIVER && s["spec"]["devices"].is_array())
            .collect();
        if !s.is_empty() {
            return Ok(s);
        }
        ensure!(Instant::now() < deadline, "no ResourceSlice was published");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Several claims, one device each (at most [`CRASH_CLAIMS`]), allocated together by the
/// allocator so they get distinct devices, and written to the API server with their
/// allocations; returns them.
fn allocate_claims(
    api: &ApiServer,
    slices: Vec<serde_json::Value>,
) -> anyhow::Result<Vec<ClaimId>> {
    let published: usize = slices
        .iter()
        .filter_map(|s| s["spec"]["devices"].as_array().map(Vec::len))
        .sum();
    let n = published.min(CRASH_CLAIMS);
    ensure!(n > 0, "the published slices hold no device");
    let claims: Vec<ClaimId> = (1..=n)
        .map(|i| {
            ClaimId::new(
                "default",
                &format!("claim-{i}"),
                &format!("e2e00000-cla1-4000-8000-00000000000{i}"),
            )
        })
        .collect();
    let objects: Vec<_> = claims
        .iter()
        .map(|c| {
            json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"name": c.name, "namespace": c.namespace, "uid": c.uid},
                "spec": {"devices": {"requests": [{"name": "dev", "exactly": {"deviceClassName": "e2e"}}]}}})
        })
        .collect();
    let class = json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
        "metadata": {"name": "e2e"},
        "spec": {"selectors": [{"cel": {"expression": format!("device.driver == '{DRIVER}'")}}]}});
    let scenario = json!({"node": {"name": NODE}, "deviceClasses": [class],
        "resourceSlices": slices, "claims": objects});
    let scenario = kubedev_allocator::Scenario::from_text(&scenario.to_string())?;
    let out =
        kubedev_allocator::simulate(&scenario, &kubedev_allocator::SimulateOptions::default());
    ensure!(out.allocatable, "the claims do not fit: {}", out.to_text());
    ensure!(
        out.claims.len() == n,
        "the allocator answered for {} claims, not {n}",
        out.claims.len()
    );
    for (mut stored, c) in objects.into_iter().zip(&out.claims) {
        stored["status"] = json!({"allocation": serde_json::to_value(&c.allocation)?});
        api.put_raw(Resource::ResourceClaims, stored)?;
    }
    Ok(claims)
}

/// Claim `id` is prepared (its CDI spec holds the backend's device node), the daemon is
/// killed with `kill -9` and restarted, prepare answers the same, and unprepare removes the
/// spec. Returns the restarted daemon and its prepare answer.
async fn first_claim_survives_kill(
    bin: &Path,
    b: &Backend,
    env: &DraEnv,
    id: &ClaimId,
    daemon: Daemon,
    rec: &mut Record,
) -> anyhow::Result<(Daemon, Vec<PreparedDeviceAnswer>)> {
    let kubelet = &env.kubelet;
    let uid = id.uid.as_str();
    let first = kubelet
        .prepare(DRIVER, std::slice::from_ref(id))
        .await?
        .remove(uid)
        .context("no answer for the claim")?
        .map_err(anyhow::Error::msg)?;
    let cdi_dir = env.root.join("cdi");
    let cdi: Vec<PathBuf> = std::fs::read_dir(&cdi_dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    ensure!(cdi.len() == 1, "expected one CDI file, found {cdi:?}");
    let spec = std::fs::read_to_string(&cdi[0])?;
    ensure!(
        spec.contains(b.node),
        "the CDI spec lacks {}: {spec}",
        b.node
    );
    rec.ok("prepared, CDI checked");

    // kill -9 and a restart: the prepared claim survives, prepare answers the same.
    drop(daemon);
    let daemon = start(bin, &env.config)?;
    let again = prepare_until_answered(kubelet, id).await?;
    ensure!(
        again.len() == first.len()
            && again
                .iter()
                .zip(&first)
                .all(|(a, b)| a.device == b.device && a.cdi_device_ids == b.cdi_device_ids),
        "prepare after kill -9 answered differently: {first:?} vs {again:?}"
    );
    rec.ok("kill -9, same answer");

    let un = kubelet.unprepare(DRIVER, std::slice::from_ref(id)).await?;
    ensure!(
        un.get(uid).is_some_and(|r| r.is_ok()),
        "unprepare failed: {un:?}"
    );
    ensure!(!cdi[0].exists(), "the CDI spec is still there");
    rec.ok("unprepared");
    Ok((daemon, again))
}

/// Prepares claim `id` until the restarted daemon answers with its devices.
async fn prepare_until_answered(
    kubelet: &DraKubelet,
    id: &ClaimId,
) -> anyhow::Result<Vec<PreparedDeviceAnswer>> {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Ok(mut a) = kubelet.prepare(DRIVER, std::slice::from_ref(id)).await
            && let Some(Ok(devs)) = a.remove(id.uid.as_str())
        {
            return Ok(devs);
        }
        ensure!(
            Instant::now() < deadline,
            "prepare after the restart did not answer"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The reference answers: `first` for claim `id` (already prepared once), and a first clean
/// prepare of every other claim.
async fn reference_answers(
    kubelet: &DraKubelet,
    claims: &[ClaimId],
    id: &ClaimId,
    first: Vec<PreparedDeviceAnswer>,
) -> anyhow::Result<BTreeMap<String, Vec<PreparedDeviceAnswer>>> {
    let mut reference = BTreeMap::from([(id.uid.clone(), first)]);
    for c in &claims[1..] {
        let devs = kubelet
            .prepare(DRIVER, std::slice::from_ref(c))
            .await?
            .remove(&c.uid)
            .with_context(|| format!("no answer for claim {}", c.uid))?
            .map_err(anyhow::Error::msg)
            .with_context(|| format!("preparing claim {}", c.uid))?;
        reference.insert(c.uid.clone(), devs);
    }
    Ok(reference)
}

/// The kubelet unprepares everything: no spec file (nor temporary file) is left, and the
/// driver still prepares and unprepares claim `id`.
async fn unprepare_all(crash: &mut DraCrash<'_>, id: &ClaimId) -> anyhow::Result<()> {
    let n = crash.claims.len();
    crash.want = vec![Want::Unprepared; n];
    let wanted = crash.wanted();
    converge(&crash.kubelet, &wanted, &crash.reference).await?;
    check_cdi(&crash.cdi, &wanted)?;
    let (specs, temps) = cdi_files(&crash.cdi)?;
    ensure!(specs.is_empty(), "CDI spec files left: {specs:?}");
    // Every kill was followed by a restart, whose recovery removes what interrupted writes left.
    ensure!(
        temps.is_empty(),
        "temporary files of interrupted CDI writes left after recovery: {temps:?}"
    );
    let last = vec![(id.clone(), Want::Prepared)];
    converge(&crash.kubelet, &last, &crash.reference).await?;
    check_cdi(&crash.cdi, &last)?;
    let last = vec![(id.clone(), Want::Unprepared)];
    converge(&crash.kubelet, &last, &crash.reference).await?;
    check_cdi(&crash.cdi, &last)?;
    Ok(())
}

/// The random choices of one device-plugin crash round, all drawn before it acts.
#[derive(Debug)]
struct DpPlan {
    /// Devices (by index into the advertised IDs) of the concurrent Allocate calls.
    allocations: Vec<usize>,
    kill_after: Duration,
    /// Kill the restarted daemon once more this long after its start.
    start_kill: Option<Duration>,
}

fn plan_dp_round(rng: &mut fastrand::Rng, devices: usize) -> DpPlan {
    let calls = rng.usize(1..=3);
    DpPlan {
        allocations: (0..calls).map(|_| rng.usize(..devices)).collect(),
        kill_after: draw_delay(rng, DP_KILL_WINDOW),
        start_kill: rng.bool().then(|| draw_delay(rng, DP_START_KILL_WINDOW)),
    }
}

/// Waits until `resource` was registered after `since` with the devices `ids`, and Allocate
/// answers with the backend's device node.
async fn check_reregistered(
    kubelet: &KubeletEmulator,
    b: &Backend,
    since: Duration,
    ids: &[String],
) -> anyhow::Result<()> {
    ensure!(
        kubelet.wait_registered_since(b.resource, since, WAIT).await,
        "not registered again after kill -9"
    );
    let st = kubelet
        .wait_for(b.resource, WAIT, |r| {
            r.connected && r.devices.keys().eq(ids.iter())
        })
        .await
        .with_context(|| {
            format!(
                "the restarted daemon does not advertise {ids:?}: {:?}",
                kubelet.resource(b.resource)
            )
        })?;
    let id = st.devices.keys().next().context("no device")?;
    let a = kubelet.allocate(b.resource, &[id]).await?;
    ensure!(
        a.devices.iter().any(|d| d.host_path.starts_with(b.node)),
        "Allocate after kill -9 lacks {}: {a:?}",
        b.node
    );
    Ok(())
}

async fn dp_scenario(
    bin: &Path,
    b: &Backend,
    dir: &Path,
    rng: &mut fastrand::Rng,
    rec: &mut Record,
) -> anyhow::Result<()> {
    let root = dir.join(format!("dp-{}", b.name));
    let dp = root.join("device-plugins");
    std::fs::create_dir_all(&dp)?;
    std::fs::create_dir_all(b.host.join("dev"))?;
    let config = root.join("kubedev.yaml");
    std::fs::write(
        &config,
        format!(
            "nodeName: {NODE}\nhostRoot: {host}\nstateDir: {r}/state\ndevicePlugin:\n  directory: {dp}\n  resources:\n    - name: {res}\nbackends:\n{}",
            b.config,
            host = b.host.display(),
            r = root.display(),
            dp = dp.display(),
            res = b.resource
        ),
    )?;
    let mut kubelet = KubeletEmulator::start(&dp).await?;
    let mut daemon = start(bin, &config)?;
    let st = kubelet
        .wait_for(b.resource, WAIT, |r| r.connected && r.capacity > 0)
        .await
        .context("not registered")?;
    rec.ok("registered");
    let id = st.devices.keys().next().context("no device")?.clone();
    let a = kubelet.allocate(b.resource, &[&id]).await?;
    ensure!(
        a.devices.iter().any(|d| d.host_path.starts_with(b.node)),
        "Allocate lacks {}: {a:?}",
        b.node
    );
    rec.ok("allocated, edits checked");
    kubelet.restart().await?;
    let again = kubelet
        .wait_for(b.resource, WAIT, |r| {
            r.connected && r.capacity == st.capacity
        })
        .await
        .context("not re-registered after the kubelet restart")?;
    ensure!(
        again.devices.keys().eq(st.devices.keys()),
        "other devices after the restart"
    );
    rec.ok("kubelet restart, re-registered");

    // Crash rounds: kill -9 while Allocate calls run, sometimes again during the start-up.
    let ids: Arc<Vec<String>> = Arc::new(st.devices.keys().cloned().collect());
    let kubelet = Arc::new(kubelet);
    for _ in 0..DP_CRASH_ROUNDS {
        let plan = plan_dp_round(rng, ids.len());
        let sent_at = Instant::now();
        let handles: Vec<_> = plan
            .allocations
            .iter()
            .map(|&i| {
                let (kubelet, ids, resource) = (kubelet.clone(), ids.clone(), b.resource);
                tokio::spawn(async move {
                    let r =
                        tokio::time::timeout(WAIT, kubelet.allocate(resource, &[ids[i].as_str()]))
                            .await;
                    (r, sent_at.elapsed())
                })
            })
            .collect();
        let killed_at = daemon.kill_after(sent_at, plan.kill_after).await? - sent_at;
        let (mut answered, mut cut, mut unsent) = (Vec::new(), 0, 0);
        let mut failure = None;
        for h in handles {
            let (r, took) = h.await.context("an Allocate call panicked")?;
            match r {
                Err(_) => {
                    failure.get_or_insert(anyhow::anyhow!("an Allocate call hung after kill -9"));
                }
                Ok(Ok(a)) => {
                    if !a.devices.iter().any(|d| d.host_path.starts_with(b.node)) {
                        failure.get_or_insert(anyhow::anyhow!(
                            "Allocate before kill -9 lacks {}: {a:?}",
                            b.node
                        ));
                    }
                    answered.push(took);
                }
                Ok(Err(s))
                    if s.message().starts_with("dialing ")
                        || s.message().contains("is not registered") =>
                {
                    unsent += 1
                }
                Ok(Err(_)) => cut += 1,
            }
        }
        rec.kills += 1;
        if cut > 0 {
            rec.in_flight += 1;
        }
        let mut line = format!(
            "{} Allocate calls, kill -9 at {killed_at:.1?}: {} answered after {answered:.1?}, {cut} cut off, {unsent} not sent",
            plan.allocations.len(),
            answered.len()
        );
        if let Some(e) = failure {
            rec.rounds.push(line);
            return Err(e);
        }
        let mut since = kubelet.uptime();
        daemon = start(bin, &config)?;
        if let Some(delay) = plan.start_kill {
            let spawned = Instant::now();
            let at = daemon.kill_after(spawned, delay).await? - spawned;
            let registered = kubelet
                .registrations()
                .iter()
                .find(|r| r.resource == b.resource && r.rejected.is_none() && r.at >= since)
                .map(|r| r.at - since);
            rec.kills += 1;
            rec.start_up += 1;
            line.push_str(&format!(
                "; start-up kill -9 at {at:.1?} ({})",
                match registered {
                    Some(t) => format!("it had registered at {t:.1?}"),
                    None => "before it registered".into(),
                }
            ));
            since = kubelet.uptime();
            daemon = start(bin, &config)?;
        }
        rec.rounds.push(line);
        check_reregistered(&kubelet, b, since, &ids).await?;
        daemon.check_alive()?;
    }
    rec.ok(format!(
        "{} random kills ({} in flight, {} in start-up), re-registered, same devices, Allocate answers",
        rec.kills, rec.in_flight, rec.start_up
    ));
    drop(daemon);
    if let Ok(k) = Arc::try_unwrap(kubelet) {
        k.stop().await;
    }
    Ok(())
}

/// Runs every scenario and prints the table; fails when one failed.
pub(crate) fn e2e(root: &Path) -> anyhow::Result<()> {
    let seed = seed()?;
    eprintln!("e2e seed {seed} (replay with {SEED_ENV}={seed})");
    let bin = crate::ci::build_daemon(root)?;
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
        for mode in ["device-plugin", "dra 1.34", "dra 1.37"] {
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
                        dra_scenario(&bin, b, release, dir.path(), &mut rng, &mut rec).await
                    }
                    None => dp_scenario(&bin, b, dir.path(), &mut rng, &mut rec).await,
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
