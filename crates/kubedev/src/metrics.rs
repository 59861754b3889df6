//! The daemon's Prometheus metrics.

use parking_lot::RwLock;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Labels of a prepare or unprepare.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OperationLabels {
    /// `prepare` or `unprepare`.
    pub operation: String,
}

/// Labels of a failed prepare or unprepare.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    /// `prepare` or `unprepare`.
    pub operation: String,
    /// A short reason, e.g. `backend`, `cdi`, `checkpoint`, `claim_lookup`.
    pub reason: String,
    /// `retryable` (the kubelet's next call may succeed) or `permanent` (only a change to the
    /// claim or the configuration helps).
    pub retry: String,
}

/// Labels of a device count.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DeviceLabels {
    /// `device-plugin` or `dra`.
    pub api: String,
    /// The extended resource name, or the DRA driver.
    pub resource: String,
    /// The pool.
    pub pool: String,
    /// `Healthy`, `Unhealthy` or `Unknown`.
    pub health: String,
}

/// Labels of a registration with the kubelet.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RegistrationLabels {
    /// `device-plugin` or `dra`.
    pub api: String,
    /// The extended resource name, or the DRA driver.
    pub resource: String,
}

/// Labels of a request the kubelet sent to one of the daemon's sockets.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KubeletRequestLabels {
    /// The gRPC method, `/<package>.<Service>/<Method>` (`other` for a service the daemon
    /// does not serve).
    pub method: String,
    /// Which client's `:authority` it carried: `localhost`, `escaped-socket-path`,
    /// `socket-path`, `empty`, `none` or `other`.
    pub authority: String,
}

/// The services whose methods `kubelet_requests` names; any other becomes `other`.
const KNOWN_SERVICES: [&str; 6] = [
    "pluginregistration.Registration",
    "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin",
    "k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin",
    "v1.DRAResourceHealth",
    "v1alpha1.DRAResourceHealth",
    "v1beta1.DevicePlugin",
];

/// `method` as a label: as it is for a known service and a plausible method name, else
/// `other` (a client choosing paths must not grow the series).
fn method_label(method: &str) -> String {
    let known = method
        .strip_prefix('/')
        .and_then(|m| m.split_once('/'))
        .is_some_and(|(service, name)| {
            KNOWN_SERVICES.contains(&service)
                && (1..=48).contains(&name.len())
                && name.bytes().all(|b| b.is_ascii_alphabetic())
        });
    if known {
        method.to_string()
    } else {
        "other".to_string()
    }
}

/// Labels of an outcome.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    /// `ok` or `error`.
    pub result: String,
}

/// Labels of what start-up recovery did.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RecoveryLabels {
    /// `checkpoint_lost` (once per lost checkpoint), `rebuilt`, `rebuild_failed`,
    /// `kept_unverified`, `cdi_repaired`, `cdi_removed`, `rolled_back` (per claim or file).
    pub outcome: String,
}

/// Labels of a gated Kubernetes API feature.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FeatureLabels {
    /// The feature gate, e.g. `DRAPartitionableDevices`.
    pub feature: String,
}

/// Labels of a selection-policy call.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PolicyLabels {
    /// The extended resource whose `GetPreferredAllocation` called it.
    pub resource: String,
    /// `ok`, or `error` when the policy failed and the default order was used.
    pub result: String,
}

/// Labels of a device held by a container.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HolderLabels {
    /// `device-plugin` or `dra`.
    pub api: String,
    /// The extended resource name, or the DRA driver.
    pub resource: String,
    /// The device (a device-plugin ID, or `pool/device` for DRA).
    pub device: String,
    /// The pod's namespace.
    pub namespace: String,
    /// The pod.
    pub pod: String,
    /// The container.
    pub container: String,
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

fn duration_histogram() -> Histogram {
    // 1 ms … ~16 s.
    Histogram::new(exponential_buckets(0.001, 2.0, 15))
}

/// Every metric the daemon exports, registered in one registry.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    /// Time taken by DRA prepare and unprepare calls, per claim.
    pub operation_seconds: HistogramFamily<OperationLabels>,
    /// Failed DRA prepare and unprepare calls by reason.
    pub operation_errors: Family<ErrorLabels, Counter>,
    /// Devices served, by API, resource, pool and health.
    pub devices: Family<DeviceLabels, Gauge>,
    /// Registrations accepted by the kubelet (first ones and re-registrations).
    pub registrations: Family<RegistrationLabels, Counter>,
    /// 1 while the kubelet holds a registration of the server, 0 while it does not.
    pub registered: Family<RegistrationLabels, Gauge>,
    /// ResourceSlice publish operations by outcome.
    pub slice_publishes: Family<ResultLabels, Counter>,
    /// Selection-policy calls by resource and outcome.
    pub policy_calls: Family<PolicyLabels, Counter>,
    /// Devices held by containers (1 per held device), from the kubelet's pod resources API.
    pub held_devices: Family<HolderLabels, Gauge>,
    /// Configuration reloads by outcome (`applied`, `rejected`).
    pub config_reloads: Family<ResultLabels, Counter>,
    /// Fuel a selection policy used per call, by resource.
    pub policy_fuel: HistogramFamily<ResourceLabels>,
    /// ResourceSlice writes to the API server, by operation (read from the publisher).
    pub slice_writes: Family<OperationLabels, Counter>,
    /// What start-up recovery found and did, by outcome.
    pub recovery: Family<RecoveryLabels, Counter>,
    /// 1 for each gated API feature kubedev needs and the API server drops.
    pub api_feature_unavailable: Family<FeatureLabels, Gauge>,
    /// Requests the kubelet sent to the daemon's sockets, by method and `:authority`.
    pub kubelet_requests: Family<KubeletRequestLabels, Counter>,
    slice_writer: SliceWriter,
    /// Every registered family's metadata, written even while the family has no series.
    families: Vec<FamilyDescriptor>,
}

/// A registered family's `# HELP`, `# TYPE` and `# UNIT` lines.
#[derive(Debug)]
struct FamilyDescriptor {
    /// The full name, prefix and unit included.
    name: String,
    help: String,
    kind: &'static str,
    unit: Option<String>,
}

/// Registers `metric` under `name` (with `unit`) and records its descriptor in `families`.
fn register<M: prometheus_client::registry::Metric + prometheus_client::metrics::TypedMetric>(
    registry: &mut Registry,
    families: &mut Vec<FamilyDescriptor>,
    name: &str,
    help: &str,
    unit: Option<prometheus_client::registry::Unit>,
    metric: M,
) {
    use prometheus_client::metrics::MetricType as T;
    let unit_name = unit.as_ref().map(|u| u.as_str().to_string());
    let full = match &unit_name {
        Some(u) => format!("kubedev_{name}_{u}"),
        None => format!("kubedev_{name}"),
    };
    families.push(FamilyDescriptor {
        name: full,
        help: help.to_string(),
        kind: match M::TYPE {
            T::Counter => "counter",
            T::Gauge => "gauge",
            T::Histogram => "histogram",
            T::Info => "info",
            T::Unknown => "unknown",
        },
        unit: unit_name,
    });
    match unit {
        Some(u) => registry.register_with_unit(name, help, u, metric),
        None => registry.register(name, help, metric),
    }
}

/// The registry being filled and the descriptors of what it holds.
struct Registrar {
    registry: Registry,
    families: Vec<FamilyDescriptor>,
}

impl Registrar {
    fn new() -> Registrar {
        Registrar {
            registry: Registry::with_prefix("kubedev"),
            families: Vec::new(),
        }
    }

    /// Registers `metric` as `kubedev_<name>` and returns it.
    fn add<M>(&mut self, name: &str, help: &str, metric: M) -> M
    where
        M: prometheus_client::registry::Metric + prometheus_client::metrics::TypedMetric + Clone,
    {
        register(
            &mut self.registry,
            &mut self.families,
            name,
            help,
            None,
            metric.clone(),
        );
        metric
    }

    /// Registers `metric` as `kubedev_<name>_seconds` and returns it.
    fn add_seconds<M>(&mut self, name: &str, help: &str, metric: M) -> M
    where
        M: prometheus_client::registry::Metric + prometheus_client::metrics::TypedMetric + Clone,
    {
        let unit = Some(prometheus_client::registry::Unit::Seconds);
        register(
            &mut self.registry,
            &mut self.families,
            name,
            help,
            unit,
            metric.clone(),
        );
        metric
    }
}

/// The publisher `resourceslice_writes` is read from.
#[derive(Default)]
struct SliceWriter(RwLock<Option<Arc<dyn kubedev_core::Publisher>>>);

impl std::fmt::Debug for SliceWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SliceWriter")
    }
}

/// Labels of a per-resource measurement.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResourceLabels {
    /// The extended resource.
    pub resource: String,
}

fn fuel_histogram() -> Histogram {
    // 1 k … ~16 M units (the default budget is 10 M).
    Histogram::new(exponential_buckets(1000.0, 4.0, 13))
}

impl Metrics {
    /// A fresh set of metrics, all at zero.
    pub fn new() -> Arc<Self> {
        let mut r = Registrar::new();
        let api_feature_unavailable = r.add(
            "api_feature_unavailable",
            "1 for each gated resource.k8s.io feature the published devices need and the API \
             server drops (its feature gate is off); kubedev then publishes a safe subset",
            Family::<FeatureLabels, Gauge>::default(),
        );
        let recovery = r.add(
            "dra_recovery",
            "What DRA start-up recovery did: lost checkpoints, and claims rebuilt from the API \
             server, failed to rebuild or kept unverified, CDI specs repaired or removed, \
             prepares rolled back",
            Family::<RecoveryLabels, Counter>::default(),
        );
        let slice_writes = r.add(
            "resourceslice_writes",
            "ResourceSlice writes to the API server, by operation (create, update, delete; \
             conflict and failure count refused and failed attempts, which are retried)",
            Family::<OperationLabels, Counter>::default(),
        );
        let policy_fuel = r.add(
            "policy_fuel",
            "Fuel a selection policy used per call (its budget is the sandbox's fuel limit)",
            HistogramFamily::<ResourceLabels>::new_with_constructor(
                fuel_histogram as fn() -> Histogram,
            ),
        );
        let config_reloads = r.add(
            "config_reloads",
            "Configuration file changes, applied or rejected",
            Family::<ResultLabels, Counter>::default(),
        );
        let operation_seconds = r.add_seconds(
            "dra_operation_duration",
            "Time taken by DRA prepare and unprepare of one claim",
            HistogramFamily::<OperationLabels>::new_with_constructor(
                duration_histogram as fn() -> Histogram,
            ),
        );
        let operation_errors = r.add(
            "dra_operation_errors",
            "Failed DRA prepare and unprepare calls, by reason",
            Family::<ErrorLabels, Counter>::default(),
        );
        let devices = r.add(
            "devices",
            "Devices served, by API, resource, pool and health",
            Family::<DeviceLabels, Gauge>::default(),
        );
        let registrations = r.add(
            "kubelet_registrations",
            "Registrations the kubelet accepted, first ones and re-registrations",
            Family::<RegistrationLabels, Counter>::default(),
        );
        let registered = r.add(
            "kubelet_registered",
            "1 while the kubelet holds the server's registration, 0 before the first one and \
             after the kubelet dropped it",
            Family::<RegistrationLabels, Gauge>::default(),
        );
        let slice_publishes = r.add(
            "resourceslice_publishes",
            "ResourceSlice publish operations, by outcome",
            Family::<ResultLabels, Counter>::default(),
        );
        let policy_calls = r.add(
            "policy_calls",
            "Selection-policy calls from GetPreferredAllocation, by outcome",
            Family::<PolicyLabels, Counter>::default(),
        );
        let kubelet_requests = r.add(
            "kubelet_requests",
            "Requests the kubelet (or another client) sent to the daemon's registration, DRA \
             and device-plugin sockets, by gRPC method and the kind of :authority it sent",
            Family::<KubeletRequestLabels, Counter>::default(),
        );
        let held_devices = r.add(
            "device_held",
            "1 for each device a container holds, with pod, namespace and container",
            Family::<HolderLabels, Gauge>::default(),
        );
        Arc::new(Metrics {
            registry: r.registry,
            recovery,
            api_feature_unavailable,
            operation_seconds,
            operation_errors,
            devices,
            registrations,
            registered,
            slice_publishes,
            policy_calls,
            held_devices,
            kubelet_requests,
            config_reloads,
            policy_fuel,
            slice_writes,
            slice_writer: SliceWriter::default(),
            families: r.families,
        })
    }

    /// The ResourceSlice publisher whose API writes `resourceslice_writes` reports.
    pub fn track_slice_writes(&self, publisher: Arc<dyn kubedev_core::Publisher>) {
        *self.slice_writer.0.write() = Some(publisher);
    }

    /// Brings `resourceslice_writes` up to the publisher's own counts.
    fn sync_slice_writes(&self) {
        let publisher = self.slice_writer.0.read().clone();
        let Some(publisher) = publisher else { return };
        let c = publisher.write_counts();
        for (operation, n) in [
            ("create", c.creates),
            ("update", c.updates),
            ("delete", c.deletes),
            ("conflict", c.conflicts),
            ("failure", c.failures),
        ] {
            let counter = self.slice_writes.get_or_create(&OperationLabels {
                operation: operation.to_string(),
            });
            counter.inc_by(n.saturating_sub(counter.get()));
        }
    }

    /// An observer for the daemon's sockets that counts each request in `kubelet_requests`.
    pub fn request_observer(self: &Arc<Self>) -> kubedev_kubelet_grpc::authority::RequestObserver {
        let metrics = Arc::downgrade(self);
        kubedev_kubelet_grpc::authority::RequestObserver::new(move |seen| {
            if let Some(m) = metrics.upgrade() {
                m.kubelet_requests
                    .get_or_create(&KubeletRequestLabels {
                        method: method_label(seen.method),
                        authority: seen.authority_kind().to_string(),
                    })
                    .inc();
            }
        })
    }

    /// Counts one configuration reload with its outcome.
    pub fn reload(&self, result: &str) {
        self.config_reloads
            .get_or_create(&ResultLabels {
                result: result.to_string(),
            })
            .inc();
    }

    /// Records one prepare or unprepare.
    /// `error` is the failure's reason and whether it is retryable.
    pub fn observe_operation(
        &self,
        operation: &str,
        took: Duration,
        error: Option<(&str, kubedev_kubelet_grpc::dra::Retry)>,
    ) {
        self.operation_seconds
            .get_or_create(&OperationLabels {
                operation: operation.to_string(),
            })
            .observe(took.as_secs_f64());
        if let Some((reason, retry)) = error {
            self.operation_errors
                .get_or_create(&ErrorLabels {
                    operation: operation.to_string(),
                    reason: reason.to_string(),
                    retry: retry.as_str().to_string(),
                })
                .inc();
        }
    }

    /// The metrics in the OpenMetrics text format.
    pub fn encode(&self) -> String {
        self.sync_slice_writes();
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        // The registry leaves out families with no series; their metadata still says what the
        // daemon exports.
        let mut empty = String::new();
        for f in &self.families {
            if !out.contains(&format!("# TYPE {} ", f.name)) {
                empty.push_str(&format!("# HELP {} {}.\n", f.name, f.help));
                empty.push_str(&format!("# TYPE {} {}\n", f.name, f.kind));
                if let Some(unit) = &f.unit {
                    empty.push_str(&format!("# UNIT {} {unit}\n", f.name));
                }
            }
        }
        match out.strip_suffix("# EOF\n") {
            Some(body) => format!("{body}{empty}# EOF\n"),
            None => out + &empty,
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    struct Writes(parking_lot::Mutex<kubedev_core::WriteCounts>);

    #[async_trait::async_trait]
    impl kubedev_core::Publisher for Writes {
        async fn publish(
            &self,
            _: &kubedev_core::Inventory,
        ) -> Result<(), kubedev_core::PublishError> {
            Ok(())
        }
        fn write_counts(&self) -> kubedev_core::WriteCounts {
            *self.0.lock()
        }
    }

    #[test]
    fn request_methods_of_unknown_services_or_odd_names_share_one_series() {
        for (method, label) in [
            (
                "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources",
                "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources",
            ),
            (
                "/pluginregistration.Registration/GetInfo",
                "/pluginregistration.Registration/GetInfo",
            ),
            ("/grpc.health.v1.Health/Check", "other"),
            ("/v1.DRAPlugin/NodePrepareResources", "other"),
            ("/v1beta1.DevicePlugin/Allocate%20x", "other"),
            ("/v1beta1.DevicePlugin/", "other"),
            ("", "other"),
        ] {
            assert_eq!(method_label(method), label, "{method}");
        }
    }

    #[test]
    fn slice_writes_follow_the_publishers_counts() {
        let m = Metrics::new();
        assert!(!m.encode().contains("kubedev_resourceslice_writes_total{"));
        let p = Arc::new(Writes(parking_lot::Mutex::new(
            kubedev_core::WriteCounts::new(3, 1, 0, 2, 0),
        )));
        m.track_slice_writes(p.clone());
        let text = m.encode();
        for want in [
            "kubedev_resourceslice_writes_total{operation=\"create\"} 3",
            "kubedev_resourceslice_writes_total{operation=\"update\"} 1",
            "kubedev_resourceslice_writes_total{operation=\"conflict\"} 2",
        ] {
            assert!(text.contains(want), "missing {want} in\n{text}");
        }
        *p.0.lock() = kubedev_core::WriteCounts::new(5, 1, 4, 2, 1);
        let text = m.encode();
        for want in [
            "kubedev_resourceslice_writes_total{operation=\"create\"} 5",
            "kubedev_resourceslice_writes_total{operation=\"delete\"} 4",
            "kubedev_resourceslice_writes_total{operation=\"failure\"} 1",
        ] {
            assert!(text.contains(want), "missing {want} in\n{text}");
        }
    }

    #[test]
    fn families_without_series_are_described() {
        let text = Metrics::new().encode();
        for want in [
            "# TYPE kubedev_dra_recovery counter\n",
            "# TYPE kubedev_devices gauge\n",
            "# TYPE kubedev_kubelet_registered gauge\n",
            "# TYPE kubedev_dra_operation_duration_seconds histogram\n",
            "# UNIT kubedev_dra_operation_duration_seconds seconds\n",
            "# TYPE kubedev_policy_fuel histogram\n",
        ] {
            assert!(text.contains(want), "missing {want:?} in\n{text}");
        }
        assert_eq!(text.matches("# TYPE ").count(), 14, "{text}");
        assert!(text.ends_with("# EOF\n"), "{text}");
        // A family with series is described once.
        let m = Metrics::new();
        m.reload("applied");
        let text = m.encode();
        assert_eq!(
            text.matches("# TYPE kubedev_config_reloads ").count(),
            1,
            "{text}"
        );
        assert!(text.ends_with("# EOF\n"), "{text}");
    }

    #[test]
    fn encodes_what_was_recorded() {
        let m = Metrics::new();
        m.observe_operation("prepare", Duration::from_millis(3), None);
        m.observe_operation(
            "prepare",
            Duration::from_millis(5),
            Some(("backend", kubedev_kubelet_grpc::dra::Retry::Permanent)),
        );
        m.devices
            .get_or_create(&DeviceLabels {
                api: "dra".into(),
                resource: "gpu.example.com".into(),
                pool: "node-a".into(),
                health: "Healthy".into(),
            })
            .set(4);
        let text = m.encode();
        assert!(
            text.contains("kubedev_dra_operation_duration_seconds_count{operation=\"prepare\"} 2"),
            "{text}"
        );
        assert!(
            text.contains(
                "kubedev_dra_operation_errors_total{operation=\"prepare\",reason=\"backend\",retry=\"permanent\"} 1"
            ),
            "{text}"
        );
        assert!(
            text.contains("kubedev_devices{api=\"dra\",resource=\"gpu.example.com\",pool=\"node-a\",health=\"Healthy\"} 4"),
            "{text}"
        );
        m.policy_fuel
            .get_or_create(&ResourceLabels {
                resource: "example.com/gpu".into(),
            })
            .observe(26_000.0);
        let text = m.encode();
        assert!(
            text.contains("kubedev_policy_fuel_count{resource=\"example.com/gpu\"} 1"),
            "{text}"
        );
        assert!(text.ends_with("# EOF\n"), "{text}");
    }
}
