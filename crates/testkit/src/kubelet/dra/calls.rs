//! The kubelet's calls to a registered driver: `NodePrepareResources` and
//! `NodeUnprepareResources`, in the DRA service version it chose (`v1` or `v1beta1`).

use std::collections::BTreeMap;
use std::path::Path;

use kubedev_kubelet_grpc::pb::dra;
use tonic::Status;
use tonic::transport::Channel;

use super::{ClaimId, DraKubelet, PrepareAnswer, PreparedDeviceAnswer, connect};

impl DraKubelet {
    /// Calls `NodePrepareResources` for `claims` (one pod's claims for one driver, batched as the
    /// kubelet does) in the version the kubelet chose; returns one answer per claim UID.
    pub async fn prepare(
        &self,
        driver: &str,
        claims: &[ClaimId],
    ) -> Result<BTreeMap<String, PrepareAnswer>, Status> {
        let d = self.driver(driver)?;
        let channel = connect(Path::new(&d.endpoint), &self.dialing.dra).await?;
        if d.chosen == "v1.DRAPlugin" {
            prepare_v1(channel, claims).await
        } else {
            prepare_v1beta1(channel, claims).await
        }
    }

    /// Calls `NodeUnprepareResources`; returns one answer per claim UID.
    pub async fn unprepare(
        &self,
        driver: &str,
        claims: &[ClaimId],
    ) -> Result<BTreeMap<String, Result<(), String>>, Status> {
        let d = self.driver(driver)?;
        let channel = connect(Path::new(&d.endpoint), &self.dialing.dra).await?;
        if d.chosen == "v1.DRAPlugin" {
            unprepare_v1(channel, claims).await
        } else {
            unprepare_v1beta1(channel, claims).await
        }
    }
}

/// A claim's error in an answer: none when empty.
fn error_of(err: String) -> Option<String> {
    if err.is_empty() { None } else { Some(err) }
}

/// A claim's unprepare answer: the error, unless empty.
fn unprepare_result(e: String) -> Result<(), String> {
    if e.is_empty() { Ok(()) } else { Err(e) }
}

/// `NodePrepareResources` of `v1.DRAPlugin`.
async fn prepare_v1(
    channel: Channel,
    claims: &[ClaimId],
) -> Result<BTreeMap<String, PrepareAnswer>, Status> {
    let mut c = dra::v1::dra_plugin_client::DraPluginClient::new(channel);
    let req = dra::v1::NodePrepareResourcesRequest {
        claims: claims
            .iter()
            .map(|c| dra::v1::Claim {
                namespace: c.namespace.clone(),
                uid: c.uid.clone(),
                name: c.name.clone(),
            })
            .collect(),
    };
    let resp = c.node_prepare_resources(req).await?.into_inner();
    Ok(resp
        .claims
        .into_iter()
        .map(|(uid, r)| {
            let v = match error_of(r.error) {
                Some(e) => Err(e),
                None => Ok(r
                    .devices
                    .into_iter()
                    .map(|d| PreparedDeviceAnswer {
                        request_names: d.request_names,
                        pool: d.pool_name,
                        device: d.device_name,
                        cdi_device_ids: d.cdi_device_ids,
                        share_id: d.share_id,
                    })
                    .collect()),
            };
            (uid, v)
        })
        .collect())
}

/// `NodePrepareResources` of `v1beta1.DRAPlugin` (no share IDs).
async fn prepare_v1beta1(
    channel: Channel,
    claims: &[ClaimId],
) -> Result<BTreeMap<String, PrepareAnswer>, Status> {
    let mut c = dra::v1beta1::dra_plugin_client::DraPluginClient::new(channel);
    let req = dra::v1beta1::NodePrepareResourcesRequest {
        claims: claims
            .iter()
            .map(|c| dra::v1beta1::Claim {
                namespace: c.namespace.clone(),
                uid: c.uid.clone(),
                name: c.name.clone(),
            })
            .collect(),
    };
    let resp = c.node_prepare_resources(req).await?.into_inner();
    Ok(resp
        .claims
        .into_iter()
        .map(|(uid, r)| {
            let v = match error_of(r.error) {
                Some(e) => Err(e),
                None => Ok(r
                    .devices
                    .into_iter()
                    .map(|d| PreparedDeviceAnswer {
                        request_names: d.request_names,
                        pool: d.pool_name,
                        device: d.device_name,
                        cdi_device_ids: d.cdi_device_ids,
                        share_id: None,
                    })
                    .collect()),
            };
            (uid, v)
        })
        .collect())
}

/// `NodeUnprepareResources` of `v1.DRAPlugin`.
async fn unprepare_v1(
    channel: Channel,
    claims: &[ClaimId],
) -> Result<BTreeMap<String, Result<(), String>>, Status> {
    let mut c = dra::v1::dra_plugin_client::DraPluginClient::new(channel);
    let req = dra::v1::NodeUnprepareResourcesRequest {
        claims: claims
            .iter()
            .map(|c| dra::v1::Claim {
                namespace: c.namespace.clone(),
                uid: c.uid.clone(),
                name: c.name.clone(),
            })
            .collect(),
    };
    let resp = c.node_unprepare_resources(req).await?.into_inner();
    Ok(resp
        .claims
        .into_iter()
        .map(|(u, r)| (u, unprepare_result(r.error)))
        .collect())
}

/// `NodeUnprepareResources` of `v1beta1.DRAPlugin`.
async fn unprepare_v1beta1(
    channel: Channel,
    claims: &[ClaimId],
) -> Result<BTreeMap<String, Result<(), String>>, Status> {
    let mut c = dra::v1beta1::dra_plugin_client::DraPluginClient::new(channel);
    let req = dra::v1beta1::NodeUnprepareResourcesRequest {
        claims: claims
            .iter()
            .map(|c| dra::v1beta1::Claim {
                namespace: c.namespace.clone(),
                uid: c.uid.clone(),
                name: c.name.clone(),
            })
            .collect(),
    };
    let resp = c.node_unprepare_resources(req).await?.into_inner();
    Ok(resp
        .claims
        .into_iter()
        .map(|(u, r)| (u, unprepare_result(r.error)))
        .collect())
}
