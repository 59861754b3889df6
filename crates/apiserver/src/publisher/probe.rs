//! Learning what the API server keeps: its version, and with dry-run ResourceSlices that
//! store nothing, which feature-gated fields it drops or refuses.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::api::PostParams;
use tokio::time::Instant;
use tracing::{debug, error, info, warn};

use super::worker::Worker;
use crate::error::Error;
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
    let one_probe_counter = || {
        BTreeMap::from([(
            "probe".to_owned(),
            res::Counter {
                value: Quantity("1".into()),
            },
        )])
    };
    let counter_set = res::CounterSet {
        name: "probe".into(),
        counters: one_probe_counter(),
    };
    let devices = vec![
        res::Device {
            name: "counters".into(),
            consumes_counters: Some(vec![res::DeviceCounterConsumption {
                counter_set: "probe".into(),
                counters: one_probe_counter(),
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

/// What the dry-run probes found: the gated features whose fields the server does not keep,
/// each with why kubedev thinks so.
#[derive(Default)]
struct Findings {
    unavailable: BTreeSet<ApiFeature>,
    found: BTreeMap<ApiFeature, String>,
}

/// Whether to send the next probe.
enum NextProbe {
    Send,
    /// The answer says no probe can tell more.
    Stop,
}

impl Findings {
    /// Records that the server does not keep `feature`'s fields, and why.
    fn unavailable(&mut self, feature: ApiFeature, why: String) {
        self.unavailable.insert(feature);
        self.found.insert(feature, why);
    }

    /// Reads what the server answered to the dry-run create of `probe`.
    fn read_answer(
        &mut self,
        version: &ServerVersion,
        probe: &ResourceSlice,
        answer: Result<ResourceSlice, kube::Error>,
    ) -> Result<NextProbe, Error> {
        match answer {
            Ok(stored) => {
                for f in dropped_from_slice(&probe.spec, &stored.spec) {
                    self.unavailable(
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
                    self.unavailable(
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
                        self.unavailable(
                            f,
                            format!(
                                "the API server ({version}) refused a dry run ({why}), and \
                                 {} is off by default in {version}",
                                f.gate()
                            ),
                        );
                    }
                }
                return Ok(NextProbe::Stop);
            }
            Err(e) => {
                return Err(Error::Slice {
                    operation: "dry-run creating",
                    slice: probe.metadata.generate_name.clone().unwrap_or_default(),
                    error: Box::new(e),
                });
            }
        }
        Ok(NextProbe::Send)
    }
}

impl Worker {
    /// Asks the API server its version and, with dry-run creates that store nothing, which
    /// gated fields it keeps; derives the slices again if that changed what can be written.
    pub(super) async fn learn_api(&mut self) -> Result<(), Error> {
        let version = self.server_version().await?;
        let layout = version.counter_layout();
        self.probed = Some(Instant::now());
        let findings = self.probe_gated_fields(&version, layout).await?;
        self.record_learned(version, layout, findings);
        Ok(())
    }

    /// The API server's version; one older than kubedev supports is logged as an error.
    async fn server_version(&mut self) -> Result<ServerVersion, Error> {
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
        Ok(version)
    }

    /// Dry-run creates the probe slices of `layout` and reads what the server kept.
    async fn probe_gated_fields(
        &mut self,
        version: &ServerVersion,
        layout: CounterLayout,
    ) -> Result<Findings, Error> {
        let mut findings = Findings::default();
        for probe in probe_slices(&self.id, layout) {
            self.limiter.acquire().await;
            let params = PostParams {
                dry_run: true,
                field_manager: None,
            };
            let answer = self.slices.create(&params, &probe).await;
            if let NextProbe::Stop = findings.read_answer(version, &probe, answer)? {
                break;
            }
        }
        Ok(findings)
    }

    /// Hands what was learned to the shared API status (which derives the slices again when
    /// it changed what can be written) and logs it.
    fn record_learned(&self, version: ServerVersion, layout: CounterLayout, findings: Findings) {
        let Findings { unavailable, found } = findings;
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
    }
}
