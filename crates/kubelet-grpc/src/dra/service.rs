//! `NodePrepareResources` / `NodeUnprepareResources` for DRA `v1` and `v1beta1`.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::StreamExt as _;
use kubedev_core::echo::echo;
use kubedev_core::{ClaimName, ClaimRef, ClaimUid, Namespace};
use tonic::{Request, Response, Status};

use super::{ClaimError, DraHandler, PrepareResults, PreparedClaimDevice};
use crate::pb::dra::{v1, v1beta1};

/// How many claims of one call are prepared or unprepared at once. A call may name thousands
/// (a kubelet that restarted, a pod of many claims); each claim in progress holds its handler's
/// state, so the rest wait their turn instead of all starting together.
const CLAIMS_AT_ONCE: usize = 256;

#[allow(missing_debug_implementations)] // holds the handler, a trait object
pub struct Service {
    pub(crate) driver: String,
    pub(crate) handler: Arc<dyn DraHandler>,
}

/// Checks one claim reference from the kubelet; the error names the field.
fn claim_ref(i: usize, namespace: &str, uid: &str, name: &str) -> Result<ClaimRef, ClaimError> {
    let invalid = |message: String| ClaimError::permanent("invalid_request", message);
    let missing = |f: &str| invalid(format!("claims[{i}].{f} is empty"));
    if uid.is_empty() {
        return Err(missing("uid"));
    }
    if namespace.is_empty() {
        return Err(missing("namespace"));
    }
    if name.is_empty() {
        return Err(missing("name"));
    }
    let uid = ClaimUid::new(uid).map_err(|e| invalid(format!("claims[{i}].uid: {e}")))?;
    // The API server only stores claims whose namespace is a DNS label and whose name is a DNS
    // subdomain; anything else did not come from a real claim, and must not reach a log as is.
    let namespace =
        Namespace::new(namespace).map_err(|e| invalid(format!("claims[{i}].namespace: {e}")))?;
    let name = ClaimName::new(name).map_err(|e| invalid(format!("claims[{i}].name: {e}")))?;
    Ok(ClaimRef::new(uid, namespace, name))
}

impl Service {
    async fn prepare(&self, claims: Vec<(String, Result<ClaimRef, ClaimError>)>) -> PrepareResults {
        let handler = &self.handler;
        futures::stream::iter(claims)
            .map(|(uid, c)| async move {
                let r = match &c {
                    Ok(claim) => handler.prepare(claim).await,
                    Err(e) => Err(e.clone()),
                };
                if let Err(e) = &r {
                    self.log_failure("prepare", &uid, &c, e);
                }
                (uid, r)
            })
            .buffer_unordered(CLAIMS_AT_ONCE)
            .collect()
            .await
    }

    async fn unprepare(
        &self,
        claims: Vec<(String, Result<ClaimRef, ClaimError>)>,
    ) -> BTreeMap<String, Result<(), ClaimError>> {
        let handler = &self.handler;
        futures::stream::iter(claims)
            .map(|(uid, c)| async move {
                let r = match &c {
                    Ok(claim) => handler.unprepare(claim).await,
                    Err(e) => Err(e.clone()),
                };
                if let Err(e) = &r {
                    self.log_failure("unprepare", &uid, &c, e);
                }
                (uid, r)
            })
            .buffer_unordered(CLAIMS_AT_ONCE)
            .collect()
            .await
    }

    /// One WARN line per failed claim, naming the claim (or the UID the kubelet sent, when the
    /// reference itself was refused) and whether retrying can help.
    fn log_failure(
        &self,
        operation: &str,
        uid: &str,
        claim: &Result<ClaimRef, ClaimError>,
        error: &ClaimError,
    ) {
        let driver = &self.driver;
        let retry = error.retry();
        match claim {
            Ok(claim) => {
                tracing::warn!(%driver, %claim, %error, %retry, "{operation} failed");
            }
            Err(_) => {
                tracing::warn!(%driver, claim_uid = %echo(uid), %error, %retry, "{operation} refused: malformed claim reference");
            }
        }
    }
}

fn v1_device(d: PreparedClaimDevice) -> v1::Device {
    v1::Device {
        request_names: d.request_names,
        pool_name: d.pool,
        device_name: d.device,
        cdi_device_ids: d.cdi_device_ids,
        share_id: d.share_id,
    }
}

fn v1beta1_device(d: PreparedClaimDevice) -> v1beta1::Device {
    v1beta1::Device {
        request_names: d.request_names,
        pool_name: d.pool,
        device_name: d.device,
        cdi_device_ids: d.cdi_device_ids,
    }
}

/// Implements the `DRAPlugin` service of one API version: the two versions differ only in their
/// message types (and `v1`'s share ID, which `$device` handles).
macro_rules! dra_plugin_service {
    ($api:ident, $device:ident) => {
        #[tonic::async_trait]
        impl $api::dra_plugin_server::DraPlugin for Service {
            async fn node_prepare_resources(
                &self,
                request: Request<$api::NodePrepareResourcesRequest>,
            ) -> Result<Response<$api::NodePrepareResourcesResponse>, Status> {
                let req = request.into_inner();
                let claims = self
                    .prepare(claims_of(&req.claims, |c| (&c.namespace, &c.uid, &c.name)))
                    .await;
                let claims = claims
                    .into_iter()
                    .map(|(uid, r)| {
                        let (devices, error) = match r {
                            Ok(devs) => (devs.into_iter().map($device).collect(), String::new()),
                            Err(error) => (Vec::new(), error.kubelet_message()),
                        };
                        (uid, $api::NodePrepareResourceResponse { devices, error })
                    })
                    .collect();
                Ok(Response::new($api::NodePrepareResourcesResponse { claims }))
            }

            async fn node_unprepare_resources(
                &self,
                request: Request<$api::NodeUnprepareResourcesRequest>,
            ) -> Result<Response<$api::NodeUnprepareResourcesResponse>, Status> {
                let req = request.into_inner();
                let claims = self
                    .unprepare(claims_of(&req.claims, |c| (&c.namespace, &c.uid, &c.name)))
                    .await;
                let claims = claims
                    .into_iter()
                    .map(|(uid, r)| {
                        let error = r.err().map(|e| e.kubelet_message()).unwrap_or_default();
                        (uid, $api::NodeUnprepareResourceResponse { error })
                    })
                    .collect();
                Ok(Response::new($api::NodeUnprepareResourcesResponse {
                    claims,
                }))
            }
        }
    };
}

/// The claims of a request, keyed by UID, each checked.
fn claims_of<C>(
    claims: &[C],
    fields: impl Fn(&C) -> (&String, &String, &String),
) -> Vec<(String, Result<ClaimRef, ClaimError>)> {
    claims
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let (namespace, uid, name) = fields(c);
            (uid.clone(), claim_ref(i, namespace, uid, name))
        })
        .collect()
}

dra_plugin_service!(v1, v1_device);
dra_plugin_service!(v1beta1, v1beta1_device);
