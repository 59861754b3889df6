//! ResourceClaims: the status subresource, device conditions, an immutable spec and namespaces.

use k8s_openapi::api::resource::v1::{
    AllocatedDeviceStatus, AllocationResult, DeviceAllocationResult, DeviceClaim, DeviceRequest,
    DeviceRequestAllocationResult, ExactDeviceRequest, ResourceClaim, ResourceClaimSpec,
    ResourceClaimStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, Time};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kubedev_testkit::apiserver::{ApiServer, Resource, Verb};
use serde_json::json;

use super::{DRIVER, api_error};

fn claim() -> ResourceClaim {
    ResourceClaim {
        metadata: ObjectMeta {
            name: Some("claim-1".to_owned()),
            ..Default::default()
        },
        spec: Some(ResourceClaimSpec {
            devices: Some(DeviceClaim {
                requests: Some(vec![DeviceRequest {
                    name: "gpu".to_owned(),
                    exactly: Some(ExactDeviceRequest {
                        device_class_name: "gpu.example.com".to_owned(),
                        ..Default::default()
                    }),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
        }),
        status: Some(ResourceClaimStatus {
            reserved_for: None,
            ..Default::default()
        }),
    }
}

fn allocation() -> AllocationResult {
    AllocationResult {
        devices: Some(DeviceAllocationResult {
            results: Some(vec![DeviceRequestAllocationResult {
                request: "gpu".to_owned(),
                driver: DRIVER.to_owned(),
                pool: "node-1".to_owned(),
                device: "gpu-0".to_owned(),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[tokio::test]
async fn resource_claim_status_goes_through_the_status_subresource() {
    let server = ApiServer::start().await.expect("start");
    let claims: Api<ResourceClaim> = Api::namespaced(server.client().expect("client"), "team-a");

    let created = create_drops_status_and_applies_defaults(&claims).await;
    let unchanged = main_resource_ignores_status(&claims, &created).await;
    status_subresource_writes_status(&claims, &created, &unchanged).await;
    device_conditions_by_status_patch(&claims).await;
    spec_is_immutable(&claims).await;
    namespaces_separate_claims(&server, &claims).await;
    assert_eq!(
        server.request_count(Verb::UpdateStatus, Resource::ResourceClaims),
        2
    );
    assert_eq!(
        server.request_count(Verb::PatchStatus, Resource::ResourceClaims),
        2
    );
    server.shutdown().await;
}

/// A create drops the status and applies the request defaults.
async fn create_drops_status_and_applies_defaults(claims: &Api<ResourceClaim>) -> ResourceClaim {
    let mut with_status = claim();
    with_status.status = Some(ResourceClaimStatus {
        allocation: Some(allocation()),
        ..Default::default()
    });
    let created = claims
        .create(&PostParams::default(), &with_status)
        .await
        .expect("create");
    assert!(
        created
            .status
            .as_ref()
            .is_none_or(|s| s.allocation.is_none()),
        "status is dropped on create"
    );
    assert_eq!(created.metadata.namespace.as_deref(), Some("team-a"));
    let exact = created
        .spec
        .as_ref()
        .and_then(|s| s.devices.as_ref())
        .and_then(|d| d.requests.as_ref())
        .and_then(|r| r[0].exactly.as_ref())
        .expect("exactly");
    assert_eq!(
        (exact.allocation_mode.as_deref(), exact.count),
        (Some("ExactCount"), Some(1)),
        "defaults are applied"
    );
    created
}

/// Status changes through the main resource are ignored.
async fn main_resource_ignores_status(
    claims: &Api<ResourceClaim>,
    created: &ResourceClaim,
) -> ResourceClaim {
    let mut sneaky = created.clone();
    sneaky.status = Some(ResourceClaimStatus {
        allocation: Some(allocation()),
        ..Default::default()
    });
    let unchanged = claims
        .replace("claim-1", &PostParams::default(), &sneaky)
        .await
        .expect("replace");
    assert!(
        unchanged
            .status
            .as_ref()
            .is_none_or(|s| s.allocation.is_none())
    );

    unchanged
}

/// The status subresource sets the allocation without bumping the generation; a stale status
/// write conflicts.
async fn status_subresource_writes_status(
    claims: &Api<ResourceClaim>,
    created: &ResourceClaim,
    unchanged: &ResourceClaim,
) {
    let mut allocated = unchanged.clone();
    allocated.status = Some(ResourceClaimStatus {
        allocation: Some(allocation()),
        ..Default::default()
    });
    let allocated = claims
        .replace_status("claim-1", &PostParams::default(), &allocated)
        .await
        .expect("replace status");
    assert!(
        allocated
            .status
            .as_ref()
            .and_then(|s| s.allocation.as_ref())
            .is_some()
    );
    assert_eq!(
        allocated.metadata.generation, created.metadata.generation,
        "status does not bump the generation"
    );

    // A stale status write conflicts.
    let err = api_error(
        claims
            .replace_status("claim-1", &PostParams::default(), unchanged)
            .await,
    );
    assert_eq!(err.code, 409);
}

/// Device conditions for the allocated device, by merge patch on the status; a device that is
/// not allocated is refused, naming the field.
async fn device_conditions_by_status_patch(claims: &Api<ResourceClaim>) {
    let device_status = AllocatedDeviceStatus {
        driver: DRIVER.to_owned(),
        pool: "node-1".to_owned(),
        device: "gpu-0".to_owned(),
        conditions: Some(vec![Condition {
            type_: "Ready".to_owned(),
            status: "True".to_owned(),
            reason: "Prepared".to_owned(),
            message: String::new(),
            last_transition_time: Time(
                k8s_openapi::jiff::Timestamp::from_second(1_700_000_000).expect("time"),
            ),
            observed_generation: None,
        }]),
        ..Default::default()
    };
    let patched = claims
        .patch_status(
            "claim-1",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"devices": [device_status]}})),
        )
        .await
        .expect("patch status");
    let devices = patched
        .status
        .as_ref()
        .and_then(|s| s.devices.as_ref())
        .expect("devices");
    assert_eq!(devices[0].device, "gpu-0");

    // A device that is not allocated is refused, naming the field.
    let err = api_error(
        claims
            .patch_status(
                "claim-1",
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"devices": [{"driver": DRIVER, "pool": "node-1", "device": "gpu-9"}]}})),
            )
            .await,
    );
    assert_eq!(err.code, 422);
    assert!(err.message.contains("status.devices[0]"), "{}", err.message);
}

/// The spec is immutable.
async fn spec_is_immutable(claims: &Api<ResourceClaim>) {
    let mut respec = claims.get("claim-1").await.expect("get");
    respec
        .spec
        .as_mut()
        .and_then(|s| s.devices.as_mut())
        .and_then(|d| d.requests.as_mut())
        .expect("requests")[0]
        .name = "other".to_owned();
    let err = api_error(
        claims
            .replace("claim-1", &PostParams::default(), &respec)
            .await,
    );
    assert_eq!(err.code, 422);
    assert!(
        err.message.contains("spec: Invalid value") && err.message.contains("field is immutable"),
        "{}",
        err.message
    );
}

/// Namespaces separate claims; the cluster-wide list sees them all.
async fn namespaces_separate_claims(server: &ApiServer, claims: &Api<ResourceClaim>) {
    let other: Api<ResourceClaim> = Api::namespaced(server.client().expect("client"), "team-b");
    other
        .create(&PostParams::default(), &claim())
        .await
        .expect("same name, other namespace");
    assert_eq!(
        claims
            .list(&ListParams::default())
            .await
            .expect("list")
            .items
            .len(),
        1
    );
    let all: Api<ResourceClaim> = Api::all(server.client().expect("client"));
    assert_eq!(
        all.list(&ListParams::default().fields("metadata.namespace=team-b"))
            .await
            .expect("list")
            .items
            .len(),
        1
    );
}
