//! What the API server stores of ResourceSlices and ResourceClaims, against the testkit's API
//! server emulator of the same release: the same dry-run creates (a slice for each gated field
//! kubedev may write, in both counter layouts; a claim for each request shape, with what the
//! server defaults left out) sent to both through one client, and the answers compared:
//! accepted or refused (HTTP code and reason), and of an accepted object the spec the server
//! would store. Then a claim read as the daemon reads it: the same claim created on both, its
//! allocation written through the status subresource, and kubedev's own
//! `ClaimReader` must get the same allocation of its driver from each. Where they differ, the
//! real server is right.

use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, PostParams};
use kubedev_testkit::apiserver::{ApiServer, KubeRelease};

use super::*;

/// What one server answered to one create.
#[derive(Debug, Clone, PartialEq)]
enum Answer {
    /// Stored: the spec it keeps.
    Stored(Value),
    /// Refused: the HTTP code and reason.
    Refused(u16, String),
}

impl std::fmt::Display for Answer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Answer::Stored(spec) => write!(f, "stored {spec}"),
            Answer::Refused(code, reason) => write!(f, "refused: HTTP {code} {reason}"),
        }
    }
}

/// Sends every case to the real API server (as it runs now, emulating 1.`minor` or being it)
/// and to the emulator of that release; each difference, described.
pub(super) fn differences(node: &Node, minor: u32) -> anyhow::Result<Vec<String>> {
    let release = KubeRelease::from_minor(minor)
        .with_context(|| format!("the emulator does not model Kubernetes 1.{minor}"))?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let emulator = ApiServer::builder().kubernetes(release).start().await?;
        let real = real_client(node).await?;
        let fake = emulator.client()?;
        let mut out = Vec::new();
        for (name, object) in cases().into_iter().chain(claim_cases()) {
            let theirs = create(&real, &object).await?;
            let ours = create(&fake, &object).await?;
            if theirs != ours {
                out.push(format!(
                    "1.{minor}, {name}: the API server {theirs}; the emulator {ours}"
                ));
            }
        }
        let theirs = read_back(&real, minor).await;
        let ours = read_back(&fake, minor).await;
        if theirs != ours {
            out.push(format!(
                "1.{minor}, claim read by kubedev: from the API server {theirs}; from the \
                 emulator {ours}"
            ));
        }
        emulator.shutdown().await;
        Ok(out)
    })
}

/// A client of the real API server with the admin's kubeconfig.
async fn real_client(node: &Node) -> anyhow::Result<kube::Client> {
    let kubeconfig = kube::config::Kubeconfig::read_from(node.kubeconfig())?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?;
    Ok(kube::Client::try_from(config)?)
}

/// A dry-run create of `object` (a ResourceSlice, or a ResourceClaim in its namespace): the
/// spec the server would store, or its refusal.
async fn create(client: &kube::Client, object: &Value) -> anyhow::Result<Answer> {
    let kind = object["kind"].as_str().unwrap_or_default();
    let gvk = GroupVersionKind::gvk("resource.k8s.io", "v1", kind);
    let resource = ApiResource::from_gvk(&gvk);
    let api: Api<DynamicObject> = match object["metadata"]["namespace"].as_str() {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
        None => Api::all_with(client.clone(), &resource),
    };
    let object: DynamicObject = serde_json::from_value(object.clone())?;
    let params = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    match api.create(&params, &object).await {
        Ok(stored) => {
            let mut spec = stored.data.get("spec").cloned().unwrap_or(Value::Null);
            without_times(&mut spec);
            Ok(Answer::Stored(spec))
        }
        Err(kube::Error::Api(status)) => Ok(Answer::Refused(status.code, status.reason.clone())),
        Err(other) => Err(other.into()),
    }
}

/// `spec` with every time the server sets (a taint's `timeAdded`) replaced by `<time>` (the two
/// servers' clocks differ, not what they keep), and without null fields: a server emulating an
/// older release still writes its own release's JSON, which leaves out empty fields that the
/// older release wrote as `null` (1.34's `devices`); a client reads both the same.
fn without_times(spec: &mut Value) {
    match spec {
        Value::Object(map) => {
            map.retain(|_, v| !v.is_null());
            for (k, v) in map.iter_mut() {
                if k == "timeAdded" && v.is_string() {
                    *v = Value::String("<time>".into());
                } else {
                    without_times(v);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(without_times),
        _ => {}
    }
}

/// One ResourceSlice of kubedev's driver on the node, named for `case`, with `spec` added to
/// the driver, node and pool.
fn slice(case: &str, count: u32, spec: Value) -> Value {
    let mut full = serde_json::json!({
        "driver": DRIVER,
        "nodeName": "parity-node",
        "pool": {"name": format!("parity-{case}"), "generation": 1, "resourceSliceCount": count},
    });
    if let (Some(full), Value::Object(extra)) = (full.as_object_mut(), spec) {
        full.extend(extra);
    }
    serde_json::json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": format!("kubedev-parity-{case}")},
        "spec": full,
    })
}

/// The cases: a slice for each gated field kubedev may write, and both counter layouts.
fn cases() -> Vec<(&'static str, Value)> {
    use serde_json::json;
    let counters = json!([{"name": "gpu-0", "counters": {"memory": {"value": "80Gi"}, "sms": {"value": "132"}}}]);
    let consumer = |name: &str| {
        json!({
            "name": name,
            "consumesCounters": [{"counterSet": "gpu-0", "counters": {"memory": {"value": "10Gi"}, "sms": {"value": "16"}}}],
        })
    };
    vec![
        (
            "attributes",
            slice(
                "attributes",
                1,
                json!({"devices": [{
                    "name": "dev-0",
                    "attributes": {
                        "model": {"string": "x1"},
                        "index": {"int": 0},
                        "healthy": {"bool": true},
                        "driverVersion": {"version": "1.2.3"},
                    },
                    "capacity": {"memory": {"value": "16Gi"}},
                }]}),
            ),
        ),
        (
            "counters-with-devices",
            slice(
                "counters-with-devices",
                1,
                json!({"sharedCounters": counters, "devices": [consumer("part-0")]}),
            ),
        ),
        (
            "counters-only",
            slice("counters-only", 2, json!({"sharedCounters": counters})),
        ),
        (
            "consumes-counters",
            slice(
                "consumes-counters",
                2,
                json!({"devices": [consumer("part-0"), consumer("part-1")]}),
            ),
        ),
        (
            "taints",
            slice(
                "taints",
                1,
                json!({"devices": [{
                    "name": "dev-0",
                    "taints": [
                        {"key": format!("{DRIVER}/unhealthy"), "value": "xid-79", "effect": "NoExecute"},
                        {"key": format!("{DRIVER}/draining"), "effect": "NoSchedule"},
                    ],
                }]}),
            ),
        ),
        (
            "shared-capacity",
            slice(
                "shared-capacity",
                1,
                json!({"devices": [{
                    "name": "dev-0",
                    "allowMultipleAllocations": true,
                    "capacity": {"memory": {
                        "value": "40Gi",
                        "requestPolicy": {"default": "1Gi", "validRange": {"min": "1Gi", "max": "40Gi", "step": "1Gi"}},
                    }},
                }]}),
            ),
        ),
        (
            "binding-conditions",
            slice(
                "binding-conditions",
                1,
                json!({"devices": [{
                    "name": "dev-0",
                    "bindsToNode": true,
                    "bindingConditions": ["attached"],
                    "bindingFailureConditions": ["failed"],
                }]}),
            ),
        ),
    ]
}

/// Creates a claim with a request, a constraint and opaque configuration of kubedev's driver
/// and another's, writes an allocation (a device of each driver, the configuration copied)
/// through the status subresource, and reads it with kubedev's `ClaimReader` (no reservation:
/// the real controller manager would remove one naming a pod that does not exist);
/// what it got, with the UID left out (the two servers make their own), or the error. The
/// claim is deleted again.
async fn read_back(client: &kube::Client, minor: u32) -> String {
    use kube::api::{DeleteParams, Patch, PatchParams};
    let name = format!("kubedev-parity-read-{minor}");
    let api: Api<k8s_openapi::api::resource::v1::ResourceClaim> =
        Api::namespaced(client.clone(), TEST_NAMESPACE);
    let opaque = |driver: &str, key: &str| serde_json::json!({"driver": driver, "parameters": {"apiVersion": "v1", "kind": "Config", key: 1}});
    let claim = serde_json::json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": TEST_NAMESPACE},
        "spec": {"devices": {
            "requests": [
                {"name": "a", "exactly": {"deviceClassName": CLASS}},
                {"name": "b", "exactly": {"deviceClassName": CLASS}},
            ],
            "constraints": [{"requests": ["a", "b"], "matchAttribute": format!("{DRIVER}/model")}],
            "config": [
                {"requests": ["a"], "opaque": opaque(DRIVER, "mine")},
                {"opaque": opaque("other.example.com", "theirs")},
            ],
        }},
    });
    let result = async {
        let claim: k8s_openapi::api::resource::v1::ResourceClaim = serde_json::from_value(claim)?;
        let created = api.create(&PostParams::default(), &claim).await?;
        let uid = created.metadata.uid.clone().unwrap_or_default();
        let status = serde_json::json!({"status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "a", "driver": DRIVER, "pool": "static", "device": "test-0"},
                        {"request": "b", "driver": "other.example.com", "pool": "p", "device": "d"},
                    ],
                    "config": [
                        {"source": "FromClaim", "requests": ["a"], "opaque": opaque(DRIVER, "mine")},
                        {"source": "FromClaim", "opaque": opaque("other.example.com", "theirs")},
                    ],
                },
                "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                    {"key": "metadata.name", "operator": "In", "values": ["parity-node"]},
                ]}]},
            },
        }});
        api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
            .await?;
        let reference = kubedev_core::ClaimRef::new(
            kubedev_core::ClaimUid::new(uid.clone())?,
            TEST_NAMESPACE.parse()?,
            name.parse()?,
        );
        let driver = kubedev_core::DriverName::new(DRIVER)?;
        let read = kubedev_apiserver::ClaimReader::new(client.clone(), driver)
            .get(&reference)
            .await?;
        anyhow::Ok(format!("read {read:?}").replace(&uid, "<uid>"))
    }
    .await;
    let _ = api.delete(&name, &DeleteParams::default()).await;
    match result {
        Ok(read) => read,
        Err(e) => format!("failed: {e:#}"),
    }
}

/// A ResourceClaim in the test namespace, named for `case`, with `devices` as its spec.
fn claim(case: &str, devices: Value) -> Value {
    serde_json::json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": format!("kubedev-parity-{case}"), "namespace": TEST_NAMESPACE},
        "spec": {"devices": devices},
    })
}

/// The claim cases: each request shape, mostly with the fields the server defaults left out.
fn claim_cases() -> Vec<(&'static str, Value)> {
    use serde_json::json;
    let exactly = |extra: Value| {
        let mut request = json!({"deviceClassName": CLASS});
        if let (Some(r), Value::Object(extra)) = (request.as_object_mut(), extra) {
            r.extend(extra);
        }
        request
    };
    vec![
        (
            "claim-defaults",
            claim(
                "claim-defaults",
                json!({"requests": [{"name": "dev", "exactly": exactly(json!({}))}]}),
            ),
        ),
        (
            "claim-all-and-selector",
            claim(
                "claim-all-and-selector",
                json!({"requests": [{"name": "dev", "exactly": exactly(json!({
                    "allocationMode": "All",
                    "selectors": [{"cel": {"expression": format!("device.driver == \"{DRIVER}\"")}}],
                }))}]}),
            ),
        ),
        (
            "claim-first-available",
            claim(
                "claim-first-available",
                json!({"requests": [{"name": "dev", "firstAvailable": [
                    {"name": "big", "deviceClassName": CLASS, "count": 2},
                    {"name": "small", "deviceClassName": CLASS},
                ]}]}),
            ),
        ),
        (
            "claim-tolerations",
            claim(
                "claim-tolerations",
                json!({"requests": [{"name": "dev", "exactly": exactly(json!({
                    "tolerations": [
                        {"key": format!("{DRIVER}/unhealthy"), "value": "xid-79", "effect": "NoExecute", "tolerationSeconds": 30},
                        {"key": format!("{DRIVER}/draining"), "operator": "Exists"},
                    ],
                }))}]}),
            ),
        ),
        (
            "claim-constraints",
            claim(
                "claim-constraints",
                json!({
                    "requests": [
                        {"name": "a", "exactly": exactly(json!({}))},
                        {"name": "b", "exactly": exactly(json!({}))},
                    ],
                    "constraints": [{"requests": ["a", "b"], "matchAttribute": format!("{DRIVER}/model")}],
                }),
            ),
        ),
        (
            "claim-capacity",
            claim(
                "claim-capacity",
                json!({"requests": [{"name": "dev", "exactly": exactly(json!({
                    "capacity": {"requests": {"memory": "1Gi"}},
                }))}]}),
            ),
        ),
        (
            "claim-admin-access",
            claim(
                "claim-admin-access",
                json!({"requests": [{"name": "dev", "exactly": exactly(json!({"adminAccess": true}))}]}),
            ),
        ),
    ]
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn every_case_is_a_resource_slice_of_the_driver_with_its_own_pool() {
        let cases = cases();
        let mut pools = BTreeSet::new();
        for (name, s) in &cases {
            assert_eq!(s["kind"], "ResourceSlice", "{name}");
            assert_eq!(s["spec"]["driver"], DRIVER, "{name}");
            assert!(
                pools.insert(s["spec"]["pool"]["name"].to_string()),
                "{name}"
            );
            let _: DynamicObject = serde_json::from_value(s.clone()).unwrap();
        }
        assert_eq!(cases.len(), 7);
    }

    #[test]
    fn kubedev_reads_its_part_of_the_claim_from_the_emulator() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let read = runtime.block_on(async {
            let emulator = ApiServer::builder()
                .kubernetes(KubeRelease::V1_37)
                .start()
                .await
                .unwrap();
            let read = read_back(&emulator.client().unwrap(), 37).await;
            emulator.shutdown().await;
            read
        });
        assert!(read.starts_with("read "), "{read}");
        assert!(read.contains("test-0") && read.contains("mine"), "{read}");
        assert!(
            !read.contains("theirs") && !read.contains("other.example.com"),
            "{read}"
        );
        assert!(read.contains("<uid>"), "{read}");
    }

    #[test]
    fn only_the_times_the_server_sets_are_left_out() {
        let mut spec = serde_json::json!({"devices": [{"taints": [
            {"key": "k", "timeAdded": "2026-12-06T04:00:00Z"},
        ]}], "timeAddedBy": "x", "sharedCounters": null});
        without_times(&mut spec);
        assert_eq!(spec["devices"][0]["taints"][0]["timeAdded"], "<time>");
        assert_eq!(spec["devices"][0]["taints"][0]["key"], "k");
        assert_eq!(spec["timeAddedBy"], "x");
        assert!(spec.get("sharedCounters").is_none());
    }

    #[test]
    fn every_claim_case_is_a_claim_in_the_test_namespace() {
        let mut names = BTreeSet::new();
        for (name, c) in claim_cases() {
            assert_eq!(c["kind"], "ResourceClaim", "{name}");
            assert_eq!(c["metadata"]["namespace"], TEST_NAMESPACE, "{name}");
            assert!(names.insert(c["metadata"]["name"].to_string()), "{name}");
            let _: DynamicObject = serde_json::from_value(c).unwrap();
        }
    }
}
