//! The daemon container against its configuration: the configuration as `kubedev check-config`
//! judges it, every path it names beneath a volume the container mounts, the downward-API
//! environment and the probes, and the `--config` file a mounted key of the ConfigMap.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use anyhow::{Context as _, bail};
use serde_json::Value;

/// Runs `kubedev check-config` on `file`, as the daemon in the DaemonSet would see it.
pub(super) fn check_config(kubedev: &Path, file: &Path) -> anyhow::Result<()> {
    let out = Command::new(kubedev)
        .args(["check-config", "--config"])
        .arg(file)
        // What the downward API gives the daemon in the DaemonSet.
        .env("NODE_NAME", "deploy-check-node")
        .env("POD_UID", "0b6e4f8e-5a8c-4c2e-9a55-3f1d2c7e9b10")
        .output()
        .with_context(|| format!("running {}", kubedev.display()))?;
    if out.status.success() {
        Ok(())
    } else {
        bail!(
            "kubedev check-config rejects it: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )
    }
}

/// The daemon container's environment and probes against the configuration: `NODE_NAME` and
/// `POD_UID` from the downward API, liveness on `/healthz` and readiness on `/readyz` at the
/// port of `metrics.address`; returns the problems.
pub(super) fn check_container(config: &Value, pod: &Value) -> Vec<String> {
    let mut problems = Vec::new();
    let Some(container) = pod.pointer("/containers/0") else {
        return vec!["has no container".into()];
    };
    for (name, field) in [("NODE_NAME", "spec.nodeName"), ("POD_UID", "metadata.uid")] {
        let from = container
            .get("env")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .find(|e| e.get("name").and_then(Value::as_str) == Some(name))
            .and_then(|e| e.pointer("/valueFrom/fieldRef/fieldPath"))
            .and_then(Value::as_str);
        if from != Some(field) {
            problems.push(format!(
                "env {name} must come from the downward API's {field}, not {from:?}"
            ));
        }
    }
    let port = config
        .pointer("/metrics/address")
        .and_then(Value::as_str)
        .and_then(|a| a.rsplit_once(':'))
        .and_then(|(_, p)| p.parse::<u64>().ok());
    let Some(port) = port else {
        problems
            .push("config.yaml's metrics.address has no port, so the probes cannot work".into());
        return problems;
    };
    let named_port = |name: &str| {
        container
            .get("ports")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .find(|p| p.get("name").and_then(Value::as_str) == Some(name))
            .and_then(|p| p.get("containerPort"))
            .and_then(Value::as_u64)
    };
    for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
        let get = container.get(probe).and_then(|p| p.get("httpGet"));
        let at = get.and_then(|g| g.get("path")).and_then(Value::as_str);
        let probe_port = match get.and_then(|g| g.get("port")) {
            Some(Value::Number(n)) => n.as_u64(),
            Some(Value::String(name)) => named_port(name),
            _ => None,
        };
        if at != Some(path) || probe_port != Some(port) {
            problems.push(format!(
                "{probe} must GET {path} on port {port} (metrics.address), not {at:?} on \
                 {probe_port:?}"
            ));
        }
    }
    problems
}

/// The file the daemon container's `--config` names must be a key of the rendered ConfigMap
/// `cm_name` (whose `data` is `cm_data`), mounted into the container from a volume of that
/// ConfigMap; returns the problems.
pub(super) fn check_config_file(
    pod: &Value,
    cm_name: &str,
    cm_data: Option<&Value>,
) -> Vec<String> {
    let Some(container) = pod.pointer("/containers/0") else {
        return vec!["has no container".into()];
    };
    let Some(path) = config_flag(container) else {
        return vec!["the daemon container passes no --config to kubedev".into()];
    };
    let volumes = config_map_volumes(pod, cm_name);
    let key = mounted_key(container, &volumes, path);
    let keys: Vec<&str> = cm_data
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .map(|(k, _)| k.as_str())
        .collect();
    match key {
        None => vec![format!(
            "--config {path} lies beneath no volume mount of ConfigMap {cm_name:?}"
        )],
        Some(None) => vec![format!(
            "--config {path} is mounted from ConfigMap {cm_name:?}, but its volume's items \
             project no key to that file"
        )],
        Some(Some(k)) if !keys.contains(&k) => vec![format!(
            "--config {path} is key {k:?} of ConfigMap {cm_name:?}, which holds only {keys:?}"
        )],
        Some(Some(_)) => Vec::new(),
    }
}

/// The file the container's command and arguments pass as `--config` (or `--config=`).
fn config_flag(container: &Value) -> Option<&str> {
    let argv: Vec<&str> = ["command", "args"]
        .iter()
        .filter_map(|k| container.get(*k).and_then(Value::as_array))
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    argv.iter().enumerate().find_map(|(i, a)| {
        if *a == "--config" {
            argv.get(i + 1).copied()
        } else {
            a.strip_prefix("--config=")
        }
    })
}

/// The pod's volumes of ConfigMap `cm_name`, by volume name, with their key-to-path items
/// when they list them.
fn config_map_volumes<'a>(
    pod: &'a Value,
    cm_name: &str,
) -> BTreeMap<&'a str, Vec<(&'a str, &'a str)>> {
    pod.get("volumes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|v| v.pointer("/configMap/name").and_then(Value::as_str) == Some(cm_name))
        .filter_map(|v| {
            let items = v
                .pointer("/configMap/items")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|i| {
                    Some((
                        i.get("key").and_then(Value::as_str)?,
                        i.get("path").and_then(Value::as_str)?,
                    ))
                })
                .collect();
            Some((v.get("name").and_then(Value::as_str)?, items))
        })
        .collect()
}

/// The ConfigMap key that file `path` is, through the last of the container's mounts of
/// `volumes` that holds it: `None` when no such mount holds it, `Some(None)` when one does but
/// its volume's items project no key to that file.
fn mounted_key<'a>(
    container: &'a Value,
    volumes: &BTreeMap<&str, Vec<(&'a str, &'a str)>>,
    path: &'a str,
) -> Option<Option<&'a str>> {
    let mut key = None;
    for m in container
        .get("volumeMounts")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let name = m.get("name").and_then(Value::as_str).unwrap_or_default();
        let Some(items) = volumes.get(name) else {
            continue;
        };
        let mount = m
            .get("mountPath")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .trim_end_matches('/');
        let relative = match m.get("subPath").and_then(Value::as_str) {
            Some(sub) if path == mount => Some(sub),
            Some(_) => None,
            None => path
                .strip_prefix(mount)
                .and_then(|r| r.strip_prefix('/'))
                .filter(|r| !r.is_empty()),
        };
        let Some(relative) = relative else {
            continue;
        };
        key = Some(if items.is_empty() {
            Some(relative)
        } else {
            items.iter().find(|(_, p)| *p == relative).map(|(k, _)| *k)
        });
    }
    key
}

/// The paths the configuration names that the daemon reads or writes, each of which must lie
/// beneath a volume the container mounts; returns the problems.
pub(super) fn check_mounts(config: &Value, pod: &Value) -> Vec<String> {
    let mut problems_early = Vec::new();
    let mounts: Vec<&str> = pod
        .get("containers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .flat_map(|c| c.get("volumeMounts").and_then(Value::as_array))
        .flatten()
        .filter_map(|m| m.get("mountPath").and_then(Value::as_str))
        .collect();
    let mut wanted = vec!["/stateDir"];
    // Pod labels on device metrics come from the kubelet's pod resources socket: mounted when
    // the configuration names it, out of reach (so the labels are off) when it does not.
    match config.pointer("/metrics/podResourcesSocket") {
        Some(_) => wanted.push("/metrics/podResourcesSocket"),
        None => {
            let socket = kubedev_kubelet_grpc::pod_resources::DEFAULT_SOCKET;
            if let Some(m) = mounts.iter().find(|m| {
                let m = m.trim_end_matches('/');
                socket.starts_with(&format!("{m}/"))
            }) {
                problems_early.push(format!(
                    "config.yaml names no metrics.podResourcesSocket (device metrics without pod \
                     labels), yet the daemon's default {socket} is reachable through the mount at \
                     {m}"
                ));
            }
        }
    }
    if config.pointer("/devicePlugin/enabled") != Some(&Value::Bool(false)) {
        wanted.extend(["/devicePlugin/directory"]);
        if config.pointer("/devicePlugin/cdi") == Some(&Value::Bool(true)) {
            wanted.push("/devicePlugin/cdiDir");
        }
    }
    if config.pointer("/dra/enabled") == Some(&Value::Bool(true)) {
        wanted.extend(["/dra/registryDir", "/dra/pluginDir", "/dra/cdiDir"]);
    }
    let host_root = config.get("hostRoot").and_then(Value::as_str);
    if host_root.is_some_and(|r| r != "/") {
        wanted.push("/hostRoot");
    }
    let mut problems = problems_early;
    for field in wanted {
        let Some(path) = config.pointer(field).and_then(Value::as_str) else {
            problems.push(format!(
                "config.yaml sets no {}",
                field.trim_start_matches('/').replace('/', ".")
            ));
            continue;
        };
        let inside = mounts.iter().any(|m| {
            let m = m.trim_end_matches('/');
            path == m || path.starts_with(&format!("{m}/"))
        });
        if !inside {
            problems.push(format!(
                "config.yaml's {} {path:?} is beneath no volume mount of the container",
                field.trim_start_matches('/').replace('/', ".")
            ));
        }
    }
    problems
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::super::tests::assert_found;
    use super::*;
    use serde_json::json;

    #[test]
    fn probes_and_downward_env_are_checked() {
        let config = serde_json::json!({"metrics": {"address": "0.0.0.0:9464"}});
        let good = serde_json::json!({"containers": [{
            "env": [
                {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                {"name": "POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
            ],
            "ports": [{"name": "metrics", "containerPort": 9464}],
            "livenessProbe": {"httpGet": {"path": "/healthz", "port": "metrics"}},
            "readinessProbe": {"httpGet": {"path": "/readyz", "port": 9464}},
        }]});
        assert_eq!(check_container(&config, &good), Vec::<String>::new());
        let mut bad = good.clone();
        bad["containers"][0]["env"][1]["valueFrom"]["fieldRef"]["fieldPath"] =
            "metadata.name".into();
        bad["containers"][0]["readinessProbe"]["httpGet"]["port"] = 8080.into();
        let problems = check_container(&config, &bad);
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems[0].contains("POD_UID"), "{problems:?}");
        assert!(problems[1].contains("readinessProbe"), "{problems:?}");
    }

    #[test]
    fn the_config_file_must_be_a_mounted_configmap_key() {
        let data = serde_json::json!({"config.yaml": "x: 1"});
        let pod = |mount: Value, items: Value| {
            serde_json::json!({
                "containers": [{
                    "command": ["kubedev"],
                    "args": ["run", "--config", "/etc/kubedev/config.yaml"],
                    "volumeMounts": [{"name": "tmp", "mountPath": "/etc"}, mount],
                }],
                "volumes": [
                    {"name": "tmp", "emptyDir": {}},
                    {"name": "config", "configMap": {"name": "kubedev", "items": items}},
                ],
            })
        };
        let dir = serde_json::json!({"name": "config", "mountPath": "/etc/kubedev"});
        let none = Value::Null;
        assert_eq!(
            check_config_file(&pod(dir.clone(), none.clone()), "kubedev", Some(&data)),
            Vec::<String>::new()
        );
        // Mounted elsewhere: /etc is only an emptyDir.
        let elsewhere = serde_json::json!({"name": "config", "mountPath": "/config"});
        let p = check_config_file(&pod(elsewhere, none.clone()), "kubedev", Some(&data));
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(p[0].contains("beneath no volume mount"), "{p:?}");
        // Another ConfigMap's volume.
        let p = check_config_file(&pod(dir.clone(), none.clone()), "other", Some(&data));
        assert!(p[0].contains("beneath no volume mount"), "{p:?}");
        // The key is not in the ConfigMap.
        let other = serde_json::json!({"kubedev.yaml": "x: 1"});
        let p = check_config_file(&pod(dir.clone(), none.clone()), "kubedev", Some(&other));
        assert!(p[0].contains("holds only [\"kubedev.yaml\"]"), "{p:?}");
        // Items project keys to other file names; a subPath mounts one file.
        let items = serde_json::json!([{"key": "kubedev.yaml", "path": "config.yaml"}]);
        assert_eq!(
            check_config_file(&pod(dir.clone(), items), "kubedev", Some(&other)),
            Vec::<String>::new()
        );
        let items = serde_json::json!([{"key": "config.yaml", "path": "other.yaml"}]);
        let p = check_config_file(&pod(dir, items), "kubedev", Some(&data));
        assert!(p[0].contains("project no key"), "{p:?}");
        let sub = serde_json::json!({
            "name": "config", "mountPath": "/etc/kubedev/config.yaml", "subPath": "config.yaml",
        });
        assert_eq!(
            check_config_file(&pod(sub, none), "kubedev", Some(&data)),
            Vec::<String>::new()
        );
        let no_flag = serde_json::json!({"containers": [{"args": ["run"]}]});
        let p = check_config_file(&no_flag, "kubedev", Some(&data));
        assert!(p[0].contains("no --config"), "{p:?}");
    }

    #[test]
    fn pod_labels_on_metrics_follow_the_socket() {
        let config = serde_json::json!({
            "stateDir": "/var/lib/kubedev",
            "devicePlugin": {"enabled": false},
        });
        let pod = |mount: &str| {
            serde_json::json!({"containers": [{"volumeMounts": [
                {"mountPath": "/var/lib/kubedev"}, {"mountPath": mount},
            ]}]})
        };
        // No socket named and none mounted: no pod labels, nothing wrong.
        assert_eq!(check_mounts(&config, &pod("/tmp")), Vec::<String>::new());
        // No socket named, but the default one is mounted anyway.
        let p = check_mounts(&config, &pod("/var/lib/kubelet/pod-resources"));
        assert_found(&p, "names no metrics.podResourcesSocket");
        // A socket named must be mounted.
        let mut labels = config.clone();
        labels["metrics"] =
            json!({"podResourcesSocket": "/var/lib/kubelet/pod-resources/kubelet.sock"});
        let p = check_mounts(&labels, &pod("/tmp"));
        assert_found(&p, "metrics.podResourcesSocket");
    }

    #[test]
    fn config_paths_outside_the_mounts_are_reported() {
        let config = serde_json::json!({
            "stateDir": "/var/lib/kubedev",
            "hostRoot": "/host",
            "metrics": {"podResourcesSocket": "/var/lib/kubelet/pod-resources/kubelet.sock"},
            "devicePlugin": {"enabled": true, "directory": "/var/lib/kubelet/device-plugins"},
        });
        let pod = serde_json::json!({"containers": [{"volumeMounts": [
            {"mountPath": "/var/lib/kubedev"},
            {"mountPath": "/var/lib/kubelet/pod-resources"},
            {"mountPath": "/var/lib/kubelet/device-plugins-old"},
        ]}]});
        let problems = check_mounts(&config, &pod);
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(
            problems[0].contains("devicePlugin.directory"),
            "{problems:?}"
        );
        assert!(problems[1].contains("hostRoot"), "{problems:?}");
    }
}
