//! The claim reader against the emulator: this driver's devices read with their configuration,
//! claims of another UID, unallocated or missing refused, device status written through the
//! status subresource.

use super::*;

const NS: &str = "team-a";

fn claim_ref(uid: &str) -> ClaimRef {
    ClaimRef::parse(uid, NS, "train").unwrap()
}

async fn server_with_claim(status: Value) -> (ApiServer, String) {
    let server = ApiServer::start().await.unwrap();
    let stored = server
        .put_raw(
            Resource::ResourceClaims,
            json!({
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": "train", "namespace": NS},
                // As the API server stores it, defaults filled in.
                "spec": {"devices": {"requests": [
                    {"name": "gpu", "exactly": {"deviceClassName": "gpu.example.com",
                                                "allocationMode": "ExactCount", "count": 1}}
                ]}},
                "status": status,
            }),
        )
        .unwrap();
    let uid = stored["metadata"]["uid"].as_str().unwrap().to_owned();
    (server, uid)
}

fn allocated() -> Value {
    json!({"allocation": {"devices": {
        "results": [
            {"request": "gpu", "driver": "net.example.com", "pool": NODE, "device": "eth-0"},
            {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": "gpu-3"}
        ],
        "config": [
            {"source": "FromClaim", "opaque": {"driver": DRIVER, "parameters": {"from": "claim"}}},
            {"source": "FromClass", "opaque": {"driver": DRIVER, "parameters": {"from": "class"}}},
            {"source": "FromClass", "opaque": {"driver": "net.example.com", "parameters": {"from": "other"}}}
        ]
    }}})
}

#[tokio::test]
async fn this_drivers_devices_come_with_their_config_class_first() {
    let (server, uid) = server_with_claim(allocated()).await;
    let reader = ClaimReader::new(server.client().unwrap(), driver());
    let claim = reader.get(&claim_ref(&uid)).await.unwrap();
    let devices = claim.devices();
    assert_eq!(devices.len(), 1);
    assert_eq!(devices[0].device.to_string(), "node-a/gpu-3");
    assert_eq!(devices[0].request, "gpu");
    // Class first; each entry keeps its place in the allocation's list, for error messages.
    let config: Vec<_> = devices[0]
        .config
        .iter()
        .map(|c| (c.source, c.index, c.parameters.clone()))
        .collect();
    assert_eq!(
        config,
        vec![
            (
                kubedev_core::ConfigSource::Class,
                1,
                json!({"from": "class"})
            ),
            (
                kubedev_core::ConfigSource::Claim,
                0,
                json!({"from": "claim"})
            )
        ]
    );
}

#[tokio::test]
async fn a_claim_with_another_uid_is_refused() {
    let (server, uid) = server_with_claim(allocated()).await;
    let reader = ClaimReader::new(server.client().unwrap(), driver());
    let err = reader.get(&claim_ref("not-the-uid")).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("ResourceClaim team-a/train has UID {uid}, expected not-the-uid")
    );
}

#[tokio::test]
async fn an_unallocated_or_missing_claim_is_refused() {
    let (server, uid) = server_with_claim(json!({})).await;
    let reader = ClaimReader::new(server.client().unwrap(), driver());
    let err = reader.get(&claim_ref(&uid)).await.unwrap_err();
    assert!(matches!(err, Error::ClaimNotAllocated { .. }), "{err}");
    let mut other = claim_ref(&uid);
    other.name = "nope".parse().unwrap();
    let err = reader.get(&other).await.unwrap_err();
    assert!(matches!(err, Error::ClaimNotFound { .. }), "{err}");
}

#[tokio::test]
async fn device_status_is_written_through_the_status_subresource() {
    let (server, uid) = server_with_claim(allocated()).await;
    let reader = ClaimReader::new(server.client().unwrap(), driver());
    let device = DeviceRef::new(
        PoolName::new(NODE).unwrap(),
        DeviceName::new("gpu-3").unwrap(),
    );
    server.fail_next(
        Verb::PatchStatus,
        Resource::ResourceClaims,
        1,
        Fault::Conflict,
    );
    reader
        .set_device_status(&claim_ref(&uid), &[DeviceStatus::ready(device, None)])
        .await
        .unwrap();
    let stored = server
        .get(Resource::ResourceClaims, Some(NS), "train")
        .unwrap();
    let entry = &stored["status"]["devices"][0];
    assert_eq!(entry["driver"], DRIVER);
    assert_eq!(entry["device"], "gpu-3");
    assert_eq!(entry["conditions"][0]["type"], "Ready");
    assert_eq!(entry["conditions"][0]["status"], "True");
    assert_eq!(
        server.request_count(Verb::PatchStatus, Resource::ResourceClaims),
        2,
        "one conflict, then success"
    );
    assert_eq!(stored["spec"]["devices"]["requests"][0]["name"], "gpu");
}
