//! The `nvidia-smi` stand-in: compute mode and compute time-slice per GPU, kept in a settings
//! file shared by every process.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// What is set on one GPU.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuSettings {
    /// `DEFAULT`, `PROHIBITED` or `EXCLUSIVE_PROCESS` (absent: never set, i.e. `DEFAULT`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_mode: Option<String>,
    /// The compute time-slice, 0 (default) to 3 (long) (absent: never set).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeslice: Option<u32>,
}

/// GPU UUID → settings, as stored in the settings file.
pub type Settings = BTreeMap<String, GpuSettings>;

/// Reads the settings file (missing: nothing set).
pub fn read_settings(path: &Path) -> Result<Settings, String> {
    match std::fs::read(path) {
        Ok(b) if b.is_empty() => Ok(Settings::new()),
        Ok(b) => serde_json::from_slice(&b).map_err(|e| format!("{}: {e}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Settings::new()),
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

/// Changes the settings file under an exclusive lock (concurrent tools never lose an update).
fn update(path: &Path, f: impl FnOnce(&mut Settings)) -> Result<(), String> {
    let lock_path = PathBuf::from(format!("{}.lock", path.display()));
    let lock = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(|e| format!("{}: {e}", lock_path.display()))?;
    lock.lock()
        .map_err(|e| format!("{}: {e}", lock_path.display()))?;
    let mut settings = read_settings(path)?;
    f(&mut settings);
    let tmp = PathBuf::from(format!("{}.tmp", path.display()));
    let text = serde_json::to_vec_pretty(&settings).map_err(|e| e.to_string())?;
    let mut file = File::create(&tmp).map_err(|e| format!("{}: {e}", tmp.display()))?;
    file.write_all(&text)
        .and_then(|()| file.sync_all())
        .map_err(|e| format!("{}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, path).map_err(|e| format!("{}: {e}", path.display()))
}

/// Runs `nvidia-smi` with `args`; the settings file and machine come from `settings` and
/// `machine`. Returns (exit code, output).
pub fn run(args: &[String], settings: Option<&Path>, machine: Option<&Path>) -> (i32, String) {
    match run_inner(args, settings, machine) {
        Ok(out) => (0, out),
        Err(e) => (1, e),
    }
}

fn run_inner(
    args: &[String],
    settings: Option<&Path>,
    machine: Option<&Path>,
) -> Result<String, String> {
    let settings = settings.ok_or("NVML_MOCK_SETTINGS is not set")?;
    let mut policy = false;
    let (mut uuid, mut mode, mut timeslice, mut query) = (None, None, None, false);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = |name: &str| {
            it.next()
                .cloned()
                .ok_or_else(|| format!("option {name} needs a value"))
        };
        match a.as_str() {
            "compute-policy" => policy = true,
            "-i" | "--id" => uuid = Some(value(a)?),
            "-c" | "--compute-mode" => mode = Some(value(a)?),
            "--set-timeslice" => timeslice = Some(value(a)?),
            "-q" => query = true,
            other if other.starts_with("--set-timeslice=") => {
                timeslice = Some(other["--set-timeslice=".len()..].to_string());
            }
            other => return Err(format!("Invalid combination of input arguments: {other}")),
        }
    }
    let uuid = uuid.ok_or("no GPU given (-i)")?;
    if let Some(machine) = machine {
        let m = crate::machine::Machine::load(machine).map_err(|e| e.to_string())?;
        if !m.gpus.iter().any(|g| g.uuid == uuid) {
            return Err(format!("No devices were found with ID {uuid}"));
        }
    }
    if query {
        let s = read_settings(settings)?.remove(&uuid).unwrap_or_default();
        return Ok(format!(
            "Compute Mode : {}\nTimeslice : {}\n",
            s.compute_mode.as_deref().unwrap_or("Default"),
            s.timeslice.unwrap_or(0)
        ));
    }
    match (policy, mode, timeslice) {
        (true, None, Some(t)) => {
            let n: u32 = t
                .parse()
                .ok()
                .filter(|n| *n <= 3)
                .ok_or_else(|| format!("Invalid timeslice value {t:?}: expected 0 to 3"))?;
            update(settings, |s| {
                s.entry(uuid.clone()).or_default().timeslice = Some(n);
            })?;
            Ok(format!("Set timeslice to {n} for GPU {uuid}\n"))
        }
        (false, Some(m), None) => {
            let m = m.to_ascii_uppercase();
            let m = match m.as_str() {
                "0" | "DEFAULT" => "DEFAULT",
                "2" | "PROHIBITED" => "PROHIBITED",
                "3" | "EXCLUSIVE_PROCESS" => "EXCLUSIVE_PROCESS",
                _ => return Err(format!("Invalid compute mode {m:?}")),
            };
            update(settings, |s| {
                s.entry(uuid.clone()).or_default().compute_mode = Some(m.to_string());
            })?;
            Ok(format!("Set compute mode to {m} for GPU {uuid}.\n"))
        }
        _ => Err("Invalid combination of input arguments".into()),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn settings_are_kept_per_gpu_and_bad_input_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("settings.json");
        let machine = crate::machine_path("dgx-a100");
        let m = crate::machine::Machine::load(&machine).unwrap();
        let uuid = &m.gpus[1].uuid;
        let run = |a: &str| run(&args(a), Some(&file), Some(&machine));
        assert_eq!(run(&format!("-i {uuid} -c EXCLUSIVE_PROCESS")).0, 0);
        assert_eq!(
            run(&format!("compute-policy -i {uuid} --set-timeslice=2")).0,
            0
        );
        let s = read_settings(&file).unwrap();
        assert_eq!(
            s[uuid],
            GpuSettings {
                compute_mode: Some("EXCLUSIVE_PROCESS".into()),
                timeslice: Some(2)
            }
        );
        assert_eq!(s.len(), 1, "other GPUs untouched");
        let (code, out) = run("-i GPU-nope -c DEFAULT");
        assert_eq!(code, 1);
        assert!(out.contains("No devices were found"), "{out}");
        let (code, out) = run(&format!("compute-policy -i {uuid} --set-timeslice 9"));
        assert_eq!(code, 1, "{out}");
    }
}
