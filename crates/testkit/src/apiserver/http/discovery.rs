//! Discovery: `/version`, the API group and resource lists clients read before they call,
//! and the health endpoints.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::{Shared, json_response};
use crate::apiserver::release::KubeRelease;
use crate::apiserver::resource::Resource;

/// The verbs of every resource.
const ALL_VERBS: [&str; 8] = [
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];

/// The entry of `r` in a resource list.
fn resource_entry(r: Resource, verbs: &[&str]) -> Value {
    json!({
        "name": r.plural(),
        "singularName": r.kind().to_ascii_lowercase(),
        "namespaced": r.namespaced(),
        "kind": r.kind(),
        "verbs": verbs,
    })
}

/// The entry of the status subresource of `r` in a resource list.
fn status_entry(r: Resource) -> Value {
    json!({"name": format!("{}/status", r.plural()), "singularName": "", "namespaced": r.namespaced(), "kind": r.kind(), "verbs": ["get", "patch", "update"]})
}

/// The `/version` answer of `release`.
fn version(release: KubeRelease) -> Value {
    json!({
        "major": release.major().to_string(),
        "minor": release.minor().to_string(),
        "emulationMajor": release.major().to_string(),
        "emulationMinor": release.minor().to_string(),
        "minCompatibilityMajor": release.major().to_string(),
        "minCompatibilityMinor": (release.minor() - 1).to_string(),
        "gitVersion": release.git_version(),
        "gitCommit": "",
        "gitTreeState": "clean",
        "buildDate": "",
        "goVersion": "",
        "compiler": "kubedev",
        "platform": "linux/amd64",
    })
}

/// The answer to a discovery or health path; `None` for any other path.
pub(super) fn discovery(shared: &Shared, path: &str) -> Option<Response> {
    let group_version = json!({"groupVersion": "resource.k8s.io/v1", "version": "v1"});
    let body = match path.trim_end_matches('/') {
        "/version" => version(shared.store.strategy().release),
        "/api" => json!({
            "kind": "APIVersions",
            "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": shared.address}],
        }),
        "/apis" => json!({
            "kind": "APIGroupList",
            "apiVersion": "v1",
            "groups": [
                {"name": "resource.k8s.io", "versions": [group_version], "preferredVersion": group_version},
                {"name": "events.k8s.io", "versions": [{"groupVersion": "events.k8s.io/v1", "version": "v1"}], "preferredVersion": {"groupVersion": "events.k8s.io/v1", "version": "v1"}},
            ],
        }),
        "/apis/resource.k8s.io" => json!({
            "kind": "APIGroup",
            "apiVersion": "v1",
            "name": "resource.k8s.io",
            "versions": [group_version],
            "preferredVersion": group_version,
        }),
        "/api/v1" => json!({
            "kind": "APIResourceList",
            "groupVersion": "v1",
            "resources": [
                resource_entry(Resource::Nodes, &ALL_VERBS),
                status_entry(Resource::Nodes),
                resource_entry(Resource::Pods, &ALL_VERBS),
                status_entry(Resource::Pods),
            ],
        }),
        "/apis/resource.k8s.io/v1" => json!({
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": "resource.k8s.io/v1",
            "resources": [
                resource_entry(Resource::DeviceClasses, &ALL_VERBS),
                resource_entry(Resource::ResourceClaims, &ALL_VERBS),
                status_entry(Resource::ResourceClaims),
                resource_entry(Resource::ResourceSlices, &ALL_VERBS),
            ],
        }),
        "/apis/events.k8s.io/v1" => json!({
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": "events.k8s.io/v1",
            "resources": [resource_entry(Resource::Events, &ALL_VERBS)],
        }),
        "/healthz" | "/readyz" | "/livez" => return Some((StatusCode::OK, "ok").into_response()),
        _ => return None,
    };
    Some(json_response(200, &body))
}
