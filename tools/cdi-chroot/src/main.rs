//! `cdi-chroot SPEC DEVICE ROOTFS [--env K=V]... -- COMMAND...`
//!
//! Applies the spec-level and device-level `containerEdits` of one device of a CDI spec to the
//! root directory `ROOTFS` and runs `COMMAND` chrooted in it, as a container runtime would:
//! `/proc`, `/sys` and a minimal `/dev` are mounted, each device node of the spec is bound at
//! its container path from its host path, each mount is bound (read-only where its options say
//! `ro`), and the command gets the image environment given with `--env` overlaid with the
//! spec's. Hooks are not run: a spec with hooks is refused.
//!
//! Run it in a private mount namespace (`unshare --mount --propagation private`), as root; the
//! mounts vanish with the namespace. Every step is printed, so a failure says what was missing.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use serde_json::Value;

fn fail(msg: impl std::fmt::Display) -> ExitCode {
    eprintln!("cdi-chroot: {msg}");
    ExitCode::from(125)
}

fn sh(cmd: &mut Command) -> Result<(), String> {
    let status = cmd.status().map_err(|e| format!("{cmd:?}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{cmd:?} failed: {status}"))
    }
}

/// The path `p` (absolute, inside the container) under `root`.
fn inside(root: &Path, p: &str) -> PathBuf {
    root.join(p.trim_start_matches('/'))
}

/// Creates the mount point `target` like the host object `source` (a directory or a file).
fn mount_point(source: &Path, target: &Path) -> Result<(), String> {
    let is_dir = std::fs::metadata(source)
        .map_err(|e| format!("host path {}: {e}", source.display()))?
        .is_dir();
    if is_dir {
        std::fs::create_dir_all(target).map_err(|e| format!("{}: {e}", target.display()))?;
    } else {
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
        }
        if std::fs::symlink_metadata(target).is_err() {
            std::fs::write(target, b"").map_err(|e| format!("{}: {e}", target.display()))?;
        }
    }
    Ok(())
}

fn bind(source: &Path, target: &Path, read_only: bool) -> Result<(), String> {
    mount_point(source, target)?;
    sh(Command::new("mount").arg("--rbind").arg(source).arg(target))?;
    if read_only {
        sh(Command::new("mount")
            .args(["-o", "remount,bind,ro"])
            .arg(target))?;
    }
    Ok(())
}

fn strings(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

fn run() -> Result<i32, String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let sep = args
        .iter()
        .position(|a| a == "--")
        .ok_or("usage: cdi-chroot SPEC DEVICE ROOTFS [--env K=V]... -- COMMAND...")?;
    let (head, command) = (&args[..sep], &args[sep + 1..]);
    if head.len() < 3 || command.is_empty() {
        return Err("usage: cdi-chroot SPEC DEVICE ROOTFS [--env K=V]... -- COMMAND...".into());
    }
    let (spec_path, device, root) = (&head[0], &head[1], PathBuf::from(&head[2]));
    let mut image_env: Vec<String> = Vec::new();
    let mut rest = head[3..].iter();
    while let Some(a) = rest.next() {
        match (a.as_str(), rest.next()) {
            ("--env", Some(kv)) => image_env.push(kv.clone()),
            _ => return Err(format!("unexpected argument {a:?}")),
        }
    }
    let text = std::fs::read_to_string(spec_path).map_err(|e| format!("{spec_path}: {e}"))?;
    let spec: Value = serde_json::from_str(&text).map_err(|e| format!("{spec_path}: {e}"))?;
    let dev = spec["devices"]
        .as_array()
        .and_then(|d| d.iter().find(|x| x["name"] == device.as_str()))
        .ok_or_else(|| format!("{spec_path} has no device {device:?}"))?;
    let edits = [&spec["containerEdits"], &dev["containerEdits"]];

    for e in edits {
        if e["hooks"].as_array().is_some_and(|h| !h.is_empty()) {
            return Err("the spec has hooks; cdi-chroot does not run hooks".into());
        }
    }
    // What every runtime gives a container.
    std::fs::create_dir_all(inside(&root, "/proc")).map_err(|e| e.to_string())?;
    sh(Command::new("mount")
        .args(["-t", "proc", "proc"])
        .arg(inside(&root, "/proc")))?;
    std::fs::create_dir_all(inside(&root, "/sys")).map_err(|e| e.to_string())?;
    sh(Command::new("mount")
        .args(["-t", "sysfs", "-o", "ro", "sysfs"])
        .arg(inside(&root, "/sys")))?;
    std::fs::create_dir_all(inside(&root, "/dev")).map_err(|e| e.to_string())?;
    sh(Command::new("mount")
        .args(["-t", "tmpfs", "-o", "mode=755", "tmpfs"])
        .arg(inside(&root, "/dev")))?;
    for d in [
        "/dev/null",
        "/dev/zero",
        "/dev/full",
        "/dev/random",
        "/dev/urandom",
        "/dev/tty",
    ] {
        bind(Path::new(d), &inside(&root, d), false)?;
    }
    std::fs::create_dir_all(inside(&root, "/tmp")).map_err(|e| e.to_string())?;

    let mut env = image_env;
    for e in edits {
        for n in e["deviceNodes"].as_array().into_iter().flatten() {
            let path = n["path"].as_str().ok_or("a device node without a path")?;
            let host = n["hostPath"].as_str().unwrap_or(path);
            println!("cdi-chroot: device node {path} (host {host})");
            bind(Path::new(host), &inside(&root, path), false)?;
        }
        for m in e["mounts"].as_array().into_iter().flatten() {
            let host = m["hostPath"].as_str().ok_or("a mount without hostPath")?;
            let target = m["containerPath"]
                .as_str()
                .ok_or("a mount without containerPath")?;
            let ro = strings(m.get("options")).iter().any(|o| o == "ro");
            println!(
                "cdi-chroot: mount {host} -> {target}{}",
                if ro { " (ro)" } else { "" }
            );
            bind(Path::new(host), &inside(&root, target), ro)?;
        }
        for kv in strings(e.get("env")) {
            println!("cdi-chroot: env {kv}");
            let key = kv.split('=').next().unwrap_or_default().to_owned();
            env.retain(|x| x.split('=').next() != Some(key.as_str()));
            env.push(kv);
        }
    }
    let mut cmd = Command::new("chroot");
    cmd.arg(&root).args(command).env_clear();
    for kv in &env {
        if let Some((k, v)) = kv.split_once('=') {
            cmd.env(k, v);
        }
    }
    let status = cmd.status().map_err(|e| format!("chroot: {e}"))?;
    Ok(status.code().unwrap_or(128))
}

fn main() -> ExitCode {
    match run() {
        Ok(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        Err(e) => fail(e),
    }
}
