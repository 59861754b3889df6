//! `NodePrepareResources` / `NodeUnprepareResources` as arbitrary protobuf bytes from the
//! kubelet's side of the socket, in both API versions, decoded and handed to the DRA service:
//! never panics; the handler only ever sees claim references that passed the checks; every
//! claim UID gets exactly one answer; and no error holds a raw control character or runs past
//! 1 KiB.
#![no_main]

use std::collections::BTreeSet;
use std::sync::Arc;

use async_trait::async_trait;
use kubedev_core::ClaimRef;
use kubedev_kubelet_grpc::dra::{ClaimError, DraHandler, PreparedClaimDevice};
use kubedev_kubelet_grpc::pb::dra::{v1, v1beta1};
use libfuzzer_sys::fuzz_target;
use prost::Message;
use tonic::Request;

/// Prepares claims named `ok-*`, refuses the rest; checks what reaches it.
struct Handler;

fn check(claim: &ClaimRef) {
    kubedev_core::check_dns_label(claim.namespace.as_str()).expect("a checked namespace");
    kubedev_core::check_dns_subdomain(claim.name.as_str(), 253).expect("a checked name");
}

#[async_trait]
impl DraHandler for Handler {
    async fn prepare(&self, claim: &ClaimRef) -> Result<Vec<PreparedClaimDevice>, ClaimError> {
        check(claim);
        if claim.name.as_str().starts_with("ok") {
            Ok(vec![PreparedClaimDevice {
                request_names: vec!["gpu".into()],
                pool: "node-a".into(),
                device: "gpu-0".into(),
                cdi_device_ids: vec![format!("gpu.example.com/claim={}-gpu-0", claim.uid)],
                share_id: None,
            }])
        } else {
            Err(ClaimError::retryable(
                "test",
                format!("claim {claim} refused"),
            ))
        }
    }

    async fn unprepare(&self, claim: &ClaimRef) -> Result<(), ClaimError> {
        check(claim);
        Ok(())
    }
}

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
    })
}

fn check_errors<'a>(sent: BTreeSet<String>, answers: impl Iterator<Item = (&'a String, &'a str)>) {
    let mut got = BTreeSet::new();
    for (uid, error) in answers {
        got.insert(uid.clone());
        assert!(error.len() <= 1024, "a {} byte error", error.len());
        assert!(
            !error.chars().any(char::is_control),
            "raw control character in {error:?}"
        );
    }
    assert_eq!(got, sent);
}

fuzz_target!(|data: &[u8]| {
    let Some((&selector, bytes)) = data.split_first() else {
        return;
    };
    let service = kubedev_kubelet_grpc::fuzzing::dra_service("gpu.example.com", Arc::new(Handler));
    // One request type and service method per selector value; each answer is checked alike.
    macro_rules! call {
        ($request:ty, $api:ident, $method:ident) => {{
            let Ok(req) = <$request>::decode(bytes) else {
                return;
            };
            let sent = req.claims.iter().map(|c| c.uid.clone()).collect();
            let resp =
                $api::dra_plugin_server::DraPlugin::$method(&service, Request::new(req)).await;
            if let Ok(resp) = resp {
                let resp = resp.into_inner();
                check_errors(sent, resp.claims.iter().map(|(k, v)| (k, v.error.as_str())));
            }
        }};
    }
    runtime().block_on(async {
        match selector % 4 {
            0 => call!(v1::NodePrepareResourcesRequest, v1, node_prepare_resources),
            1 => call!(
                v1::NodeUnprepareResourcesRequest,
                v1,
                node_unprepare_resources
            ),
            2 => call!(
                v1beta1::NodePrepareResourcesRequest,
                v1beta1,
                node_prepare_resources
            ),
            _ => call!(
                v1beta1::NodeUnprepareResourcesRequest,
                v1beta1,
                node_unprepare_resources
            ),
        }
    });
});
