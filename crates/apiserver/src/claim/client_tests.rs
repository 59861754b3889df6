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
use crate::error::Error;

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
    ClaimRef::parse(uid, "team-a", name).unwrap()
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

/// Requests a fake API server is serving now, the most it served at once, and all it received.
type Load = Arc<Mutex<(usize, usize, usize)>>;

/// A fake API server that answers every claim GET after `delay`, the first `throttled` of them
/// with `429 Too Many Requests`; it counts the requests and the most it had at once.
fn busy(delay: std::time::Duration, throttled: usize) -> (Client, Load) {
    let load: Load = Arc::default();
    let seen = load.clone();
    let service = tower::service_fn(move |_req: Request<Body>| {
        let seen = seen.clone();
        async move {
            let n = {
                let mut l = seen.lock();
                l.0 += 1;
                l.1 = l.1.max(l.0);
                l.2 += 1;
                l.2
            };
            tokio::time::sleep(delay).await;
            seen.lock().0 -= 1;
            let response = if n <= throttled {
                let body = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                    "reason": "TooManyRequests", "code": 429,
                    "message": "too many requests, please try again later"});
                Response::builder()
                    .status(StatusCode::TOO_MANY_REQUESTS)
                    .header("Retry-After", "1")
                    .body(Body::from(serde_json::to_vec(&body).unwrap()))
                    .unwrap()
            } else {
                ok(&claim_json())
            };
            Ok::<_, std::convert::Infallible>(response)
        }
    });
    (Client::new(service, "default"), load)
}

#[tokio::test]
async fn thousands_of_claims_at_once_keep_a_few_dozen_requests_in_flight() {
    let (client, load) = busy(std::time::Duration::from_millis(2), 0);
    let reader = ClaimReader::new(client, driver());
    let claim = claim_ref("uid-1", "train");
    // As a NodePrepareResources call of 2,000 claims does: every claim read at once, through
    // clones of the one reader.
    let reads = (0..2_000).map(|_| {
        let reader = reader.clone();
        let claim = claim.clone();
        async move { reader.get(&claim).await }
    });
    let answers = futures::future::join_all(reads).await;
    assert!(answers.iter().all(Result::is_ok), "every claim read");
    let (now, most, all) = *load.lock();
    assert_eq!((now, all), (0, 2_000));
    assert!(
        most <= super::reader::MAX_IN_FLIGHT && most > 1,
        "{most} requests at once"
    );
}

#[tokio::test(start_paused = true)]
async fn a_read_the_api_server_throttles_is_tried_again() {
    let (client, load) = busy(std::time::Duration::ZERO, 3);
    let reader = ClaimReader::new(client, driver());
    let started = tokio::time::Instant::now();
    let claim = reader.get(&claim_ref("uid-1", "train")).await.unwrap();
    assert_eq!(claim.results.len(), 1);
    assert_eq!(load.lock().2, 4, "three refusals, then the claim");
    assert!(started.elapsed() >= std::time::Duration::from_millis(1_750));

    // An API server that keeps refusing: the error names the throttling, after the last pause.
    let (client, load) = busy(std::time::Duration::ZERO, usize::MAX);
    let reader = ClaimReader::new(client, driver());
    let err = reader.get(&claim_ref("uid-1", "train")).await.unwrap_err();
    assert_eq!(load.lock().2, 7, "the first try and six more");
    assert!(err.to_string().contains("too many requests"), "{err}");
}

/// A fake API server that has the claim but answers every status write with `code`.
fn refusing_writes(code: u16, reason: &'static str) -> Client {
    let service = tower::service_fn(move |req: Request<Body>| async move {
        let response = if req.method() == "GET" {
            ok(&claim_json())
        } else {
            let body = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                "reason": reason, "code": code, "message": format!("refused: {reason}")});
            Response::builder()
                .status(code)
                .body(Body::from(serde_json::to_vec(&body).unwrap()))
                .unwrap()
        };
        Ok::<_, std::convert::Infallible>(response)
    });
    Client::new(service, "default")
}

#[tokio::test]
async fn a_status_write_the_api_server_refuses_as_invalid_is_not_tried_again() {
    let dev = DeviceRef::new(
        PoolName::new("node-a").unwrap(),
        DeviceName::new("gpu-0").unwrap(),
    );
    let claim = claim_ref("uid-1", "train");
    let devices = [DeviceStatus::ready(dev, None)];
    // As the API server answers a driver without permission for claims of any node.
    for (code, reason, retryable) in [
        (422, "Invalid", false),
        (403, "Forbidden", false),
        (400, "BadRequest", false),
        (500, "InternalError", true),
        (503, "ServiceUnavailable", true),
    ] {
        let reader = ClaimReader::new(refusing_writes(code, reason), driver());
        let err = reader
            .set_device_status(&claim, &devices)
            .await
            .unwrap_err();
        assert_eq!(err.is_retryable(), retryable, "{code}: {err}");
        assert!(err.to_string().contains(reason), "{err}");
    }
}
