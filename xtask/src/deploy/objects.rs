//! deploy-check's checks of one rendering's objects that need no daemon binary: each object's
//! type, the DaemonSet and ConfigMap and the names they use for each other, the daemon's pod
//! against its configuration, access and the pod (the `access` and `pod` modules), and the
//! DeviceClasses, whose CEL selectors are evaluated against sample devices of every backend.

use std::collections::BTreeMap;

use serde_json::Value;

use super::container::{check_config_file, check_container, check_mounts};
use super::{Object, access, check_type, pod};

/// The checks of one rendering that need no daemon binary: types, configuration paths, names,
/// DeviceClasses, access and the pod.
pub(super) fn check_objects(objects: &[Object]) -> Vec<String> {
    let mut problems = check_types(objects);

    let of_kind = |kind: &'static str| objects.iter().filter(move |o| o.kind == kind);
    let (Some(ds), Some(cm)) = (of_kind("DaemonSet").next(), of_kind("ConfigMap").next()) else {
        problems.push("the rendering needs one DaemonSet and one ConfigMap".into());
        return problems;
    };
    if of_kind("DaemonSet").count() != 1 || of_kind("ConfigMap").count() != 1 {
        problems.push("the rendering needs exactly one DaemonSet and one ConfigMap".into());
    }
    let ds_at = format!("{}: {}", ds.source, ds.id);
    let pod = ds
        .value
        .pointer("/spec/template/spec")
        .unwrap_or(&Value::Null);

    let config = match daemon_config(cm) {
        Ok(config) => config,
        Err(problem) => {
            problems.push(problem);
            return problems;
        }
    };
    // The configuration's paths inside the mounts, the container, the --config file.
    problems.extend(
        check_daemon_pod(&config, pod, cm)
            .into_iter()
            .map(|p| format!("{ds_at}: {p}")),
    );
    // Names the objects use for each other.
    problems.extend(check_references(objects, pod, &ds_at, cm));
    // RBAC and the admission policy.
    problems.extend(access::check(objects, &config, pod));
    // The pod's confinement, host paths, image, tolerations and metrics exposure.
    let template = ds.value.pointer("/spec/template").unwrap_or(&Value::Null);
    problems.extend(
        pod::check(objects, &config, template)
            .into_iter()
            .map(|p| format!("{ds_at}: {p}")),
    );
    problems.extend(check_device_classes(objects, &config));
    problems
}

/// Every object is rendered once and is the Kubernetes type its apiVersion and kind name,
/// losing no field; returns the problems.
fn check_types(objects: &[Object]) -> Vec<String> {
    let mut problems = Vec::new();
    let mut seen = BTreeMap::new();
    for o in objects {
        let at = format!("{}: {}", o.source, o.id);
        if seen.insert(o.id.clone(), ()).is_some() {
            problems.push(format!("{at}: rendered twice"));
        }
        match check_type(o) {
            Ok(lost) => problems.extend(lost.into_iter().map(|l| format!("{at}: {l}"))),
            Err(e) => problems.push(format!("{at}: does not parse as {}: {e}", o.kind)),
        }
    }
    problems
}

/// The daemon's configuration: the ConfigMap's `config.yaml`, parsed; or the problem.
fn daemon_config(cm: &Object) -> Result<Value, String> {
    let cm_at = format!("{}: {}", cm.source, cm.id);
    let Some(config) = cm
        .value
        .pointer("/data/config.yaml")
        .and_then(Value::as_str)
    else {
        return Err(format!("{cm_at}: has no data.config.yaml"));
    };
    serde_saphyr::from_str(config).map_err(|e| format!("{cm_at}: config.yaml is not YAML: {e}"))
}

/// The daemon's pod against its configuration: the configuration's paths inside the mounts,
/// the container's environment and probes, and the `--config` file a mounted key of `cm`;
/// returns the problems.
fn check_daemon_pod(config: &Value, pod: &Value, cm: &Object) -> Vec<String> {
    let mut problems = check_mounts(config, pod);
    problems.extend(check_container(config, pod));
    problems.extend(check_config_file(pod, &cm.name, cm.value.get("data")));
    problems
}

/// The names the objects use for each other: the DaemonSet (at `ds_at`, running `pod`)
/// mounts a volume of ConfigMap `cm` and runs as the rendered ServiceAccount; returns the
/// problems.
fn check_references(objects: &[Object], pod: &Value, ds_at: &str, cm: &Object) -> Vec<String> {
    let mut problems = Vec::new();
    let volume_cm = pod
        .get("volumes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|v| v.pointer("/configMap/name").and_then(Value::as_str))
        .collect::<Vec<_>>();
    if !volume_cm.contains(&cm.name.as_str()) {
        problems.push(format!(
            "{ds_at}: mounts no volume from ConfigMap {:?}",
            cm.name
        ));
    }
    let sa_name = pod
        .get("serviceAccountName")
        .and_then(Value::as_str)
        .unwrap_or("default");
    for sa in objects.iter().filter(|o| o.kind == "ServiceAccount") {
        if sa.name != sa_name {
            problems.push(format!(
                "{}: {}: the DaemonSet runs as {sa_name:?}, not as this account",
                sa.source, sa.id
            ));
        }
    }
    problems
}

/// DeviceClasses: only in DRA mode, selectors that compile and name the driver, names that
/// are not also classes the daemon applies itself (the two would fight over the object);
/// returns the problems.
fn check_device_classes(objects: &[Object], config: &Value) -> Vec<String> {
    let mut problems = Vec::new();
    let dra = config.pointer("/dra/enabled") == Some(&Value::Bool(true));
    let driver = config
        .pointer("/dra/driverName")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let daemon_classes: Vec<&str> = config
        .pointer("/dra/deviceClasses")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|c| c.get("name").and_then(Value::as_str))
        .collect();
    for class in objects.iter().filter(|o| o.kind == "DeviceClass") {
        let at = format!("{}: {}", class.source, class.id);
        if !dra {
            problems.push(format!("{at}: rendered while DRA is off"));
        }
        if daemon_classes.contains(&class.name.as_str()) {
            problems.push(format!(
                "{at}: dra.deviceClasses names it too: the chart and every daemon would both \
                 own it"
            ));
        }
        problems.extend(
            check_class_selectors(class, driver)
                .into_iter()
                .map(|p| format!("{at}: {p}")),
        );
    }
    problems
}

/// A DeviceClass's CEL selectors: there is one, each compiles, together they take exactly
/// their backend's sample devices, and one tests the driver; returns the problems.
fn check_class_selectors(class: &Object, driver: &str) -> Vec<String> {
    let mut problems = Vec::new();
    let selectors = class
        .value
        .pointer("/spec/selectors")
        .and_then(Value::as_array);
    let expressions: Vec<&str> = selectors
        .into_iter()
        .flatten()
        .filter_map(|s| s.pointer("/cel/expression").and_then(Value::as_str))
        .collect();
    if expressions.is_empty() {
        problems.push("has no CEL selector".to_string());
    }
    let mut programs = Vec::new();
    for e in &expressions {
        match kubedev_allocator::cel::compile(e) {
            Ok(p) => programs.push(p),
            Err(err) => problems.push(format!("selector {e:?} does not compile: {err}")),
        }
    }
    if programs.len() == expressions.len() {
        problems.extend(check_class_selects(&class.name, driver, &programs));
    }
    let wanted = format!("device.driver == \"{driver}\"");
    if !expressions.iter().any(|e| e.contains(&wanted)) {
        problems.push(format!("no selector tests {wanted}"));
    }
    problems
}

/// A sample device: the class that must take it, its driver, its attributes.
type Sample<'a> = (&'a str, &'a str, Vec<(&'a str, &'a str)>);

/// Sample devices as each backend publishes them (the attributes the classes look at), named by
/// the class that must take them.
fn sample_devices() -> Vec<(&'static str, Vec<(&'static str, &'static str)>)> {
    vec![
        (
            "gpu",
            vec![
                ("gpu.nvidia.com/type", "gpu"),
                ("gpu.nvidia.com/uuid", "GPU-1"),
            ],
        ),
        (
            "mig",
            vec![
                ("gpu.nvidia.com/type", "mig"),
                ("gpu.nvidia.com/uuid", "MIG-1"),
            ],
        ),
        (
            "vfio",
            vec![("type", "pci"), ("pciAddress", "0000:3b:00.0")],
        ),
        ("vfio", vec![("type", "mdev"), ("mdevType", "nvidia-222")]),
        (
            "usb",
            vec![("usb.kubedev.io/resource", "example.com/yubikey")],
        ),
        (
            "host",
            vec![
                ("host.kubedev.io/kind", "char"),
                ("host.kubedev.io/name", "kvm"),
            ],
        ),
        ("static", vec![("type", "gpu"), ("model", "x1")]),
        ("static", vec![]),
    ]
}

/// Evaluates a DeviceClass's selectors (all must hold) against the sample devices of every
/// backend: the class `<backend>.<driver>` must take exactly its backend's devices, a device of
/// another driver never, and no evaluation may fail. Returns the problems.
fn check_class_selects(
    class: &str,
    driver: &str,
    programs: &[std::sync::Arc<kubedev_allocator::cel::Program>],
) -> Vec<String> {
    use kubedev_allocator::cel::{AttributeValue, DeviceContext, evaluate};
    let backend = class.strip_suffix(&format!(".{driver}")).unwrap_or(class);
    let mut problems = Vec::new();
    let mut samples: Vec<Sample<'_>> = sample_devices()
        .into_iter()
        .map(|(owner, attrs)| (owner, driver, attrs))
        .collect();
    samples.push((
        "another driver's",
        "gpu.example.com",
        vec![("gpu.nvidia.com/type", "gpu")],
    ));
    for (owner, device_driver, attrs) in samples {
        let device = DeviceContext::new(
            device_driver,
            attrs
                .iter()
                .map(|(k, v)| ((*k).to_string(), AttributeValue::String((*v).to_string()))),
            std::iter::empty::<(String, kubedev_core::Quantity)>(),
            false,
        );
        let mut selected = true;
        for program in programs {
            match evaluate(program, &device) {
                Ok(b) => selected &= b,
                Err(e) => {
                    problems.push(format!(
                        "its selector fails on a {owner} device {attrs:?}: {e}"
                    ));
                    selected = false;
                }
            }
        }
        let wanted = owner == backend && device_driver == driver;
        if selected != wanted {
            let verb = if selected { "takes" } else { "misses" };
            problems.push(format!(
                "{verb} a {owner} device of driver {device_driver} {attrs:?}"
            ));
        }
    }
    problems
}

#[cfg(test)]
mod tests;
