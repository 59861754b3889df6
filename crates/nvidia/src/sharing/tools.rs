//! Running the sharing tools for a claim: `nvidia-smi` for compute modes and time-slices, the
//! MPS control daemon (started, configured, stopped) for MPS, and checking a claim's sharing
//! before any of them runs.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kubedev_core::{ClaimRef, ContainerEdits, Mount, PrepareError};

use super::{MPS_CONTAINER_PIPE_DIR, MpsConfig, Strategy, Target, mib};

/// How long a tool or the MPS daemon may take to answer.
const TOOL_TIMEOUT: Duration = Duration::from_secs(10);

/// Runs the sharing tools for one backend.
#[derive(Debug, Clone)]
pub(crate) struct Sharing {
    smi: PathBuf,
    mps_control: PathBuf,
    mps_root: PathBuf,
}

/// Runs `cmd`, feeding it `input`; its output, or an error naming the program and what it said.
fn run(mut cmd: Command, input: &str) -> Result<String, String> {
    let program = cmd.get_program().to_string_lossy().into_owned();
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("running {program}: {}", kubedev_core::echo::chain(&e)))?;
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(input.as_bytes());
    }
    let deadline = Instant::now() + TOOL_TIMEOUT;
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "{program} did not finish within {} s",
                    TOOL_TIMEOUT.as_secs()
                ));
            }
            Err(e) => {
                return Err(format!(
                    "waiting for {program}: {}",
                    kubedev_core::echo::chain(&e)
                ));
            }
        }
    }
    let out = child.wait_with_output().map_err(|e| {
        format!(
            "reading {program}'s output: {}",
            kubedev_core::echo::chain(&e)
        )
    })?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    if out.status.success() {
        Ok(text)
    } else {
        Err(format!(
            "{program} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim(),
            text.trim()
        ))
    }
}

impl Sharing {
    pub(crate) fn new(smi: &Path, mps_control: &Path, state_dir: &Path) -> Self {
        Sharing {
            smi: smi.to_path_buf(),
            mps_control: mps_control.to_path_buf(),
            mps_root: state_dir.join("mps"),
        }
    }

    fn claim_dir(&self, claim: &ClaimRef) -> PathBuf {
        self.mps_root.join(claim.uid.as_str())
    }

    fn smi(&self, args: &[&str]) -> Result<(), String> {
        let mut cmd = Command::new(&self.smi);
        cmd.args(args);
        run(cmd, "").map(|_| ())
    }

    fn mps(&self, dir: &Path, devices: &str, args: &[&str], input: &str) -> Result<String, String> {
        let mut cmd = Command::new(&self.mps_control);
        cmd.args(args)
            .env("CUDA_MPS_PIPE_DIRECTORY", dir.join("pipe"))
            .env("CUDA_MPS_LOG_DIRECTORY", dir.join("log"))
            .env("CUDA_VISIBLE_DEVICES", devices);
        run(cmd, input)
    }

    /// Checks every device's sharing and that a claim's MPS devices agree, before anything on
    /// the host changes.
    pub(crate) fn check(claim: &ClaimRef, targets: &[Target]) -> Result<(), PrepareError> {
        let config_error = |message: String| PrepareError::Config {
            claim: claim.to_string(),
            message,
        };
        let empty = MpsConfig::default();
        let mut mps: Option<&MpsConfig> = None;
        for t in targets {
            let Some(s) = &t.sharing else { continue };
            match s.strategy {
                Strategy::TimeSlicing if !t.whole_gpu => {
                    return Err(config_error(format!(
                        "sharing.strategy: TimeSlicing applies to whole GPUs; {} is a MIG device",
                        t.uuid
                    )));
                }
                Strategy::TimeSlicing => {}
                Strategy::Mps => {
                    let this = s.mps_config.as_ref();
                    let this = this.unwrap_or(&empty);
                    match mps {
                        Some(first) if first != this => {
                            return Err(config_error(
                                "sharing.mpsConfig: the claim's MPS devices have different MPS \
                                 settings; one MPS daemon serves the claim, so they must agree"
                                    .into(),
                            ));
                        }
                        _ => mps = Some(this),
                    }
                }
            }
        }
        if let Some(m) = mps {
            let uuids = mps_uuids(targets);
            for key in m.default_per_device_pinned_memory_limit.keys() {
                device_key(key, &uuids).map_err(config_error)?;
            }
        }
        Ok(())
    }

    /// Applies `targets`' sharing for `claim`; returns extra edits per target (by position).
    pub(crate) fn apply(
        &self,
        claim: &ClaimRef,
        targets: &[Target],
    ) -> Result<Vec<ContainerEdits>, String> {
        let mut edits = vec![ContainerEdits::default(); targets.len()];
        self.set_compute_modes(targets)?;
        let uuids = mps_uuids(targets);
        let Some(first) = targets.iter().position(|t| {
            t.sharing
                .as_ref()
                .is_some_and(|s| s.strategy == Strategy::Mps)
        }) else {
            return Ok(edits);
        };
        let config = targets[first]
            .sharing
            .as_ref()
            .and_then(|s| s.mps_config.clone())
            .unwrap_or_default();
        let dir = self.claim_dir(claim);
        let devices = uuids.join(",");
        self.start_mps_daemon(claim, &dir, &devices)?;
        let commands = mps_settings(&config, &uuids);
        if !commands.is_empty() {
            let answer = self
                .mps(&dir, &devices, &[], &commands)
                .map_err(|e| format!("configuring the MPS control daemon of claim {claim}: {e}"))?;
            if let Some(bad) = answer.lines().find(|l| l.starts_with("Invalid")) {
                return Err(format!(
                    "the MPS control daemon of claim {claim} refused: {bad}"
                ));
            }
        }
        let e = &mut edits[first];
        e.mounts.push(Mount::bind(
            dir.join("pipe").display().to_string(),
            MPS_CONTAINER_PIPE_DIR,
            false,
        ));
        e.env.insert(
            "CUDA_MPS_PIPE_DIRECTORY".into(),
            MPS_CONTAINER_PIPE_DIR.into(),
        );
        Ok(edits)
    }

    /// Sets the compute mode (and for time-slicing the time-slice) of each whole GPU shared.
    fn set_compute_modes(&self, targets: &[Target]) -> Result<(), String> {
        for t in targets.iter().filter(|t| t.whole_gpu) {
            match t.sharing.as_ref().map(|s| s.strategy) {
                Some(Strategy::TimeSlicing) => {
                    let interval = t
                        .sharing
                        .as_ref()
                        .and_then(|s| s.time_slicing_config.as_ref())
                        .and_then(|c| c.interval)
                        .unwrap_or_default();
                    self.smi(&["-i", &t.uuid, "-c", "DEFAULT"])?;
                    let n = interval.value().to_string();
                    self.smi(&["compute-policy", "-i", &t.uuid, "--set-timeslice", &n])?;
                }
                Some(Strategy::Mps) => self.smi(&["-i", &t.uuid, "-c", "EXCLUSIVE_PROCESS"])?,
                None => {}
            }
        }
        Ok(())
    }

    /// Starts the MPS control daemon of `claim` in `dir` for `devices` (comma-separated
    /// UUIDs), unless it already runs (a repeated prepare).
    fn start_mps_daemon(&self, claim: &ClaimRef, dir: &Path, devices: &str) -> Result<(), String> {
        for sub in ["pipe", "log"] {
            kubedev_core::safefs::create_dir_all_mode(&dir.join(sub), 0o755)
                .map_err(|e| format!("creating {}: {e}", dir.join(sub).display()))?;
        }
        let running = self
            .mps(dir, devices, &[], "get_default_active_thread_percentage\n")
            .is_ok();
        if !running {
            // The daemon leaves its starter's process group; as the subreaper of what this
            // process starts, kubedev inherits it (also when it is not PID 1 of its container)
            // and can reap it once it quits, instead of leaving a zombie.
            if let Err(e) = rustix::process::set_child_subreaper(Some(rustix::process::getpid())) {
                tracing::debug!(error = %kubedev_core::echo::Chain(&e), "cannot become the subreaper of the MPS daemons");
            }
            self.mps(dir, devices, &["-d"], "")
                .map_err(|e| format!("starting the MPS control daemon of claim {claim}: {e}"))?;
        }
        Ok(())
    }

    /// Undoes what [`Sharing::apply`] did for `claim`: stops its MPS daemon and removes its
    /// directories (whatever the configuration says, so nothing outlives a crash), and puts the
    /// whole GPUs it shared back to the default compute mode and time-slice.
    pub(crate) fn undo(&self, claim: &ClaimRef, targets: &[Target]) -> Result<(), String> {
        let dir = self.claim_dir(claim);
        if dir.exists() {
            self.stop_daemon(&dir);
            std::fs::remove_dir_all(&dir)
                .map_err(|e| format!("removing {}: {e}", dir.display()))?;
        }
        for t in targets.iter().filter(|t| t.whole_gpu) {
            match t.sharing.as_ref().map(|s| s.strategy) {
                Some(Strategy::TimeSlicing) => {
                    self.smi(&["compute-policy", "-i", &t.uuid, "--set-timeslice", "0"])?;
                    self.smi(&["-i", &t.uuid, "-c", "DEFAULT"])?;
                }
                Some(Strategy::Mps) => self.smi(&["-i", &t.uuid, "-c", "DEFAULT"])?,
                None => {}
            }
        }
        Ok(())
    }

    /// Asks the daemon in `dir` to quit and waits for its process to end, killing it when it
    /// does not within the timeout.
    fn stop_daemon(&self, dir: &Path) {
        let pid_file = dir.join("pipe").join("nvidia-cuda-mps-control.pid");
        let pid: Option<i32> = std::fs::read_to_string(&pid_file)
            .ok()
            .and_then(|t| t.trim().parse().ok());
        if let Err(e) = self.mps(dir, "", &[], "quit\n") {
            tracing::debug!(dir = %dir.display(), error = %e, "the MPS control daemon did not take quit");
        }
        let Some(pid) = pid.filter(|p| *p > 1) else {
            return;
        };
        let alive = || Path::new(&format!("/proc/{pid}")).exists() && !is_zombie(pid);
        let deadline = Instant::now() + TOOL_TIMEOUT;
        while alive() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        let Some(handle) = rustix::process::Pid::from_raw(pid) else {
            return;
        };
        if alive() {
            tracing::warn!(pid, "the MPS control daemon did not quit; killing it");
            let _ = rustix::process::kill_process(handle, rustix::process::Signal::KILL);
            std::thread::sleep(Duration::from_millis(50));
        }
        // Reap it when it is this process's (see `apply`); a daemon another process started is
        // not, and waitpid says so.
        let _ = rustix::process::waitpid(Some(handle), rustix::process::WaitOptions::NOHANG);
    }
}

/// Whether process `pid` has exited and waits for its parent to reap it.
fn is_zombie(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(") ").map(|(_, rest)| rest.starts_with('Z')))
        .unwrap_or(true)
}

/// The claim's MPS devices' UUIDs, sorted.
fn mps_uuids(targets: &[Target]) -> Vec<String> {
    let mut v: Vec<String> = targets
        .iter()
        .filter(|t| {
            t.sharing
                .as_ref()
                .is_some_and(|s| s.strategy == Strategy::Mps)
        })
        .map(|t| t.uuid.clone())
        .collect();
    v.sort();
    v.dedup();
    v
}

/// The MPS control commands that set `config`'s active-thread percentage and each of `uuids`'
/// pinned-memory limit (its own, else the default); empty when `config` sets nothing.
fn mps_settings(config: &MpsConfig, uuids: &[String]) -> String {
    let mut commands = String::new();
    if let Some(p) = config.default_active_thread_percentage {
        commands.push_str(&format!("set_default_active_thread_percentage {p}\n"));
    }
    for (i, uuid) in uuids.iter().enumerate() {
        let limit = config
            .default_per_device_pinned_memory_limit
            .iter()
            .find(|(k, _)| device_key(k, uuids).ok() == Some(i))
            .map(|(_, q)| q)
            .or(config.default_pinned_device_memory_limit.as_ref());
        if let Some(m) = limit.and_then(mib) {
            commands.push_str(&format!("set_default_device_pinned_mem_limit {uuid} {m}\n"));
        }
    }
    commands
}

/// The position among `uuids` a per-device key names: a UUID, or an index.
pub(super) fn device_key(key: &str, uuids: &[String]) -> Result<usize, String> {
    let field = format!("sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit.{key}");
    if let Some(i) = uuids.iter().position(|u| u == key) {
        return Ok(i);
    }
    match key.parse::<usize>() {
        Ok(i) if i < uuids.len() => Ok(i),
        Ok(i) => Err(format!(
            "{field}: index {i} is out of range; the claim has {} MPS devices",
            uuids.len()
        )),
        Err(_) => Err(format!(
            "{field}: neither the UUID of one of the claim's MPS devices nor an index"
        )),
    }
}
