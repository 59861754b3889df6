//! Learning what the API server keeps: its version, and with dry-run ResourceSlices that
//! store nothing, which feature-gated fields it drops or refuses.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::api::PostParams;
use tokio::time::Instant;
use tracing::{debug, error, info, warn};

use super::worker::Worker;
use crate::Error;
use crate::error::api_code;
use crate::features::{
    ApiCapabilities, ApiFeature, CounterLayout, ServerVersion, dropped_from_slice,
};
use crate::plan::Identity;

/// The pool name of the dry-run probes (never stored).
const PROBE_POOL: &str = "kubedev-api-probe";

/// Dry-run ResourceSlices with one use of every gated field kubedev may write, in `layout`:
/// a counter set and a device consuming it, a tainted device, a device allowing several
/// allocations. What the server answers tells which of them it keeps.
fn probe_slices(id: &Identity, layout: CounterLayout) -> Vec<ResourceSlice> {
    use k8s_openapi::api::resource::v1 as res;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    let one = || {
        BTreeMap::from([(
            "probe".to_owned(),
            res::Counter {
                value: Quantity("1".into()),
            },
        )])
    };
    let counter_set = res::CounterSet {
        name: "probe".into(),
        counters: one(),
    };
    let devices = vec![
        res::Device {
            name: "counters".into(),
            consumes_counters: Some(vec![res::DeviceCounterConsumption {
                counter_set: "probe".into(),
                counters: one(),
                ..Default::default()
            }]),
            ..Default::default()
        },
        res::Device {
            name: "tainted".into(),
            taints: Some(vec![res::DeviceTaint {
                key: format!("{}/probe", id.driver),
                effect: "NoSchedule".into(),
                ..Default::default()
            }]),
            ..Default::default()
        },
        res::Device {
            name: "shared".into(),
            allow_multiple_allocations: Some(true),
            ..Default::default()
        },
    ];
    let slice =
        |count: i64, devices: Option<Vec<res::Device>>, sets: Option<Vec<res::CounterSet>>| {
            ResourceSlice {
                metadata: ObjectMeta {
                    generate_name: Some("kubedev-api-probe-".into()),
                    ..Default::default()
                },
                spec: res::ResourceSliceSpec {
                    driver: id.driver.clone(),
                    node_name: Some(id.node.clone()),
                    pool: res::ResourcePool {
                        name: PROBE_POOL.into(),
                        generation: 0,
                        resource_slice_count: count,
                    },
                    devices,
                    shared_counters: sets,
                    ..Default::default()
                },
            }
        };
    match layout {
        CounterLayout::SameSlice => vec![slice(1, Some(devices), Some(vec![counter_set]))],
        CounterLayout::SeparateSlices => vec![
            slice(2, None, Some(vec![counter_set])),
            slice(2, Some(devices), None),
        ],
    }
}

impl Worker {
    /// Asks the API server its version and, with dry-run creates that store nothing, which
    /// gated fields it keeps; derives the slices again if that changed what can be written.
    pub(super) async fn learn_api(&mut self) -> Result<(), Error> {
        self.limiter.acquire().await;
        let info = self
            .shared
            .client
            .apiserver_version()
            .await
            .map_err(|e| Error::Version {
                message: crate::error::brief(&e),
            })?;
        let version =
            ServerVersion::from_info(&info).map_err(|message| Error::Version { message })?;
        if !version.supported() {
            error!(
                version = %version,
                git_version = %version.git_version,
                "the API server is older than Kubernetes 1.34, the first release with \
                 resource.k8s.io/v1, which kubedev writes"
            );
        }
        let layout = version.counter_layout();
        self.probed = Some(Instant::now());
        let mut unavailable = std::collections::BTreeSet::new();
        let mut found = BTreeMap::new();
        for probe in probe_slices(&self.id, layout) {
            self.limiter.acquire().await;
            let params = PostParams {
                dry_run: true,
                field_manager: None,
            };
            match self.slices.create(&params, &probe).await {
                Ok(stored) => {
                    for f in dropped_from_slice(&probe.spec, &stored.spec) {
                        unavailable.insert(f);
                        found.insert(
                            f,
                            format!(
                                "the API server ({version}) drops {} from ResourceSlices \
                                 (feature gate {} is off)",
                                f.fields(),
                                f.gate()
                            ),
                        );
                    }
                }
                Err(e) if api_code(&e) == Some(422) => {
                    // A server that refuses what its release should accept: write only what
                    // needs no feature gate, and say why.
                    let why = crate::error::brief(&e);
                    warn!(version = %version, error = %why, "the API server refused kubedev's dry-run ResourceSlice; publishing without gated fields");
                    for f in ApiFeature::IN_SLICES {
                        unavailable.insert(f);
                        found.insert(
                            f,
                            format!(
                                "the API server ({version}) refused a dry-run ResourceSlice \
                                 using {}: {why}",
                                f.fields()
                            ),
                        );
                    }
                }
                Err(e) if matches!(api_code(&e), Some(400 | 403 | 404 | 405)) => {
                    // Something in front of the server refuses dry runs (an admission webhook
                    // without dry-run support, a policy): assume the release's default gates
                    // and let the comparison of every write correct it.
                    let why = crate::error::brief(&e);
                    warn!(version = %version, error = %why, "the API server refused kubedev's dry-run ResourceSlice; assuming the release's default feature gates");
                    if version.slice_gates_off_by_default() {
                        for f in ApiFeature::IN_SLICES {
                            unavailable.insert(f);
                            found.insert(
                                f,
                                format!(
                                    "the API server ({version}) refused a dry run ({why}), and \
                                     {} is off by default in {version}",
                                    f.gate()
                                ),
                            );
                        }
                    }
                    break;
                }
                Err(e) => {
                    return Err(Error::Slice {
                        operation: "dry-run creating",
                        slice: probe.metadata.generate_name.clone().unwrap_or_default(),
                        error: Box::new(e),
                    });
                }
            }
        }
        let dropped: Vec<&str> = unavailable.iter().map(|f| f.gate()).collect();
        let known_before = self.shared.api.report().version;
        let changed = self.shared.api.learned(
            version.clone(),
            ApiCapabilities {
                layout,
                unavailable: unavailable.clone(),
            },
            found,
        );
        if changed || known_before.as_ref() != Some(&version) {
            info!(
                version = %version,
                git_version = %version.git_version,
                layout = ?layout,
                ?dropped,
                "learned what the API server keeps of ResourceSlices"
            );
        } else {
            debug!(version = %version, ?dropped, "the API server keeps what it kept");
        }
        Ok(())
    }
}
