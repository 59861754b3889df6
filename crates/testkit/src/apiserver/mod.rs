//! An in-process emulator of the Kubernetes API server for the resources a DRA driver touches:
//! `resource.k8s.io/v1` ResourceSlices, ResourceClaims (with the `status` subresource) and
//! DeviceClasses, and core `v1` Nodes.
//!
//! It listens on `127.0.0.1` over plain HTTP and speaks the REST conventions kube-rs relies on:
//! get, list and watch with resourceVersions (one global counter), label and field selectors,
//! create with `generateName`, update with optimistic concurrency (409 on a stale
//! resourceVersion), merge / JSON / apply patches, delete with preconditions and finalizers,
//! watch streams with bookmarks, `sendInitialEvents` and `410 Expired` for compacted history,
//! and errors as `Status` objects. Objects are validated with the API server's rules and
//! limits (128 devices per slice, 64 when any device has taints or consumes counters, ...),
//! with the offending field named in a 422 `Invalid` answer.
//!
//! # Releases and feature gates
//!
//! The emulator behaves like the API server of one Kubernetes release, chosen with
//! [`ApiServerBuilder::kubernetes`] ([`KubeRelease::V1_34`] to [`KubeRelease::V1_38`]; the
//! newest by default), running with that release's default feature gates, each of which
//! [`ApiServerBuilder::feature_gate`] may override as `--feature-gates` would (an unknown gate,
//! or a change to one locked to its default, makes [`ApiServerBuilder::start`] fail as the
//! API server would refuse to start). The release shows in four places:
//!
//! - **`/version`** reports it: major `1`, minor `34` to `37` (numeric, as 1.33+ servers do),
//!   `gitVersion` `v1.34.0-kubedev-emulator` and so on, with the emulation and
//!   min-compatibility versions.
//! - **Fields of disabled gates are dropped**, as the registry strategies' `dropDisabledFields`
//!   does on create (dry runs included), update, merge / JSON patch and apply, before
//!   validation and without an error: `sharedCounters`, `perDeviceNodeSelection` and the
//!   devices' `consumesCounters`, `nodeName`, `nodeSelector` and `allNodes`
//!   (`DRAPartitionableDevices`); device `taints` (`DRADeviceTaints`); `bindingConditions`,
//!   `bindingFailureConditions` and `bindsToNode` (`DRADeviceBindingConditions` and
//!   `DRAResourceClaimDeviceStatus`); `allowMultipleAllocations` and capacity `requestPolicy`
//!   (`DRAConsumableCapacity`); list attribute values `bools`, `ints`, `strings` and `versions`
//!   (`DRAListTypeAttributes`, 1.36+); a DeviceClass's `extendedResourceName`
//!   (`DRAExtendedResource`). On update a feature's fields are kept when the stored object
//!   already uses that feature anywhere. A ResourceSlice counts a write whose only change was
//!   dropped as a new generation (its strategy compares before dropping); a DeviceClass does
//!   not. By default 1.34 and 1.35 drop all of these, 1.36 and 1.37 only list attributes (see
//!   [`KubeRelease::default_feature_gates`]).
//! - **Fields a release's types lack are unknown**: list attribute values before 1.36. Like
//!   the real decoder, the emulator drops them with a `Warning: 299` header each
//!   (`fieldValidation=Warn`, the default), silently (`Ignore`), or refuses the request with
//!   400 (`Strict`); a server-side apply carrying one fails with 500 `field not declared in
//!   schema`, as upstream does.
//! - **Validation follows the release.** 1.34 keeps counters in the slice of their devices:
//!   every `consumesCounters` entry must name a counter set (and counters) of the same slice's
//!   `sharedCounters`; at most 32 counters over all sets, 32 consumed counters per device and
//!   1024 over all devices; no limit on sets or consumptions; always up to 128 devices; at
//!   most 4 taints per device, with effect `NoSchedule` or `NoExecute`; a slice without devices
//!   reads back with `devices: null`. From 1.35 counters live in slices of their own: only one
//!   of `devices` and `sharedCounters`, at most 8 sets of 32 counters, 2 consumptions of 32
//!   counters per device, no reference checks, 64 devices when any has taints or consumes
//!   counters, 16 taints with effect `None` allowed. From 1.36 list attributes are validated
//!   too (non-empty, at most 48 attribute values per device with list items counted, and any
//!   list lowers the cap to 64 devices). Field paths and messages are the API server's.
//!
//! 1.37 follows upstream's development branch after v1.37.0-beta.0 and may still change.
//!
//! [`ApiServer::restart_as`] plays a restart of the running server as another release or with
//! other feature gates (an upgrade, a downgrade, a gate turned on or off): clients stay
//! connected to the same address, stored objects stay as they are, open watches end, and every
//! later request follows the new release and gates.
//!
//! Tests steer it through the [`ApiServer`] handle: inject failures for the next requests of a
//! verb and resource, end every open watch, add latency, count requests, and read or write the
//! store directly to play another client.
//!
//! Server-side apply is approximated: an apply patch is merged like a JSON merge patch (and
//! creates the object if missing); field ownership and conflicts between managers are not
//! tracked. Strategic merge patches are merged like JSON merge patches too. Lists ignore
//! `limit` and always return everything in one page, which the API contract allows.
//!
//! ```no_run
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! use k8s_openapi::api::resource::v1::ResourceSlice;
//! use kubedev_testkit::apiserver::{ApiServer, Fault, KubeRelease, Resource, Verb, gate};
//!
//! // Kubernetes 1.35 with partitionable devices turned on; `ApiServer::start()` gives the
//! // newest release with its defaults.
//! let server = ApiServer::builder()
//!     .kubernetes(KubeRelease::V1_35)
//!     .feature_gate(gate::DRA_PARTITIONABLE_DEVICES, true)
//!     .start()
//!     .await?;
//! assert_eq!(server.release().minor(), 35);
//! let slices: kube::Api<ResourceSlice> = kube::Api::all(server.client()?);
//! server.fail_next(Verb::Create, Resource::ResourceSlices, 1, Fault::InternalError);
//! // ... drive the code under test with `slices`, then check how it behaved:
//! let creates = server.request_count(Verb::Create, Resource::ResourceSlices);
//! # let _ = (slices, creates);
//! server.shutdown().await;
//! # Ok(())
//! # }
//! ```

mod faults;
mod http;
mod patch;
mod release;
#[cfg(test)]
mod release_tests;
mod resource;
mod selectors;
mod status;
mod store;
mod strategy;
mod validation;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::Value;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub use faults::Fault;
pub use release::{FeatureGates, FeatureStage, KubeRelease, gate};
pub use resource::{Resource, Verb};
pub use validation::{
    ALLOCATION_RESULTS_MAX_SIZE, DEVICE_ATTRIBUTE_MAX_VALUE_LENGTH, DEVICE_MAX_DOMAIN_LENGTH,
    DEVICE_MAX_ID_LENGTH, DEVICE_REQUESTS_MAX_SIZE, DEVICE_SELECTORS_MAX_SIZE,
    DEVICE_TAINTS_MAX_LENGTH, DEVICE_TAINTS_MAX_LENGTH_V1_34, DRIVER_NAME_MAX_LENGTH,
    POOL_NAME_MAX_LENGTH, RESOURCE_CLAIM_RESERVED_FOR_MAX_SIZE,
    RESOURCE_SLICE_MAX_ATTRIBUTE_VALUES_PER_DEVICE,
    RESOURCE_SLICE_MAX_ATTRIBUTES_AND_CAPACITIES_PER_DEVICE, RESOURCE_SLICE_MAX_COUNTER_SETS,
    RESOURCE_SLICE_MAX_COUNTERS_PER_COUNTER_SET,
    RESOURCE_SLICE_MAX_COUNTERS_PER_DEVICE_COUNTER_CONSUMPTION,
    RESOURCE_SLICE_MAX_COUNTERS_PER_DEVICE_V1_34,
    RESOURCE_SLICE_MAX_DEVICE_COUNTER_CONSUMPTIONS_PER_DEVICE,
    RESOURCE_SLICE_MAX_DEVICE_COUNTERS_PER_SLICE_V1_34, RESOURCE_SLICE_MAX_DEVICES,
    RESOURCE_SLICE_MAX_DEVICES_WITH_TAINTS_OR_CONSUMES_COUNTERS,
    RESOURCE_SLICE_MAX_SHARED_COUNTERS_V1_34,
};

use self::http::Shared;
use store::{Key, Store};
use strategy::Strategy;

/// Errors of the emulator's handle.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ApiServerError {
    /// The listening socket could not be opened.
    #[error("cannot listen on 127.0.0.1 for the API-server emulator")]
    Bind(#[source] std::io::Error),
    /// The kubeconfig file could not be written.
    #[error("cannot write the emulator's kubeconfig to {path}")]
    WriteKubeconfig {
        /// Where the file was to go.
        path: PathBuf,
        /// What went wrong.
        #[source]
        source: std::io::Error,
    },
    /// kube-rs refused the client configuration.
    #[error("cannot build a kube client for the emulator at {url}")]
    Client {
        /// The emulator's URL.
        url: String,
        /// What kube-rs reported.
        #[source]
        source: kube::Error,
    },
    /// A direct store write was refused (for example, an object without a name).
    #[error("the emulator refused the object: {message}")]
    Rejected {
        /// Why.
        message: String,
    },
    /// A feature gate override does not fit the release, as the API server would refuse to
    /// start with it: an unknown gate, or a change to a gate locked to its default.
    #[error("Kubernetes {release} refuses the feature gates: {message}")]
    FeatureGate {
        /// The release asked for.
        release: KubeRelease,
        /// What the API server would say.
        message: String,
    },
}

/// Options for starting an emulator; [`ApiServer::start`] uses the defaults: the newest
/// release ([`KubeRelease::NEWEST`]) with its default feature gates.
#[derive(Debug, Clone)]
pub struct ApiServerBuilder {
    event_history: usize,
    bookmark_interval: Duration,
    release: KubeRelease,
    gate_overrides: Vec<(String, bool)>,
}

impl Default for ApiServerBuilder {
    fn default() -> Self {
        Self {
            event_history: 10_000,
            bookmark_interval: Duration::from_secs(1),
            release: KubeRelease::NEWEST,
            gate_overrides: Vec::new(),
        }
    }
}

impl ApiServerBuilder {
    /// The Kubernetes release to behave like: its `/version`, its validation rules and limits,
    /// the fields its types have, and its default feature gates. Default: the newest.
    pub fn kubernetes(mut self, release: KubeRelease) -> Self {
        self.release = release;
        self
    }

    /// Turns a feature gate on or off, overriding the release's default (as
    /// `--feature-gates=NAME=true` would). Overrides apply in order, so the last one for a gate
    /// wins. [`start`](Self::start) fails with [`ApiServerError::FeatureGate`] for a gate the
    /// release does not have (or the emulator does not model; see [`gate`]) and for a change
    /// to a gate locked to its default.
    pub fn feature_gate(mut self, name: impl Into<String>, enabled: bool) -> Self {
        self.gate_overrides.push((name.into(), enabled));
        self
    }

    /// How many change events are kept for watches that resume from a resourceVersion; a watch
    /// from before the oldest kept event gets `410 Expired`. Default 10 000.
    pub fn event_history(mut self, events: usize) -> Self {
        self.event_history = events.max(1);
        self
    }

    /// How often watches that allow bookmarks receive one. Default one second.
    pub fn bookmark_interval(mut self, interval: Duration) -> Self {
        self.bookmark_interval = interval.max(Duration::from_millis(10));
        self
    }

    /// Binds `127.0.0.1:0` and starts serving on the current tokio runtime.
    pub async fn start(self) -> Result<ApiServer, ApiServerError> {
        let gates = self
            .release
            .resolve_gates(&self.gate_overrides)
            .map_err(|message| ApiServerError::FeatureGate {
                release: self.release,
                message,
            })?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(ApiServerError::Bind)?;
        let addr = listener.local_addr().map_err(ApiServerError::Bind)?;
        let shutdown = CancellationToken::new();
        let (drop_watches, _) = watch::channel(0u64);
        let shared = Arc::new(Shared {
            store: Store::new(self.event_history, Strategy::new(self.release, gates)),
            faults: faults::Faults::default(),
            drop_watches,
            shutdown: shutdown.clone(),
            bookmark_interval: self.bookmark_interval,
            open_watches: AtomicUsize::new(0),
            address: addr.to_string(),
        });
        let router = axum::Router::new()
            .fallback(http::handle)
            .with_state(Arc::clone(&shared));
        let token = shutdown.clone();
        let task = tokio::spawn(async move {
            let served = axum::serve(listener, router)
                .with_graceful_shutdown(token.cancelled_owned())
                .await;
            if let Err(error) = served {
                tracing::warn!(%error, "API-server emulator stopped serving");
            }
        });
        Ok(ApiServer {
            shared,
            addr,
            shutdown,
            task: Some(task),
        })
    }
}

/// A running API-server emulator. Dropping it stops the server.
#[derive(Debug)]
pub struct ApiServer {
    shared: Arc<Shared>,
    addr: SocketAddr,
    shutdown: CancellationToken,
    task: Option<JoinHandle<()>>,
}

impl ApiServer {
    /// Starts an emulator with default options on `127.0.0.1` and a free port.
    pub async fn start() -> Result<Self, ApiServerError> {
        ApiServerBuilder::default().start().await
    }

    /// Options for a customised emulator.
    pub fn builder() -> ApiServerBuilder {
        ApiServerBuilder::default()
    }

    /// The base URL, e.g. `http://127.0.0.1:43123`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The listening address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The Kubernetes release the emulator behaves like now (the last
    /// [`restart_as`](Self::restart_as) changes it).
    pub fn release(&self) -> KubeRelease {
        self.shared.store.strategy().release
    }

    /// The feature gates it runs with now (the release's defaults and the overrides).
    pub fn feature_gates(&self) -> FeatureGates {
        self.shared.store.strategy().gates.clone()
    }

    /// Whether a feature gate is on now (`false` for one the release does not have).
    pub fn feature_enabled(&self, gate: &str) -> bool {
        self.shared.store.strategy().gates.enabled(gate)
    }

    /// Plays a restart of the API server as `release` with `gate_overrides` applied to that
    /// release's default feature gates (later overrides win, as with
    /// [`ApiServerBuilder::feature_gate`]): an upgrade, a downgrade, or the same release with
    /// other `--feature-gates`. The address stays the same, so connected clients keep working.
    ///
    /// The gates are checked as [`ApiServerBuilder::start`] checks them; on
    /// [`ApiServerError::FeatureGate`] nothing changes and the server goes on as before. Otherwise
    /// every later request sees the new release: `/version`, the fields dropped for disabled
    /// gates, the fields the release's types lack, and validation. Every stored object stays
    /// exactly as it is, resourceVersion included, as etcd keeps it (fields the new release
    /// would drop are still there, and later updates keep them where the strategy keeps fields
    /// already in use). Every open watch ends, as a restarting API server's do; the event
    /// history is kept, so a client resumes from its last resourceVersion. Injected faults,
    /// latency and request counts carry over.
    pub fn restart_as(
        &self,
        release: KubeRelease,
        gate_overrides: &[(&str, bool)],
    ) -> Result<(), ApiServerError> {
        let overrides: Vec<(String, bool)> = gate_overrides
            .iter()
            .map(|(name, enabled)| ((*name).to_owned(), *enabled))
            .collect();
        let gates = release
            .resolve_gates(&overrides)
            .map_err(|message| ApiServerError::FeatureGate { release, message })?;
        self.shared
            .store
            .set_strategy(Strategy::new(release, gates));
        self.drop_watches();
        Ok(())
    }

    /// A kubeconfig document whose current context points at the emulator (namespace
    /// `default`, a token user the emulator accepts without checking).
    pub fn kubeconfig_yaml(&self) -> String {
        format!(
            "apiVersion: v1\n\
             kind: Config\n\
             clusters:\n\
             - name: kubedev-emulator\n  cluster:\n    server: {url}\n\
             users:\n\
             - name: kubedev-emulator\n  user:\n    token: kubedev-emulator\n\
             contexts:\n\
             - name: kubedev-emulator\n  context:\n    cluster: kubedev-emulator\n    user: kubedev-emulator\n    namespace: default\n\
             current-context: kubedev-emulator\n",
            url = self.url()
        )
    }

    /// Writes [`kubeconfig_yaml`](Self::kubeconfig_yaml) to `path`.
    pub fn write_kubeconfig(&self, path: &Path) -> Result<(), ApiServerError> {
        std::fs::write(path, self.kubeconfig_yaml()).map_err(|source| {
            ApiServerError::WriteKubeconfig {
                path: path.to_owned(),
                source,
            }
        })
    }

    /// A kube-rs client talking to the emulator (default namespace `default`).
    pub fn client(&self) -> Result<kube::Client, ApiServerError> {
        let url = self.url();
        let uri: axum::http::Uri =
            url.parse()
                .map_err(|e: axum::http::uri::InvalidUri| ApiServerError::Rejected {
                    message: format!(
                        "the emulator URL {url} does not parse: {}",
                        kubedev_core::echo::chain(&e)
                    ),
                })?;
        let config = kube::Config::new(uri);
        kube::Client::try_from(config).map_err(|source| ApiServerError::Client { url, source })
    }

    /// Sets the labels of `namespace`, as the API server reads them when it admits a claim
    /// (`resource.kubernetes.io/admin-access: "true"` lets its claims ask for admin access).
    pub fn set_namespace_labels(&self, namespace: &str, labels: &[(&str, &str)]) {
        self.shared.store.set_namespace_labels(
            namespace,
            labels
                .iter()
                .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
                .collect(),
        );
    }

    /// Every stored object of a resource, in name order (namespace first for claims).
    pub fn objects(&self, resource: Resource) -> Vec<Value> {
        self.shared
            .store
            .list(resource, None, &selectors::Selectors::default())
            .0
    }

    /// One stored object; `namespace` is ignored for cluster-scoped resources.
    pub fn get(&self, resource: Resource, namespace: Option<&str>, name: &str) -> Option<Value> {
        self.shared.store.get(
            resource,
            &Key::new(namespace.filter(|_| resource.namespaced()), name),
        )
    }

    /// Stores an object as given, skipping validation and concurrency checks, as another client
    /// would have written it: a new resourceVersion is assigned, `uid` and
    /// `creationTimestamp` are kept or filled in, and watchers see ADDED or MODIFIED. Returns
    /// the stored object.
    pub fn put_raw(&self, resource: Resource, object: Value) -> Result<Value, ApiServerError> {
        self.shared
            .store
            .put_raw(resource, object)
            .map_err(|e| ApiServerError::Rejected { message: e.message })
    }

    /// Removes an object regardless of finalizers and preconditions, as another client would;
    /// watchers see DELETED. Returns the removed object, or `None` if there was none.
    pub fn delete_raw(
        &self,
        resource: Resource,
        namespace: Option<&str>,
        name: &str,
    ) -> Option<Value> {
        self.shared.store.delete_raw(
            resource,
            &Key::new(namespace.filter(|_| resource.namespaced()), name),
        )
    }

    /// The newest resourceVersion handed out.
    pub fn resource_version(&self) -> u64 {
        self.shared.store.resource_version()
    }

    /// Forgets the event history, as etcd compaction does, and ends every open watch: a watch
    /// resuming from any resourceVersion handed out before this call receives `410 Expired` and
    /// must list again.
    pub fn compact(&self) {
        self.shared
            .store
            .compact(|| self.shared.drop_watches.send_modify(|n| *n += 1));
    }

    /// Makes the next `count` requests with this verb on this resource fail with `fault`
    /// (they are still counted). Rules queue up in the order given.
    pub fn fail_next(&self, verb: Verb, resource: Resource, count: usize, fault: Fault) {
        self.shared.faults.fail_next(verb, resource, count, fault);
    }

    /// Removes every pending injected failure.
    pub fn clear_faults(&self) {
        self.shared.faults.clear();
    }

    /// Ends every open watch stream now, cleanly, as an API server restart or a load balancer
    /// would; clients resume from their last resourceVersion.
    pub fn drop_watches(&self) {
        self.shared.drop_watches.send_modify(|n| *n += 1);
    }

    /// Delays every following request by `latency` before it is served (zero turns it off).
    pub fn set_latency(&self, latency: Duration) {
        self.shared.faults.set_latency(latency);
    }

    /// How many requests with this verb on this resource arrived (failed ones included).
    pub fn request_count(&self, verb: Verb, resource: Resource) -> u64 {
        self.shared.faults.count(verb, resource)
    }

    /// All request counts by verb and resource.
    pub fn request_counts(&self) -> BTreeMap<(Verb, Resource), u64> {
        self.shared.faults.counts()
    }

    /// Sets every request count back to zero.
    pub fn reset_request_counts(&self) {
        self.shared.faults.reset_counts();
    }

    /// How many watch streams are open right now.
    pub fn open_watches(&self) -> usize {
        self.shared.open_watches.load(Ordering::SeqCst)
    }

    /// Stops serving, ends open watches and waits for the server task.
    pub async fn shutdown(mut self) {
        self.shutdown.cancel();
        if let Some(task) = self.task.take() {
            // The server task only ends by shutdown; a join error means it panicked, which the
            // test will already have seen in the log.
            let _ = task.await;
        }
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}
