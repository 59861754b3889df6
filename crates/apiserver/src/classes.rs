//! DeviceClasses a driver publishes itself: one per kind of device it offers, optionally with an
//! `extendedResourceName` (KEP-5004) so pods that still request an extended resource such as
//! `nvidia.com/gpu` are satisfied from DRA devices.

use k8s_openapi::api::resource::v1 as res;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, Patch, PatchParams};

use std::collections::BTreeMap;

use crate::error::Error;
use crate::features::{ApiFeature, ApiStatus, dropped_from_class};

/// The field manager of kubedev's server-side applies.
pub const FIELD_MANAGER: &str = "kubedev";

/// One DeviceClass to publish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceClassSpec {
    /// The class name (a DNS subdomain).
    pub name: String,
    /// CEL selectors; a device must satisfy all of them.
    pub selectors: Vec<String>,
    /// The extended resource name pods may request to get a device of this class.
    pub extended_resource_name: Option<String>,
}

impl DeviceClassSpec {
    /// The DeviceClass object.
    pub fn object(&self) -> res::DeviceClass {
        res::DeviceClass {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                labels: Some(
                    [(
                        "app.kubernetes.io/managed-by".to_string(),
                        "kubedev".to_string(),
                    )]
                    .into(),
                ),
                ..Default::default()
            },
            spec: Some(res::DeviceClassSpec {
                selectors: Some(
                    self.selectors
                        .iter()
                        .map(|e| res::DeviceSelector {
                            cel: Some(res::CELDeviceSelector {
                                expression: e.clone(),
                            }),
                        })
                        .collect(),
                ),
                extended_resource_name: self.extended_resource_name.clone(),
                ..Default::default()
            }),
        }
    }
}

/// A class the API server stored without a gated field kubedev sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClassFieldDropped {
    /// The class.
    pub class: String,
    /// The feature whose field was dropped.
    pub feature: ApiFeature,
}

/// Creates or updates each class by server-side apply, so every node's daemon can apply the same
/// classes without conflict, and compares what the server stored with what was sent. Stops at
/// the first failure, naming the class; returns the gated fields the server dropped.
pub async fn apply_device_classes(
    client: kube::Client,
    classes: &[DeviceClassSpec],
) -> Result<Vec<ClassFieldDropped>, Error> {
    let api: Api<res::DeviceClass> = Api::all(client);
    let mut dropped = Vec::new();
    for c in classes {
        let params = PatchParams::apply(FIELD_MANAGER).force();
        let sent = c.object();
        let stored = api
            .patch(&c.name, &params, &Patch::Apply(&sent))
            .await
            .map_err(|e| Error::DeviceClass {
                class: c.name.clone(),
                error: Box::new(e),
            })?;
        dropped.extend(
            dropped_from_class(&sent, &stored)
                .into_iter()
                .map(|feature| ClassFieldDropped {
                    class: c.name.clone(),
                    feature,
                }),
        );
    }
    Ok(dropped)
}

/// Applies `classes`, trying again every `retry` until it succeeds (the API server may be
/// unreachable, or the RBAC rule missing, when the daemon starts); each failure is logged. A
/// field the server dropped (`extendedResourceName` where `DRAExtendedResource` is off) is
/// recorded in `api`, which the daemon reports; the classes stay applied without it.
pub async fn apply_device_classes_until_done(
    client: kube::Client,
    classes: Vec<DeviceClassSpec>,
    retry: std::time::Duration,
    api: ApiStatus,
) {
    loop {
        match apply_device_classes(client.clone(), &classes).await {
            Ok(dropped) if dropped.is_empty() => {
                tracing::info!(classes = classes.len(), "DeviceClasses applied");
                api.set_class_actions(BTreeMap::new());
                return;
            }
            Ok(dropped) => {
                let mut by_feature: BTreeMap<ApiFeature, Vec<&str>> = BTreeMap::new();
                for d in &dropped {
                    by_feature.entry(d.feature).or_default().push(&d.class);
                }
                let found = by_feature
                    .into_iter()
                    .map(|(feature, names)| {
                        let how = format!(
                            "the API server dropped {} from DeviceClass {} (feature gate {} is \
                             off)",
                            feature.fields(),
                            names.join(", "),
                            feature.gate()
                        );
                        let what = format!(
                            "DeviceClass {} applied without it: pods asking for its extended \
                             resource are not given these devices; only ResourceClaims reach them",
                            names.join(", ")
                        );
                        (feature, (how, what))
                    })
                    .collect();
                tracing::warn!(
                    classes = classes.len(),
                    "DeviceClasses applied, but the API server dropped fields of some (see the \
                     API feature report)"
                );
                api.set_class_actions(found);
                return;
            }
            Err(e) => {
                tracing::error!(error = %kubedev_core::echo::Chain(&e), retry = ?retry, "applying DeviceClasses failed")
            }
        }
        tokio::time::sleep(retry).await;
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_object_carries_selectors_and_the_extended_resource_name() {
        let c = DeviceClassSpec {
            name: "gpu.example.com".into(),
            selectors: vec!["device.driver == \"gpu.example.com\"".into()],
            extended_resource_name: Some("example.com/gpu".into()),
        };
        let v = serde_json::to_value(c.object()).unwrap();
        assert_eq!(v["kind"], "DeviceClass");
        assert_eq!(v["spec"]["extendedResourceName"], "example.com/gpu");
        assert_eq!(
            v["spec"]["selectors"][0]["cel"]["expression"],
            "device.driver == \"gpu.example.com\""
        );
    }
}
