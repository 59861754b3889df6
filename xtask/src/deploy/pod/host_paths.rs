//! The host paths the daemon's pod sees: the host's `/` mounted only for the backends that read
//! anywhere on the host (nvidia, host) and only read-only; every host path an enabled backend
//! reads beneath `hostRoot` (`/sys`, `/dev`, `/proc`, the host backend's device paths, the NVML
//! library) is that host path; the host's sysfs writable exactly where something writes to it
//! (vfio with `bindOnPrepare` or `desiredMdevTypes`, NVML).

use serde_json::Value;

use super::{backend, containers};

/// Whether the vfio backend writes to sysfs: rebinding drivers or managing mdev types.
fn vfio_writes(config: &Value) -> bool {
    backend(config, "vfio").is_some_and(|v| {
        v.get("bindOnPrepare") == Some(&Value::Bool(true))
            || v.get("desiredMdevTypes")
                .and_then(Value::as_array)
                .is_some_and(|d| !d.is_empty())
    })
}

/// What `path` inside the daemon container shows of the host: through the deepest volume
/// mount holding it, when that is a hostPath volume, the host path and whether the mount is
/// writable.
pub(super) fn host_path_of(pod: &Value, path: &str) -> Option<(String, bool)> {
    let container = pod.pointer("/containers/0")?;
    let mount = container
        .get("volumeMounts")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|m| {
            let at = m.get("mountPath")?.as_str()?.trim_end_matches('/');
            let rest = if at.is_empty() {
                Some(path)
            } else if path == at {
                Some("")
            } else {
                path.strip_prefix(at).filter(|r| r.starts_with('/'))
            }?;
            Some((at.len(), m, rest))
        })
        .max_by_key(|(len, _, _)| *len);
    let (_, mount, rest) = mount?;
    let name = mount.get("name")?.as_str()?;
    let volume = pod
        .get("volumes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .find(|v| v.get("name").and_then(Value::as_str) == Some(name))?;
    let mut host = volume
        .pointer("/hostPath/path")?
        .as_str()?
        .trim_end_matches('/')
        .to_string();
    if let Some(sub) = mount.get("subPath").and_then(Value::as_str) {
        host = format!("{host}/{}", sub.trim_matches('/'));
    }
    host.push_str(rest);
    if host.is_empty() {
        host.push('/');
    }
    let writable = mount.get("readOnly") != Some(&Value::Bool(true));
    Some((host, writable))
}

/// `path` (absolute, on the host) as the daemon sees it beneath `root`.
fn beneath(root: &str, path: &str) -> String {
    format!("{}{path}", root.trim_end_matches('/'))
}

/// The host paths the pod sees against what the enabled backends read and write; see the
/// module docs.
pub(super) fn check_host_paths(config: &Value, pod: &Value) -> Vec<String> {
    let mut problems = check_whole_root(config, pod);
    problems.extend(check_backend_paths(config, pod));
    problems.extend(check_sysfs(config, pod));
    problems
}

/// The host's `/`: mounted only for the backends that read anywhere on the host, and only
/// read-only.
fn check_whole_root(config: &Value, pod: &Value) -> Vec<String> {
    let mut problems = Vec::new();
    let whole_host = backend(config, "nvidia").is_some() || backend(config, "host").is_some();
    let volumes: Vec<&Value> = pod
        .get("volumes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .collect();
    let mounts: Vec<&Value> = containers(pod)
        .flat_map(|c| c.get("volumeMounts").and_then(Value::as_array))
        .flatten()
        .collect();
    for v in &volumes {
        let Some(path) = v.pointer("/hostPath/path").and_then(Value::as_str) else {
            continue;
        };
        if !path.trim_end_matches('/').is_empty() {
            continue;
        }
        let name = v.get("name").and_then(Value::as_str).unwrap_or_default();
        if !whole_host {
            problems.push(format!(
                "volume {name} is the host's whole root, but no enabled backend reads beyond the \
                 host's /sys and /dev (only nvidia and host do)"
            ));
        }
        for m in mounts
            .iter()
            .filter(|m| m.get("name").and_then(Value::as_str) == Some(name))
        {
            if m.get("readOnly") != Some(&Value::Bool(true)) {
                problems.push(format!(
                    "volume {name} mounts the host's whole root writable at {}",
                    m.get("mountPath").and_then(Value::as_str).unwrap_or("?")
                ));
            }
        }
    }
    problems
}

/// The host paths each enabled backend reads beneath `hostRoot`, with the backend's name.
fn backend_host_paths(config: &Value) -> Vec<(&'static str, String)> {
    let mut wanted: Vec<(&str, String)> = Vec::new();
    for (name, paths) in [
        ("vfio", &["/sys", "/dev"][..]),
        ("usb", &["/sys", "/dev"][..]),
        ("host", &["/sys", "/dev"][..]),
        ("nvidia", &["/sys", "/dev", "/proc"][..]),
    ] {
        let Some(section) = backend(config, name) else {
            continue;
        };
        wanted.extend(paths.iter().map(|p| (name, (*p).to_string())));
        if name == "host" {
            for list in ["characterDevices", "socketDevices"] {
                for d in section
                    .get(list)
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    if let Some(p) = d.get("path").and_then(Value::as_str) {
                        wanted.push((name, p.to_string()));
                    }
                }
            }
        }
    }
    wanted
}

/// Every host path an enabled backend reads beneath hostRoot must be that path on the host,
/// and the NVML library must lie beneath a hostPath volume.
fn check_backend_paths(config: &Value, pod: &Value) -> Vec<String> {
    let mut problems = Vec::new();
    let root = host_root(config);
    for (name, path) in &backend_host_paths(config) {
        let inside = beneath(root, path);
        match host_path_of(pod, &inside) {
            Some((host, _)) if &host == path => {}
            found => problems.push(format!(
                "the {name} backend reads the host's {path} at {inside} (hostRoot {root}), but \
                 that is {}",
                match found {
                    Some((host, _)) => format!("the host's {host}"),
                    None => "no hostPath volume".into(),
                }
            )),
        }
    }
    if let Some(lib) = backend(config, "nvidia")
        .and_then(|n| n.get("libraryPath"))
        .and_then(Value::as_str)
        && host_path_of(pod, lib).is_none()
    {
        problems.push(format!(
            "nvidia.libraryPath {lib} lies beneath no hostPath volume"
        ));
    }
    problems
}

/// The host's sysfs: writable exactly where something writes to it.
fn check_sysfs(config: &Value, pod: &Value) -> Vec<String> {
    let mut problems = Vec::new();
    let root = host_root(config);
    let must_write = vfio_writes(config);
    let may_write = must_write || backend(config, "nvidia").is_some();
    let mut sys_views = vec!["/sys".to_string()];
    if root != "/" {
        sys_views.push(beneath(root, "/sys"));
    }
    for inside in sys_views {
        let Some((host, writable)) = host_path_of(pod, &inside) else {
            continue;
        };
        if host != "/sys" {
            continue;
        }
        if writable && !may_write {
            problems.push(format!(
                "the host's /sys is writable at {inside}, but nothing writes to it (vfio does only \
                 with bindOnPrepare or desiredMdevTypes)"
            ));
        }
        if !writable && must_write && inside == beneath(root, "/sys") {
            problems.push(format!(
                "vfio writes to the host's sysfs (bindOnPrepare or desiredMdevTypes), but \
                 {inside} is mounted read-only"
            ));
        }
    }
    problems
}

/// The configuration's `hostRoot` (`/` when unset).
fn host_root(config: &Value) -> &str {
    config
        .get("hostRoot")
        .and_then(Value::as_str)
        .unwrap_or("/")
}
