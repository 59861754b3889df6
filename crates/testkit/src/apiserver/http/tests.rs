//! Tests of URL routing.

use super::parse_route;
use crate::apiserver::resource::Resource;

#[test]
fn routes_follow_the_rest_layout() {
    let r = parse_route("/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c/status")
        .expect("parse")
        .expect("route");
    assert_eq!(
        (
            r.resource,
            r.namespace.as_deref(),
            r.name.as_deref(),
            r.status
        ),
        (Resource::ResourceClaims, Some("ns"), Some("c"), true)
    );
    let r = parse_route("/api/v1/nodes/n1")
        .expect("parse")
        .expect("route");
    assert_eq!(
        (r.resource, r.name.as_deref()),
        (Resource::Nodes, Some("n1"))
    );
    let r = parse_route("/apis/resource.k8s.io/v1/resourceclaims")
        .expect("parse")
        .expect("route");
    assert_eq!(
        (r.resource, r.namespace, r.name),
        (Resource::ResourceClaims, None, None)
    );
    let r = parse_route("/api/v1/namespaces/ns/pods/p")
        .expect("parse")
        .expect("route");
    assert_eq!(
        (r.resource, r.namespace.as_deref(), r.name.as_deref()),
        (Resource::Pods, Some("ns"), Some("p"))
    );
    for missing in [
        "/apis/resource.k8s.io/v1/namespaces/ns/resourceslices",
        "/apis/resource.k8s.io/v1/resourceslices/s/status",
        "/apis/resource.k8s.io/v1beta1/resourceslices",
        "/api/v1/configmaps",
        "/apis/resource.k8s.io/v1/resourceclaims/c",
    ] {
        assert!(parse_route(missing).expect("parse").is_none(), "{missing}");
    }
}
