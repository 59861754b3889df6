//! The checks of one rendering on the test rendering (`testdata/vfio-rendering.yaml`), as it
//! is and after one change each.

#![allow(clippy::unwrap_used)]

use serde_json::{Value, json};

use super::super::tests::assert_found;
use super::super::{Object, parse_objects};
use super::*;

#[test]
fn device_classes_must_take_exactly_their_backends_devices() {
    let compile = |e: &str| vec![kubedev_allocator::cel::compile(e).unwrap()];
    let d = "devices.example.com";
    let good = compile(&format!(
        "device.driver == \"{d}\" && \"kind\" in device.attributes[\"host.kubedev.io\"]"
    ));
    assert_eq!(
        check_class_selects(&format!("host.{d}"), d, &good),
        Vec::<String>::new()
    );
    // The same selector under another backend's class name misses and takes devices.
    let wrong = check_class_selects(&format!("usb.{d}"), d, &good);
    assert_eq!(wrong.len(), 2, "{wrong:?}");
    // Without the driver test it takes another driver's device; unguarded, it fails on
    // devices that lack the attribute.
    let loose = compile("device.attributes[\"gpu.nvidia.com\"].type == \"gpu\"");
    let problems = check_class_selects(&format!("gpu.{d}"), d, &loose);
    assert!(
        problems.iter().any(|p| p.contains("another driver's")),
        "{problems:?}"
    );
    assert!(
        problems.iter().any(|p| p.contains("fails on")),
        "{problems:?}"
    );
}

/// The chart rendered with ci/vfio-values.yaml (DRA and device plugins, vfio rebinding
/// drivers, a daemon-applied DeviceClass, a pinned image, a scraper let in).
const TEST_RENDERED: &str = include_str!("../testdata/vfio-rendering.yaml");

fn rendering() -> Vec<Object> {
    parse_objects(TEST_RENDERED).unwrap()
}

/// The first object of `kind`.
fn object<'a>(objects: &'a mut [Object], kind: &str) -> &'a mut Value {
    &mut objects.iter_mut().find(|o| o.kind == kind).unwrap().value
}

fn pod(objects: &mut [Object]) -> &mut Value {
    object(objects, "DaemonSet")
        .pointer_mut("/spec/template/spec")
        .unwrap()
}

/// Changes the daemon's configuration in the rendered ConfigMap.
fn with_config(objects: &mut [Object], change: impl FnOnce(&mut Value)) {
    let cm = object(objects, "ConfigMap");
    let mut config: Value =
        serde_saphyr::from_str(cm["data"]["config.yaml"].as_str().unwrap()).unwrap();
    change(&mut config);
    // JSON is YAML.
    cm["data"]["config.yaml"] = serde_json::to_string(&config).unwrap().into();
}

/// The problems the checks find in the test rendering after `change`.
fn problems_after(change: impl FnOnce(&mut Vec<Object>)) -> Vec<String> {
    let mut objects = rendering();
    change(&mut objects);
    check_objects(&objects)
}

#[test]
fn the_test_rendering_passes() {
    assert_eq!(check_objects(&rendering()), Vec::<String>::new());
}

#[test]
fn a_rendering_without_the_admission_policy_fails() {
    let p = problems_after(|o| {
        o.retain(|o| !o.kind.starts_with("ValidatingAdmissionPolicy"));
    });
    assert_found(&p, "no ValidatingAdmissionPolicy is rendered");
    let p = problems_after(|o| o.retain(|o| o.kind != "ValidatingAdmissionPolicyBinding"));
    assert_found(&p, "no ValidatingAdmissionPolicyBinding binds it");
    let p = problems_after(|o| {
        object(o, "ValidatingAdmissionPolicyBinding")["spec"]["validationActions"] =
            json!(["Warn", "Audit"]);
    });
    assert_found(&p, "has no Deny");
    let p = problems_after(|o| {
        let spec = &mut object(o, "ValidatingAdmissionPolicyBinding")["spec"];
        spec["paramRef"] = json!({"name": "x", "parameterNotFoundAction": "Allow"});
        spec["matchResources"] = json!({"objectSelector": {"matchLabels": {"a": "b"}}});
    });
    assert_found(&p, "has a paramRef");
    assert_found(&p, "matchResources narrows which slices the policy sees");
}

#[test]
fn an_admission_policy_that_fails_open_or_misses_writes_fails() {
    // Failing open, beta versions only, exemptions by label.
    let p = problems_after(|o| {
        let spec = &mut object(o, "ValidatingAdmissionPolicy")["spec"];
        spec["failurePolicy"] = json!("Ignore");
        spec["matchConstraints"]["matchPolicy"] = json!("Exact");
        spec["matchConstraints"]["resourceRules"][0]["apiVersions"] = json!(["v1beta1"]);
        spec["matchConstraints"]["objectSelector"] = json!({"matchLabels": {"checked": "yes"}});
    });
    assert_found(&p, "failurePolicy Ignore");
    assert_found(
        &p,
        "does not match CREATE of resource.k8s.io/v1 resourceslices",
    );
    assert_found(&p, "exempts slices by their labels");
}

#[test]
fn a_rendering_without_seccomp_fails() {
    let p = problems_after(|o| {
        let pod = pod(o);
        pod["securityContext"]
            .as_object_mut()
            .unwrap()
            .remove("seccompProfile");
        pod["containers"][0]["securityContext"]
            .as_object_mut()
            .unwrap()
            .remove("seccompProfile");
    });
    assert_found(&p, "sets no seccompProfile RuntimeDefault");
    assert_found(&p, "container kubedev: runs without a seccomp profile");
    let p = problems_after(|o| {
        pod(o)["containers"][0]["securityContext"]["seccompProfile"] =
            json!({"type": "Unconfined"});
    });
    assert_found(&p, "turns seccomp off");
}

// What the roles grant is judged by the real authorizer (cluster/tests/renderings.rs, with the
// mutations that used to be here); these are the objects' own shape.
#[test]
fn rbac_objects_that_reach_beyond_the_daemon_fail() {
    let p = problems_after(|o| {
        object(o, "ClusterRole")["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"] =
            json!("true");
    });
    assert_found(&p, "adds the daemon's permissions to a built-in role");
    let p = problems_after(|o| {
        object(o, "ClusterRole")["aggregationRule"] = json!({"clusterRoleSelectors": [
            {"matchLabels": {"rbac.example.com/aggregate-to-kubedev": "true"}}]});
    });
    assert_found(&p, "has an aggregationRule");
    let p = problems_after(|o| o.retain(|o| o.kind != "RoleBinding"));
    assert_found(&p, "Role default/kubedev-events: bound to nobody");
    let p = problems_after(|o| {
        object(o, "ClusterRoleBinding")["subjects"]
            .as_array_mut()
            .unwrap()
            .push(json!({"kind": "Group", "name": "system:authenticated",
                   "apiGroup": "rbac.authorization.k8s.io"}));
    });
    assert_found(&p, "also binds Group /system:authenticated");
}

#[test]
fn rbac_objects_short_of_what_the_daemon_needs_fail() {
    let p = problems_after(|o| o.retain(|o| o.kind != "Role"));
    assert_found(&p, "binds Role \"kubedev-events\", which is not rendered");
    let p = problems_after(|o| pod(o)["automountServiceAccountToken"] = json!(false));
    assert_found(&p, "mounts no service-account token");
}

#[test]
fn device_plugin_mode_gets_no_api_access() {
    let p = problems_after(|o| with_config(o, |c| c["dra"] = json!({"enabled": false})));
    assert_found(&p, "ClusterRole kubedev: rendered in device-plugin mode");
    assert_found(
        &p,
        "RoleBinding default/kubedev-events: rendered in device-plugin mode",
    );
    assert_found(&p, "the pod mounts a service-account token");
    assert_found(
        &p,
        "ValidatingAdmissionPolicy kubedev-resourceslices: rendered while DRA is off",
    );
}

#[test]
fn host_paths_beyond_what_the_backends_need_fail() {
    // The whole host root, writable, for a backend that reads only /sys and /dev.
    let p = problems_after(|o| {
        let pod = pod(o);
        pod["volumes"]
            .as_array_mut()
            .unwrap()
            .push(json!({"name": "host-root", "hostPath": {"path": "/", "type": "Directory"}}));
        pod["containers"][0]["volumeMounts"]
            .as_array_mut()
            .unwrap()
            .push(json!({"name": "host-root", "mountPath": "/host"}));
    });
    assert_found(
        &p,
        "volume host-root is the host's whole root, but no enabled backend",
    );
    assert_found(&p, "mounts the host's whole root writable at /host");
    // hostRoot pointing where no host path is.
    let p = problems_after(|o| with_config(o, |c| c["hostRoot"] = json!("/host")));
    assert_found(
        &p,
        "the vfio backend reads the host's /sys at /host/sys (hostRoot /host)",
    );
    // vfio rebinds drivers, but sysfs is read-only.
    let p = problems_after(|o| {
        let mounts = pod(o)["containers"][0]["volumeMounts"]
            .as_array_mut()
            .unwrap();
        let sys = mounts.iter_mut().find(|m| m["name"] == "sys").unwrap();
        sys["readOnly"] = json!(true);
    });
    assert_found(&p, "/sys is mounted read-only");
    // Nothing writes to sysfs, yet it is writable.
    let p = problems_after(|o| {
        with_config(o, |c| {
            c["backends"]["vfio"]["bindOnPrepare"] = json!(false);
            c["backends"]["vfio"]["desiredMdevTypes"] = json!([]);
        });
    });
    assert_found(
        &p,
        "the host's /sys is writable at /sys, but nothing writes to it",
    );
}

#[test]
fn privilege_and_host_namespaces_without_need_fail() {
    let p = problems_after(|o| {
        with_config(o, |c| {
            let vfio = c["backends"]
                .as_object_mut()
                .unwrap()
                .remove("vfio")
                .unwrap();
            c["backends"]["usb"] = json!({"resources": []});
            drop(vfio);
        });
    });
    assert_found(&p, "privileged, but no enabled backend needs it");
    let p = problems_after(|o| {
        let pod = pod(o);
        pod["hostNetwork"] = json!(true);
        pod["containers"][0]["securityContext"]["readOnlyRootFilesystem"] = json!(false);
    });
    assert_found(&p, "the pod sets hostNetwork");
    assert_found(&p, "its root file system is not read-only");
    // Unprivileged, but escalating, keeping capabilities, adding one no backend needs.
    let p = problems_after(|o| {
        let sc = &mut pod(o)["containers"][0]["securityContext"];
        sc.as_object_mut().unwrap().remove("privileged");
        sc["allowPrivilegeEscalation"] = json!(true);
        sc["capabilities"] = json!({"add": ["SYS_ADMIN"]});
    });
    assert_found(&p, "allows privilege escalation");
    assert_found(&p, "does not drop every capability");
    assert_found(&p, "adds capability SYS_ADMIN");
}

#[test]
fn images_tolerations_and_open_metrics_fail() {
    let p = problems_after(|o| pod(o)["containers"][0]["image"] = json!("kubedev/kubedev:0.1.0"));
    assert_found(&p, "names no registry");
    let p = problems_after(|o| {
        pod(o)["containers"][0]["image"] = json!("ghcr.io/kubedev/kubedev@sha256:1234");
    });
    assert_found(&p, "is not sha256:<64 lowercase hex digits>");
    let p = problems_after(|o| pod(o)["tolerations"] = json!([{"operator": "Exists"}]));
    assert_found(&p, "tolerates every taint");
    let p = problems_after(|o| o.retain(|o| o.kind != "NetworkPolicy"));
    assert_found(
        &p,
        "no NetworkPolicy restricts ingress to the daemon's pods",
    );
    let p = problems_after(|o| {
        let rule = &mut object(o, "NetworkPolicy")["spec"]["ingress"][0];
        rule.as_object_mut().unwrap().remove("from");
        rule.as_object_mut().unwrap().remove("ports");
    });
    assert_found(&p, "ingress[0] names no peer, so it lets every pod in");
    assert_found(&p, "ingress[0] opens every port");
    let p = problems_after(|o| {
        object(o, "NetworkPolicy")["spec"]["ingress"][0]["from"] =
            json!([{"namespaceSelector": {}}]);
    });
    assert_found(&p, "takes in every pod or address");
    let p = problems_after(|o| {
        object(o, "NetworkPolicy")["spec"]["ingress"][0]["ports"] =
            json!([{"port": 9464}, {"port": 22, "protocol": "TCP"}]);
    });
    assert_found(
        &p,
        "opens {\"port\":22,\"protocol\":\"TCP\"}, which is not the metrics port",
    );
    // A metrics Service for scraping that the NetworkPolicy keeps every scraper away from.
    let p = problems_after(|o| {
        object(o, "NetworkPolicy")["spec"]["ingress"] = json!([]);
        let mut service = parse_objects(
            "apiVersion: v1\nkind: Service\nmetadata: {name: kubedev-metrics, namespace: \
             kube-system}\nspec: {clusterIP: None, ports: [{name: metrics, port: 9464}]}\n",
        )
        .unwrap();
        o.append(&mut service);
    });
    assert_found(
        &p,
        "a metrics Service is rendered for scraping, but the NetworkPolicy",
    );
}

#[test]
fn a_chart_class_the_daemon_also_applies_fails() {
    let p = problems_after(|o| {
        with_config(o, |c| {
            c["dra"]["deviceClasses"][0]["name"] = json!("vfio.devices.kubedev.io");
        });
    });
    assert_found(
        &p,
        "DeviceClass vfio.devices.kubedev.io: dra.deviceClasses names it too",
    );
}
