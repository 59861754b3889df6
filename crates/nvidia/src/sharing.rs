//! GPU sharing per claim, chosen by the claim's (or its class's) opaque configuration:
//!
//! ```yaml
//! apiVersion: gpu.kubedev.io/v1alpha1
//! kind: GpuConfig
//! sharing:
//!   strategy: MPS                      # or TimeSlicing
//!   timeSlicingConfig: {interval: Long}  # Default, Short, Medium, Long (TimeSlicing only)
//!   mpsConfig:                         # MPS only
//!     defaultActiveThreadPercentage: 50
//!     defaultPinnedDeviceMemoryLimit: 10Gi
//!     defaultPerDevicePinnedMemoryLimit: {"0": 5Gi}   # by GPU UUID or index in the claim
//! ```
//!
//! - **Time-slicing** sets each whole GPU's compute mode to `DEFAULT` and its compute time-slice
//!   (0 = Default … 3 = Long) with `nvidia-smi` (NVML has no call for the time-slice); unprepare
//!   puts both back to the default. MIG devices cannot be time-sliced.
//! - **MPS** starts one MPS control daemon per claim for the claim's MPS devices
//!   (`CUDA_VISIBLE_DEVICES` = their UUIDs), its pipe and log directories under
//!   `<state>/mps/<claim UID>/`; whole GPUs are set to `EXCLUSIVE_PROCESS`. The daemon gets the
//!   active-thread percentage and pinned-memory limits; containers get the pipe directory at
//!   `/tmp/nvidia-mps` and `CUDA_MPS_PIPE_DIRECTORY`. Unprepare (also after a crash) sends the
//!   daemon `quit`, kills it if it lingers, removes its directories and puts the compute mode
//!   back to `DEFAULT`.
//!
//! Every configuration is checked before anything on the host changes; errors name the entry
//! and the field.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kubedev_core::{
    AllocatedDevice, ClaimRef, ConfigError, ContainerEdits, Mount, PrepareError, Quantity,
    ValidateConfig, config_kind, effective_config,
};
use serde::Deserialize;

/// The API version of the configuration objects.
pub const CONFIG_API_VERSION: &str = "gpu.kubedev.io/v1alpha1";
/// Where containers find the MPS pipe directory.
pub const MPS_CONTAINER_PIPE_DIR: &str = "/tmp/nvidia-mps";
/// How long a tool or the MPS daemon may take to answer.
const TOOL_TIMEOUT: Duration = Duration::from_secs(10);

/// A GPU configuration object.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GpuConfig {
    /// Must be [`CONFIG_API_VERSION`].
    pub api_version: String,
    /// Must be `GpuConfig`.
    pub kind: String,
    /// How the claim's GPUs are shared; none: not shared.
    #[serde(default)]
    pub sharing: Option<GpuSharing>,
}

/// How a claim's GPUs are shared by its containers.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GpuSharing {
    /// The strategy.
    pub strategy: Strategy,
    /// Settings of `TimeSlicing`.
    #[serde(default)]
    pub time_slicing_config: Option<TimeSlicingConfig>,
    /// Settings of `MPS`.
    #[serde(default)]
    pub mps_config: Option<MpsConfig>,
}

/// A sharing strategy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum Strategy {
    /// Containers take turns on the GPU.
    TimeSlicing,
    /// Containers run at once through an MPS control daemon.
    #[serde(rename = "MPS")]
    Mps,
}

/// Time-slicing settings.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TimeSlicingConfig {
    /// The time-slice length (default `Default`).
    #[serde(default)]
    pub interval: Option<Interval>,
}

/// A compute time-slice length.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub enum Interval {
    /// The driver's default.
    #[default]
    Default,
    /// Short.
    Short,
    /// Medium.
    Medium,
    /// Long.
    Long,
}

impl Interval {
    /// The value `nvidia-smi compute-policy --set-timeslice` takes.
    pub fn value(self) -> u32 {
        match self {
            Interval::Default => 0,
            Interval::Short => 1,
            Interval::Medium => 2,
            Interval::Long => 3,
        }
    }
}

/// MPS settings.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MpsConfig {
    /// The share of each GPU's threads a client may use, 0 to 100.
    #[serde(default)]
    pub default_active_thread_percentage: Option<i64>,
    /// The pinned device memory a client may use on each GPU (at least 1Mi).
    #[serde(default)]
    pub default_pinned_device_memory_limit: Option<Quantity>,
    /// Per GPU (by UUID, or by index among the claim's MPS GPUs sorted by UUID), overriding
    /// the default limit.
    #[serde(default)]
    pub default_per_device_pinned_memory_limit: BTreeMap<String, Quantity>,
}

const MIB: i64 = 1024 * 1024;

/// A limit in whole MiB as MPS takes it (`10240M`); `None` when under 1 MiB.
fn mib(q: &Quantity) -> Option<String> {
    q.value()
        .filter(|v| *v >= MIB)
        .map(|v| format!("{}M", v / MIB))
}

impl ValidateConfig for GpuConfig {
    fn validate(&self) -> Result<(), String> {
        if self.api_version != CONFIG_API_VERSION {
            return Err(format!(
                "apiVersion: {:?} is not supported; expected {CONFIG_API_VERSION:?}",
                self.api_version
            ));
        }
        let Some(s) = &self.sharing else {
            return Ok(());
        };
        match s.strategy {
            Strategy::TimeSlicing if s.mps_config.is_some() => {
                return Err("sharing.mpsConfig: not allowed with strategy TimeSlicing".into());
            }
            Strategy::Mps if s.time_slicing_config.is_some() => {
                return Err("sharing.timeSlicingConfig: not allowed with strategy MPS".into());
            }
            _ => {}
        }
        if let Some(m) = &s.mps_config {
            if let Some(p) = m.default_active_thread_percentage
                && !(0..=100).contains(&p)
            {
                return Err(format!(
                    "sharing.mpsConfig.defaultActiveThreadPercentage: must be from 0 to 100, got {p}"
                ));
            }
            if let Some(q) = &m.default_pinned_device_memory_limit
                && mib(q).is_none()
            {
                return Err(format!(
                    "sharing.mpsConfig.defaultPinnedDeviceMemoryLimit: must be at least 1Mi, got {q}"
                ));
            }
            for (k, q) in &m.default_per_device_pinned_memory_limit {
                if mib(q).is_none() {
                    return Err(format!(
                        "sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit.{k}: must be at \
                         least 1Mi, got {q}"
                    ));
                }
            }
        }
        Ok(())
    }
}

/// The sharing that applies to `device`: its effective configuration's. Entries of another
/// kind are errors (this driver knows only `GpuConfig`).
pub fn device_sharing(device: &AllocatedDevice) -> Result<Option<GpuSharing>, ConfigError> {
    for c in &device.config {
        match config_kind(&c.parameters) {
            Some("GpuConfig") => {}
            other => {
                return Err(ConfigError::new(
                    c.location(),
                    format!(
                        "kind: {} is not a kind this driver knows; expected \"GpuConfig\"",
                        other.map_or("(none)".to_string(), |k| format!("{k:?}"))
                    ),
                ));
            }
        }
    }
    let config: Option<GpuConfig> = effective_config(&device.config, |_| true)?;
    Ok(config.and_then(|c| c.sharing))
}

/// One allocated device as sharing sees it.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    /// The UUID CUDA knows it by (a GPU's or a MIG device's).
    pub(crate) uuid: String,
    /// A whole GPU (compute mode and time-slice apply), not a MIG device.
    pub(crate) whole_gpu: bool,
    /// Its sharing.
    pub(crate) sharing: Option<GpuSharing>,
}

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
        for sub in ["pipe", "log"] {
            kubedev_core::safefs::create_dir_all_mode(&dir.join(sub), 0o755)
                .map_err(|e| format!("creating {}: {e}", dir.join(sub).display()))?;
        }
        let running = self
            .mps(
                &dir,
                &devices,
                &[],
                "get_default_active_thread_percentage\n",
            )
            .is_ok();
        if !running {
            // The daemon leaves its starter's process group; as the subreaper of what this
            // process starts, kubedev inherits it (also when it is not PID 1 of its container)
            // and can reap it once it quits, instead of leaving a zombie.
            if let Err(e) = rustix::process::set_child_subreaper(Some(rustix::process::getpid())) {
                tracing::debug!(error = %kubedev_core::echo::Chain(&e), "cannot become the subreaper of the MPS daemons");
            }
            self.mps(&dir, &devices, &["-d"], "")
                .map_err(|e| format!("starting the MPS control daemon of claim {claim}: {e}"))?;
        }
        let mut commands = String::new();
        if let Some(p) = config.default_active_thread_percentage {
            commands.push_str(&format!("set_default_active_thread_percentage {p}\n"));
        }
        for (i, uuid) in uuids.iter().enumerate() {
            let limit = config
                .default_per_device_pinned_memory_limit
                .iter()
                .find(|(k, _)| device_key(k, &uuids).ok() == Some(i))
                .map(|(_, q)| q)
                .or(config.default_pinned_device_memory_limit.as_ref());
            if let Some(m) = limit.and_then(mib) {
                commands.push_str(&format!("set_default_device_pinned_mem_limit {uuid} {m}\n"));
            }
        }
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

/// The position among `uuids` a per-device key names: a UUID, or an index.
fn device_key(key: &str, uuids: &[String]) -> Result<usize, String> {
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use kubedev_core::{ConfigSource, DeviceConfig, DeviceName, DeviceRef, PoolName};
    use serde_json::json;

    fn device(configs: Vec<serde_json::Value>) -> AllocatedDevice {
        AllocatedDevice::new(DeviceRef {
            pool: PoolName::new("node-a-nvidia").unwrap(),
            device: DeviceName::new("gpu-0").unwrap(),
        })
        .with_config(
            configs
                .into_iter()
                .enumerate()
                .map(|(i, v)| DeviceConfig::new(ConfigSource::Claim, i, v))
                .collect(),
        )
    }

    fn gpu_config(sharing: serde_json::Value) -> serde_json::Value {
        json!({"apiVersion": CONFIG_API_VERSION, "kind": "GpuConfig", "sharing": sharing})
    }

    #[test]
    fn configurations_are_read_and_checked_field_by_field() {
        let s = device_sharing(&device(vec![
            gpu_config(json!({"strategy": "TimeSlicing"})),
            gpu_config(json!({"strategy": "MPS", "mpsConfig": {
                "defaultActiveThreadPercentage": 40, "defaultPinnedDeviceMemoryLimit": "2Gi"}})),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(s.strategy, Strategy::Mps, "the last entry applies");
        let m = s.mps_config.unwrap();
        assert_eq!(m.default_active_thread_percentage, Some(40));
        assert_eq!(
            mib(m.default_pinned_device_memory_limit.as_ref().unwrap()).unwrap(),
            "2048M"
        );

        let err = |v| device_sharing(&device(vec![v])).unwrap_err().to_string();
        assert_eq!(
            err(gpu_config(
                json!({"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 150}})
            )),
            "config[0] (from the claim): sharing.mpsConfig.defaultActiveThreadPercentage: must be from 0 to 100, got 150"
        );
        assert!(
            err(gpu_config(json!({"strategy": "Sometimes"}))).starts_with(
                "config[0] (from the claim): sharing.strategy: unknown variant `Sometimes`"
            ),
        );
        assert!(
            err(gpu_config(
                json!({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Forever"}})
            ))
            .contains("sharing.timeSlicingConfig.interval: unknown variant `Forever`"),
        );
        assert_eq!(
            err(gpu_config(
                json!({"strategy": "TimeSlicing", "mpsConfig": {}})
            )),
            "config[0] (from the claim): sharing.mpsConfig: not allowed with strategy TimeSlicing"
        );
        assert!(
            err(gpu_config(
                json!({"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "1Ki"}})
            ))
            .ends_with("must be at least 1Mi, got 1Ki")
        );
        assert!(
            err(json!({"apiVersion": "v1", "kind": "NicConfig"})).contains("kind: \"NicConfig\"")
        );
        assert!(
            err(json!({"apiVersion": "other/v1", "kind": "GpuConfig"}))
                .contains("apiVersion: \"other/v1\" is not supported")
        );
        assert!(
            err(gpu_config(json!({"strategy": "MPS", "mspConfig": {}})))
                .contains("unknown field `mspConfig`")
        );
    }

    #[test]
    fn per_device_keys_name_a_device_of_the_claim() {
        let uuids = vec!["GPU-a".to_string(), "GPU-b".to_string()];
        assert_eq!(device_key("GPU-b", &uuids), Ok(1));
        assert_eq!(device_key("0", &uuids), Ok(0));
        assert!(
            device_key("2", &uuids)
                .unwrap_err()
                .contains("out of range")
        );
        assert!(device_key("GPU-z", &uuids).unwrap_err().contains("neither"));
    }
}
