//! The HTTP server as a release: what it reports, the gates it accepts at start, and a restart
//! as another release.

use super::*;

/// Sends one HTTP/1.1 request and reads the whole answer.
async fn http(
    server: &ApiServer,
    method: &str,
    path: &str,
    content_type: &str,
    body: &str,
) -> (u16, String, Value) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(server.addr())
        .await
        .expect("connect");
    let request = format!(
        "{method} {path} HTTP/1.1\r\nhost: emulator\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.expect("send");
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await.expect("read");
    let answer = String::from_utf8(answer).expect("utf-8");
    let (head, body) = answer.split_once("\r\n\r\n").expect("head and body");
    let code = head[9..12].parse().expect("status code");
    (
        code,
        head.to_owned(),
        serde_json::from_str(body).unwrap_or(Value::Null),
    )
}

#[tokio::test]
async fn the_server_reports_its_release_and_applies_its_gates() {
    let server = ApiServer::builder()
        .kubernetes(V1_35)
        .feature_gate(gate::DRA_DEVICE_TAINTS, true)
        .start()
        .await
        .expect("start");
    assert_eq!(server.release(), V1_35);
    assert!(server.feature_enabled(gate::DRA_DEVICE_TAINTS));
    assert!(!server.feature_enabled(gate::DRA_PARTITIONABLE_DEVICES));
    assert_eq!(
        server.feature_gates().get(gate::DRA_LIST_TYPE_ATTRIBUTES),
        None
    );

    let (code, _, version) = http(&server, "GET", "/version", "application/json", "").await;
    assert_eq!(code, 200);
    assert_eq!(
        (
            version["major"].as_str(),
            version["minor"].as_str(),
            version["gitVersion"].as_str()
        ),
        (Some("1"), Some("35"), Some("v1.35.0-kubedev-emulator"))
    );
    let info = server
        .client()
        .expect("client")
        .apiserver_version()
        .await
        .expect("kube reads the version");
    assert_eq!(info.minor, "35");

    // A dry-run create answers with the stored form and stores nothing; the unknown field
    // comes back as a warning.
    let mut body = list_slice(json!({"int": 0, "ints": [0]}));
    body["spec"]["devices"][0]["taints"] = json!([{"key": "k", "effect": "None"}]);
    body["spec"]["devices"][0]["allowMultipleAllocations"] = json!(true);
    let path = "/apis/resource.k8s.io/v1/resourceslices";
    let (code, head, answer) = http(
        &server,
        "POST",
        &format!("{path}?dryRun=All"),
        "application/json",
        &body.to_string(),
    )
    .await;
    assert_eq!(code, 201, "{answer}");
    assert!(
        head.to_ascii_lowercase().contains(
            "warning: 299 - \"unknown field \\\"spec.devices[0].attributes.numa.ints\\\"\""
        ),
        "{head}"
    );
    assert_eq!(answer["spec"]["devices"][0]["taints"][0]["effect"], "None");
    assert!(!has(&answer, "/spec/devices/0/allowMultipleAllocations"));
    assert!(server.objects(Resource::ResourceSlices).is_empty());

    let (code, _, answer) = http(
        &server,
        "POST",
        &format!("{path}?fieldValidation=Strict"),
        "application/json",
        &body.to_string(),
    )
    .await;
    assert_eq!((code, answer["reason"].as_str()), (400, Some("BadRequest")));

    let (code, _, answer) = http(
        &server,
        "PATCH",
        &format!("{path}/s?fieldManager=test"),
        "application/apply-patch+yaml",
        &json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice"})
            .as_object()
            .map(|m| {
                let mut b = body.clone();
                for (k, v) in m {
                    b[k] = v.clone();
                }
                b.to_string()
            })
            .expect("object"),
    )
    .await;
    assert_eq!(code, 500, "{answer}");
    assert!(answer.get("reason").is_none(), "{answer}");
    server.shutdown().await;
}

#[tokio::test]
async fn start_refuses_gates_the_release_does_not_allow() {
    let err = ApiServer::builder()
        .kubernetes(V1_34)
        .feature_gate(gate::DRA_LIST_TYPE_ATTRIBUTES, true)
        .start()
        .await
        .expect_err("no such gate in 1.34");
    assert!(
        matches!(err, ApiServerError::FeatureGate { release: V1_34, .. }),
        "{err}"
    );
    let err = ApiServer::builder()
        .feature_gate(gate::DRA_EXTENDED_RESOURCE, false)
        .start()
        .await
        .expect_err("locked in 1.37");
    assert!(err.to_string().contains("locked to true"), "{err}");
    let server = ApiServer::start().await.expect("start");
    assert_eq!(server.release(), KubeRelease::NEWEST);
    assert_eq!(server.feature_gates(), V1_38.default_feature_gates());
    server.shutdown().await;
}

#[tokio::test]
async fn a_restart_as_another_release_keeps_objects_and_ends_watches() {
    use futures::StreamExt;
    use k8s_openapi::api::resource::v1::ResourceSlice;
    use kube::api::{Api, PostParams, WatchParams};

    let server = ApiServer::builder()
        .kubernetes(V1_35)
        .start()
        .await
        .expect("start");
    // One client for the whole test: it stays connected across the restart.
    let client = server.client().expect("client");
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    let post = |name: &str| {
        let slices = slices.clone();
        let body: ResourceSlice = serde_json::from_value(counters_slice(name)).expect("typed");
        async move { slices.create(&PostParams::default(), &body).await }
    };
    let counters = |slice: &ResourceSlice| {
        slice
            .spec
            .shared_counters
            .as_ref()
            .map_or(0, |sets| sets.len())
    };

    // 1.35 with its defaults: DRAPartitionableDevices is off, so sharedCounters is dropped.
    let before = post("before").await.expect("create on 1.35");
    assert_eq!(counters(&before), 0);
    let stored_before = server
        .get(Resource::ResourceSlices, None, "before")
        .expect("stored");
    assert!(
        !has(&stored_before, "/spec/sharedCounters"),
        "{stored_before}"
    );

    let mut watch = slices
        .watch(
            &WatchParams::default(),
            &server.resource_version().to_string(),
        )
        .await
        .expect("watch")
        .boxed();

    // A gate 1.34 does not have: the restart is refused and nothing changes.
    let err = server
        .restart_as(V1_34, &[(gate::DRA_LIST_TYPE_ATTRIBUTES, true)])
        .expect_err("no such gate in 1.34");
    assert!(
        matches!(err, ApiServerError::FeatureGate { release: V1_34, .. }),
        "{err}"
    );
    assert_eq!(server.release(), V1_35);
    assert_eq!(server.feature_gates(), V1_35.default_feature_gates());

    // The upgrade to 1.36, whose defaults have the gate on.
    server.restart_as(V1_36, &[]).expect("restart as 1.36");
    assert_eq!(server.release(), V1_36);
    assert_eq!(server.feature_gates(), V1_36.default_feature_gates());
    assert!(server.feature_enabled(gate::DRA_PARTITIONABLE_DEVICES));

    // The open watch ends, as a restarting API server's do.
    tokio::time::timeout(std::time::Duration::from_secs(10), async {
        while watch.next().await.is_some() {}
    })
    .await
    .expect("the watch ends on the restart");

    let info = client.apiserver_version().await.expect("version");
    assert_eq!((info.major.as_str(), info.minor.as_str()), ("1", "36"));
    assert_eq!(info.git_version, "v1.36.0-kubedev-emulator");

    // The same create now keeps the counters; the object written before is untouched.
    let after = post("after").await.expect("create on 1.36");
    assert_eq!(counters(&after), 1);
    assert_eq!(
        server.get(Resource::ResourceSlices, None, "before"),
        Some(stored_before)
    );

    // Back to 1.35 with the gate turned on by hand: the counters are kept as well.
    server
        .restart_as(V1_35, &[(gate::DRA_PARTITIONABLE_DEVICES, true)])
        .expect("restart as 1.35 with the gate");
    assert_eq!(server.release(), V1_35);
    assert!(server.feature_enabled(gate::DRA_PARTITIONABLE_DEVICES));
    assert_eq!(counters(&post("gated").await.expect("create")), 1);
    server.shutdown().await;
}
