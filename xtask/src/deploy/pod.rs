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

use serde_json::Value;

use super::{NAMESPACE, Object};

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

/// Whether the vfio backend writes to sysfs: rebinding drivers or managing mdev types.
fn vfio_writes(config: &Value) -> bool {
    backend(config, "vfio").is_some_and(|v| {
        v.get("bindOnPrepare") == Some(&Value::Bool(true))
            || v.get("desiredMdevTypes")
                .and_then(Value::as_array)
                .is_some_and(|d| !d.is_empty())
    })
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

fn check_host_paths(config: &Value, pod: &Value) -> Vec<String> {
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

    // Every host path an enabled backend reads beneath hostRoot must be that path on the host.
    let root = config
        .get("hostRoot")
        .and_then(Value::as_str)
        .unwrap_or("/");
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
    for (name, path) in &wanted {
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

    // The host's sysfs: writable exactly where something writes to it.
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

fn check_metrics_exposure(objects: &[Object], config: &Value, template: &Value) -> Vec<String> {
    let mut problems = Vec::new();
    if config.pointer("/metrics/address").is_none() {
        return problems;
    }
    let labels = template
        .pointer("/metadata/labels")
        .and_then(Value::as_object);
    let container = template.pointer("/spec/containers/0");
    let port_number = config
        .pointer("/metrics/address")
        .and_then(Value::as_str)
        .and_then(|a| a.rsplit_once(':'))
        .and_then(|(_, p)| p.parse::<u64>().ok());
    let port_name: Option<&str> = container
        .and_then(|c| c.get("ports"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .find(|p| p.get("containerPort").and_then(Value::as_u64) == port_number)
        .and_then(|p| p.get("name"))
        .and_then(Value::as_str);
    let selects_pod = |np: &Object| {
        let sel = np.value.pointer("/spec/podSelector");
        let exprs = sel
            .and_then(|s| s.get("matchExpressions"))
            .and_then(Value::as_array)
            .is_some_and(|e| !e.is_empty());
        let wanted = sel
            .and_then(|s| s.get("matchLabels"))
            .and_then(Value::as_object);
        let ns = np
            .value
            .pointer("/metadata/namespace")
            .and_then(Value::as_str);
        ns == Some(NAMESPACE)
            && !exprs
            && wanted
                .into_iter()
                .flatten()
                .all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v))
    };
    let policies: Vec<&Object> = objects
        .iter()
        .filter(|o| o.kind == "NetworkPolicy" && selects_pod(o))
        .filter(|o| {
            let types: Vec<&str> = o
                .value
                .pointer("/spec/policyTypes")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            types.contains(&"Ingress") || types.is_empty()
        })
        .collect();
    if policies.is_empty() {
        problems.push(
            "no NetworkPolicy restricts ingress to the daemon's pods: every pod in the cluster \
             can reach /metrics (metrics.networkPolicy)"
                .to_string(),
        );
    }
    let mut admits_someone = false;
    for np in &policies {
        let at = format!("{}: {}", np.source, np.id);
        for (i, rule) in np
            .value
            .pointer("/spec/ingress")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .enumerate()
        {
            let from: Vec<&Value> = rule
                .get("from")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .collect();
            if from.is_empty() {
                problems.push(format!(
                    "{at}: ingress[{i}] names no peer, so it lets every pod in"
                ));
            }
            for peer in &from {
                // Every namespace's every pod, or every address.
                let all_pods = peer.get("podSelector").is_none()
                    && peer
                        .get("namespaceSelector")
                        .is_some_and(|s| !narrows_selector(s));
                let all_addresses = peer
                    .pointer("/ipBlock/cidr")
                    .and_then(Value::as_str)
                    .is_some_and(|c| c.ends_with("/0"));
                let everyone = all_pods || all_addresses;
                if everyone {
                    problems.push(format!(
                        "{at}: ingress[{i}] peer {peer} takes in every pod or address"
                    ));
                }
            }
            let ports: Vec<&Value> = rule
                .get("ports")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .collect();
            if ports.is_empty() {
                problems.push(format!(
                    "{at}: ingress[{i}] opens every port; open only the metrics port"
                ));
            }
            for p in ports {
                let ok = match p.get("port") {
                    Some(Value::Number(n)) => n.as_u64() == port_number,
                    Some(Value::String(s)) => Some(s.as_str()) == port_name,
                    _ => false,
                } && p.get("endPort").is_none();
                if !ok {
                    problems.push(format!(
                        "{at}: ingress[{i}] opens {p}, which is not the metrics port {}",
                        port_number.map(|n| n.to_string()).unwrap_or_default()
                    ));
                }
            }
            admits_someone |= !from.is_empty();
        }
    }
    if let Some(s) = objects.iter().find(|o| o.kind == "Service")
        && !policies.is_empty()
        && !admits_someone
    {
        problems.push(format!(
            "{}: {}: a metrics Service is rendered for scraping, but the NetworkPolicy lets no \
             scraper in (metrics.networkPolicy.from)",
            s.source, s.id
        ));
    }
    problems
}

/// Whether a label selector selects less than everything.
fn narrows_selector(s: &Value) -> bool {
    s.get("matchLabels")
        .and_then(Value::as_object)
        .is_some_and(|m| !m.is_empty())
        || s.get("matchExpressions")
            .and_then(Value::as_array)
            .is_some_and(|m| !m.is_empty())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn image_references_name_a_registry_and_a_valid_digest() {
        let digest = format!("sha256:{}", "0a".repeat(32));
        for good in [
            "ghcr.io/kubedev/kubedev:0.1.0".to_string(),
            format!("ghcr.io/kubedev/kubedev@{digest}"),
            "localhost:5000/kubedev:dev".to_string(),
            "localhost/kubedev:dev".to_string(),
        ] {
            assert_eq!(image_problems(&good), Vec::<String>::new(), "{good}");
        }
        for bad in [
            "kubedev/kubedev:0.1.0".to_string(),
            "kubedev:0.1.0".to_string(),
            "ghcr.io/kubedev/kubedev".to_string(),
            "ghcr.io/kubedev/kubedev@sha256:abc".to_string(),
            format!("ghcr.io/kubedev/kubedev@{}", digest.to_uppercase()),
        ] {
            assert_eq!(image_problems(&bad).len(), 1, "{bad}");
        }
    }

    #[test]
    fn host_paths_are_followed_through_the_deepest_mount() {
        let pod = json!({
            "containers": [{"volumeMounts": [
                {"name": "root", "mountPath": "/host", "readOnly": true},
                {"name": "sys", "mountPath": "/host/sys"},
                {"name": "tmp", "mountPath": "/tmp"},
            ]}],
            "volumes": [
                {"name": "root", "hostPath": {"path": "/"}},
                {"name": "sys", "hostPath": {"path": "/sys/"}},
                {"name": "tmp", "emptyDir": {}},
            ],
        });
        assert_eq!(
            host_path_of(&pod, "/host/sys/bus/pci"),
            Some(("/sys/bus/pci".into(), true))
        );
        assert_eq!(
            host_path_of(&pod, "/host/dev"),
            Some(("/dev".into(), false))
        );
        assert_eq!(host_path_of(&pod, "/host"), Some(("/".into(), false)));
        assert_eq!(host_path_of(&pod, "/hostile"), None);
        assert_eq!(host_path_of(&pod, "/tmp/x"), None);
    }
}
