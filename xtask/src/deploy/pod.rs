//! deploy-check's pod checks: how the daemon's pod is confined, what of the host it sees, where
//! its image comes from, where it runs, and who reaches its metrics.
//!
//! - seccomp: the pod asks for the runtime's default profile (or a named one) and no container
//!   turns it off;
//! - privilege: no host network, PID or IPC namespace; privileged only when an enabled backend
//!   needs it (nvidia, vfio); otherwise no privilege escalation, every capability dropped and at
//!   most CHOWN and FOWNER (the host backend) added back; a read-only root file system;
//! - host paths: the host's `/` is mounted only for the backends that read anywhere on the host
//!   (nvidia, host) and only read-only; every host path an enabled backend reads beneath
//!   `hostRoot` (`/sys`, `/dev`, `/proc`, the host backend's device paths, the NVML library)
//!   is that host path; the host's sysfs is writable exactly where something writes to it (vfio
//!   with `bindOnPrepare` or `desiredMdevTypes`, NVML);
//! - the image names its registry, and a digest is `sha256:` and 64 hex digits;
//! - no toleration of every taint;
//! - a NetworkPolicy selects the pod, lets in no peer but named ones and only on the metrics
//!   port, and lets a scraper in when a metrics Service is rendered.
//!
//! The host paths are checked in the `host_paths` module, the NetworkPolicy in
//! `network_policy`.

mod host_paths;
mod network_policy;

use serde_json::Value;

use super::Object;
use host_paths::check_host_paths;
use network_policy::check_metrics_exposure;

/// Every pod check; `pod` is the DaemonSet's pod template (metadata and spec), `config` the
/// daemon's parsed configuration.
pub(super) fn check(objects: &[Object], config: &Value, template: &Value) -> Vec<String> {
    let pod = template.get("spec").unwrap_or(&Value::Null);
    let mut problems = check_seccomp(pod);
    problems.extend(check_privilege(config, pod));
    problems.extend(check_host_paths(config, pod));
    problems.extend(check_image(pod));
    problems.extend(check_tolerations(pod));
    problems.extend(check_metrics_exposure(objects, config, template));
    problems
}

/// The pod's containers, init containers included.
fn containers(pod: &Value) -> impl Iterator<Item = &Value> {
    ["initContainers", "containers"]
        .into_iter()
        .filter_map(|k| pod.get(k).and_then(Value::as_array))
        .flatten()
}

fn name_of(c: &Value) -> &str {
    c.get("name").and_then(Value::as_str).unwrap_or("?")
}

/// Whether the configuration enables backend `name`.
fn backend<'a>(config: &'a Value, name: &str) -> Option<&'a Value> {
    config.pointer(&format!("/backends/{name}"))
}

fn check_seccomp(pod: &Value) -> Vec<String> {
    let confined = |p: Option<&Value>| -> Option<bool> {
        let t = p?.get("type")?.as_str()?;
        Some(t == "RuntimeDefault" || t == "Localhost")
    };
    let pod_profile = confined(pod.pointer("/securityContext/seccompProfile"));
    let mut problems = Vec::new();
    if pod_profile != Some(true) {
        problems.push(
            "the pod's securityContext sets no seccompProfile RuntimeDefault (or Localhost)"
                .to_string(),
        );
    }
    for c in containers(pod) {
        match confined(c.pointer("/securityContext/seccompProfile")) {
            Some(false) => problems.push(format!(
                "container {}: its seccompProfile turns seccomp off",
                name_of(c)
            )),
            None if pod_profile != Some(true) => problems.push(format!(
                "container {}: runs without a seccomp profile",
                name_of(c)
            )),
            _ => {}
        }
    }
    problems
}

fn check_privilege(config: &Value, pod: &Value) -> Vec<String> {
    let mut problems = Vec::new();
    for ns in ["hostNetwork", "hostPID", "hostIPC"] {
        if pod.get(ns) == Some(&Value::Bool(true)) {
            problems.push(format!(
                "the pod sets {ns}: the daemon needs none of the host's"
            ));
        }
    }
    let needs_privilege = backend(config, "nvidia").is_some() || backend(config, "vfio").is_some();
    let host = backend(config, "host").is_some();
    for c in containers(pod) {
        let at = format!("container {}", name_of(c));
        let sc = c.get("securityContext").unwrap_or(&Value::Null);
        if sc.get("readOnlyRootFilesystem") != Some(&Value::Bool(true)) {
            problems.push(format!("{at}: its root file system is not read-only"));
        }
        if sc.get("privileged") == Some(&Value::Bool(true)) {
            if !needs_privilege {
                problems.push(format!(
                    "{at}: privileged, but no enabled backend needs it (only nvidia and vfio do)"
                ));
            }
            continue;
        }
        if sc.get("allowPrivilegeEscalation") != Some(&Value::Bool(false)) {
            problems.push(format!("{at}: allows privilege escalation"));
        }
        let caps = sc.get("capabilities").unwrap_or(&Value::Null);
        let list = |k: &str| -> Vec<&str> {
            caps.get(k)
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect()
        };
        if !list("drop").contains(&"ALL") {
            problems.push(format!("{at}: does not drop every capability"));
        }
        for cap in list("add") {
            let wanted = host && (cap == "CHOWN" || cap == "FOWNER");
            if !wanted {
                problems.push(format!(
                    "{at}: adds capability {cap}, which no enabled backend needs (the host \
                     backend needs CHOWN and FOWNER)"
                ));
            }
        }
    }
    problems
}

/// Whether `s` is `sha256:` and 64 lowercase hex digits.
fn is_sha256_digest(s: &str) -> bool {
    s.strip_prefix("sha256:").is_some_and(|h| {
        h.len() == 64
            && h.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

/// Problems with an image reference: it must name its registry, and a tag or a valid digest.
pub(super) fn image_problems(image: &str) -> Vec<String> {
    let mut problems = Vec::new();
    let (name, digest) = match image.split_once('@') {
        Some((n, d)) => (n, Some(d)),
        None => (image, None),
    };
    let registry = name.split_once('/').map(|(r, _)| r);
    let qualified =
        registry.is_some_and(|r| r.contains('.') || r.contains(':') || r == "localhost");
    if !qualified {
        problems.push(format!(
            "image {image:?} names no registry (Docker Hub would be implied): name it under a \
             registry path the project controls"
        ));
    }
    match digest {
        Some(d) if !is_sha256_digest(d) => problems.push(format!(
            "image {image:?}: digest {d:?} is not sha256:<64 lowercase hex digits>"
        )),
        Some(_) => {}
        None => {
            let last = name.rsplit('/').next().unwrap_or(name);
            if !last.contains(':') {
                problems.push(format!("image {image:?} has neither a tag nor a digest"));
            }
        }
    }
    problems
}

fn check_image(pod: &Value) -> Vec<String> {
    containers(pod)
        .flat_map(|c| {
            let image = c.get("image").and_then(Value::as_str).unwrap_or_default();
            image_problems(image)
                .into_iter()
                .map(|p| format!("container {}: {p}", name_of(c)))
                .collect::<Vec<_>>()
        })
        .collect()
}

fn check_tolerations(pod: &Value) -> Vec<String> {
    pod.get("tolerations")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|t| {
            t.get("operator").and_then(Value::as_str) == Some("Exists")
                && t.get("key")
                    .and_then(Value::as_str)
                    .is_none_or(str::is_empty)
        })
        .map(|t| {
            format!(
                "toleration {t} tolerates every taint{}: name the taints of the device nodes",
                match t.get("effect").and_then(Value::as_str) {
                    Some(e) => format!(" with effect {e}"),
                    None => String::new(),
                }
            )
        })
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
