//! `ClaimReader` against a fake API server: reads, missing claims, names refused before any
//! request, and status writes retried on conflict.

use parking_lot::Mutex;
use std::sync::Arc;

use http::{Request, Response, StatusCode};
use kube::Client;
use kube::client::Body;
use kubedev_core::{DeviceName, DeviceRef, DriverName, PoolName};
use serde_json::json;

use super::*;
use crate::Error;

fn claim_json() -> serde_json::Value {
    json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "train", "namespace": "team-a", "uid": "uid-1", "resourceVersion": "7"},
        "spec": {},
        "status": {"allocation": {"devices": {"results": [
            {"request": "gpu", "driver": "gpu.example.com", "pool": "node-a", "device": "gpu-0"}
        ]}}}
    })
}

fn not_found() -> Response<Body> {
    let body = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
        "reason": "NotFound", "code": 404, "message": "not found"});
    Response::builder()
        .status(StatusCode::NOT_FOUND)
        .body(Body::from(serde_json::to_vec(&body).unwrap()))
        .unwrap()
}

fn conflict() -> Response<Body> {
    let body = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
        "reason": "Conflict", "code": 409, "message": "the object has been modified"});
    Response::builder()
        .status(StatusCode::CONFLICT)
        .body(Body::from(serde_json::to_vec(&body).unwrap()))
        .unwrap()
}

fn ok(value: &serde_json::Value) -> Response<Body> {
    Response::builder()
        .status(StatusCode::OK)
        .body(Body::from(serde_json::to_vec(value).unwrap()))
        .unwrap()
}

type Log = Arc<Mutex<Vec<(String, String, Vec<u8>)>>>;

/// A fake API server holding one claim; the first `conflicts` status writes answer 409.
fn fake(conflicts: usize) -> (Client, Log) {
    let log: Log = Arc::default();
    let seen = log.clone();
    let remaining = Arc::new(Mutex::new(conflicts));
    let service = tower::service_fn(move |req: Request<Body>| {
        let seen = seen.clone();
        let remaining = remaining.clone();
        async move {
            let method = req.method().to_string();
            let path = req.uri().path().to_owned();
            let body = http_body_util_collect(req.into_body()).await;
            seen.lock().push((method.clone(), path.clone(), body));
            let base = "/apis/resource.k8s.io/v1/namespaces/team-a/resourceclaims/train";
            let response = match (method.as_str(), path.as_str()) {
                ("GET", p) if p == base => ok(&claim_json()),
                ("PATCH", p) if p == format!("{base}/status") => {
                    let mut left = remaining.lock();
                    if *left > 0 {
                        *left -= 1;
                        conflict()
                    } else {
                        ok(&claim_json())
                    }
                }
                _ => not_found(),
            };
            Ok::<_, std::convert::Infallible>(response)
        }
    });
    (Client::new(service, "default"), log)
}

async fn http_body_util_collect(body: Body) -> Vec<u8> {
    use http_body_util::BodyExt;
    body.collect()
        .await
        .map(|c| c.to_bytes().to_vec())
        .unwrap_or_default()
}

fn claim_ref(uid: &str, name: &str) -> ClaimRef {
    ClaimRef::new(uid.parse().unwrap(), "team-a", name)
}

fn driver() -> DriverName {
    DriverName::new("gpu.example.com").unwrap()
}

#[tokio::test]
async fn get_reads_the_claim_from_the_api_server() {
    let (client, log) = fake(0);
    let reader = ClaimReader::new(client, driver());
    let claim = reader.get(&claim_ref("uid-1", "train")).await.unwrap();
    assert_eq!(claim.results.len(), 1);
    assert_eq!(claim.results[0].device.device.to_string(), "node-a/gpu-0");
    {
        let log = log.lock();
        assert_eq!(log.len(), 1);
        assert_eq!(log[0].0, "GET");
    }

    let err = reader.get(&claim_ref("uid-2", "train")).await.unwrap_err();
    assert!(matches!(err, Error::ClaimUidMismatch { .. }), "{err}");
}

#[tokio::test]
async fn a_missing_claim_is_not_found() {
    let (client, _) = fake(0);
    let reader = ClaimReader::new(client, driver());
    let err = reader.get(&claim_ref("uid-1", "gone")).await.unwrap_err();
    assert_eq!(err.to_string(), "ResourceClaim team-a/gone not found");
}

#[tokio::test]
async fn bad_claim_names_are_refused_before_any_request() {
    let dev = DeviceRef::new(
        PoolName::new("node-a").unwrap(),
        DeviceName::new("gpu-0").unwrap(),
    );
    let (client, log) = fake(0);
    let reader = ClaimReader::new(client, driver());

    let traversal = claim_ref("uid-1", "../../../api/v1/nodes/x");
    let err = reader.get(&traversal).await.unwrap_err();
    assert!(
        matches!(err, Error::InvalidClaimName { field: "name", .. }),
        "{err}"
    );
    let text = err.to_string();
    assert!(
        text.starts_with(
            "ResourceClaim name \"../../../api/v1/nodes/x\" (namespace team-a, UID uid-1) \
             is not a valid DNS subdomain"
        ),
        "{text}"
    );
    let err = reader
        .set_device_status(&traversal, &[DeviceStatus::ready(dev.clone(), None)])
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidClaimName { .. }), "{err}");

    let slash = claim_ref("uid-1", "train/status");
    let err = reader.get(&slash).await.unwrap_err();
    assert!(err.to_string().contains("contains '/'"), "{err}");

    let mut bad_namespace = claim_ref("uid-1", "train");
    bad_namespace.namespace = "team-a/resourceclaims/other".into();
    let err = reader.get(&bad_namespace).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "ResourceClaim namespace \"team-a/resourceclaims/other\" (name \"train\", UID uid-1) \
         is not a valid DNS label (at most 63 lowercase letters, digits or '-', starting and \
         ending with a letter or digit): contains '/'; only lowercase letters, digits and '-' \
         are allowed"
    );
    let mut long_namespace = claim_ref("uid-1", "train");
    long_namespace.namespace = "a".repeat(64);
    let err = reader.get(&long_namespace).await.unwrap_err();
    assert!(err.to_string().contains("no more than 63"), "{err}");

    assert!(log.lock().is_empty(), "no request may be made");

    // Names longer than a DNS label are fine: a claim name is a subdomain.
    let long = "a".repeat(100);
    let err = reader.get(&claim_ref("uid-1", &long)).await.unwrap_err();
    assert!(matches!(err, Error::ClaimNotFound { .. }), "{err}");
    assert_eq!(log.lock().len(), 1);
}

#[tokio::test]
async fn status_writes_retry_conflicts_and_give_up_eventually() {
    let dev = DeviceRef::new(
        PoolName::new("node-a").unwrap(),
        DeviceName::new("gpu-0").unwrap(),
    );
    let (client, log) = fake(2);
    let reader = ClaimReader::new(client, driver());
    reader
        .set_device_status(
            &claim_ref("uid-1", "train"),
            &[DeviceStatus::ready(dev.clone(), None)],
        )
        .await
        .unwrap();
    {
        let log = log.lock();
        let patches: Vec<&(String, String, Vec<u8>)> =
            log.iter().filter(|(m, _, _)| m == "PATCH").collect();
        assert_eq!(patches.len(), 3, "two conflicts, then success");
        let sent: serde_json::Value = serde_json::from_slice(&patches[2].2).unwrap();
        assert_eq!(sent["metadata"]["resourceVersion"], "7");
        assert_eq!(sent["metadata"]["uid"], "uid-1");
        assert!(sent.get("spec").is_none(), "{sent}");
        let entry = &sent["status"]["devices"][0];
        assert_eq!(entry["driver"], "gpu.example.com");
        assert_eq!(entry["device"], "gpu-0");
        assert_eq!(entry["conditions"][0]["type"], "Ready");
        assert_eq!(entry["conditions"][0]["status"], "True");
    }

    let (client, _) = fake(100);
    let reader = ClaimReader::new(client, driver());
    let err = reader
        .set_device_status(
            &claim_ref("uid-1", "train"),
            &[DeviceStatus::ready(dev, None)],
        )
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::ClaimConflict { attempts: 5, .. }),
        "{err}"
    );
}
