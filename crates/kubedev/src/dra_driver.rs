//! The DRA side of the runtime: crash-safe, idempotent prepare and unprepare of claims.
//!
//! Every prepare is two-phase in the checkpoint (started → completed) and the CDI spec is written
//! between the two; start-up recovery rolls back half-done prepares, re-creates missing CDI files
//! of completed claims, runs the backend's prepare again for completed claims with opaque
//! configuration (so what it set up on the host, such as an MPS daemon, is back after a crash)
//! and removes CDI files no claim owns. During a rolling update the old
//! instance may still be in the middle of a prepare when the new one starts: a half-done prepare
//! whose instance still holds its lease is left to it (the kubelet's retry, or that instance,
//! finishes it; prepare is idempotent).

use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;

use crate::cdi::CdiWriter;
use crate::cdi::SpecCheck;
use crate::checkpoint::{Change, CheckpointStore, ClaimState};
use async_trait::async_trait;
use kubedev_core::{AllocatedDevice, ClaimRef, Consumer, Inventory, PreparedDevice};
use kubedev_kubelet_grpc::dra::{ClaimError, DraHandler, PreparedClaimDevice, Retry};
use tokio::sync::{mpsc, oneshot};

use crate::backends::Backends;
use crate::claim_status::{StatusChange, StatusWriter};
use crate::failpoint;

mod recover;
mod refresh;
use crate::metadata::MetadataWriter;
use crate::metrics::Metrics;
use tracing::Instrument as _;

/// Where the allocation of a claim comes from (the API server, or a test's table).
#[async_trait]
pub trait ClaimSource: Send + Sync + 'static {
    /// The devices allocated to `claim` for this driver, with their requests, share IDs and
    /// opaque configuration. Errors say why the claim cannot be prepared (not found, UID
    /// mismatch, not allocated, nothing for this driver).
    async fn allocated_devices(&self, claim: &ClaimRef)
    -> Result<Vec<AllocatedDevice>, ClaimError>;

    /// [`ClaimSource::allocated_devices`] with what else the claim says that prepare uses (the
    /// pod's name for a claim made from a template). By default only the devices.
    async fn allocation(&self, claim: &ClaimRef) -> Result<ClaimAllocation, ClaimError> {
        Ok(ClaimAllocation {
            devices: self.allocated_devices(claim).await?,
            pod_claim_name: None,
        })
    }

    /// Every claim the cluster says is allocated devices of this driver and reserved for a
    /// consumer, with those devices: what recovery rebuilds from when the checkpoint was lost.
    /// `Err` says why the source cannot tell (then nothing may be judged orphaned).
    async fn reserved_claims(&self) -> Result<Vec<(ClaimRef, Vec<AllocatedDevice>)>, String> {
        Err("this claim source cannot list the cluster's claims".into())
    }

    /// Reports `prepared`, the claim's devices as the backend prepared them, in the claim's
    /// status (`status.devices`: `Ready`, the backend's data). Called in the background after
    /// each successful prepare; by default nothing is reported.
    async fn report_prepared(
        &self,
        claim: &ClaimRef,
        prepared: &[PreparedDevice],
    ) -> Result<(), String> {
        let _ = (claim, prepared);
        Ok(())
    }

    /// Takes this driver's devices out of the claim's status after an unprepare; by default
    /// nothing is reported.
    async fn report_unprepared(&self, claim: &ClaimRef) -> Result<(), String> {
        let _ = claim;
        Ok(())
    }
}

/// A claim's allocation for this driver, as a [`ClaimSource`] reads it.
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct ClaimAllocation {
    /// The devices allocated by this driver, with requests, share IDs and configuration.
    pub devices: Vec<AllocatedDevice>,
    /// The claim's `resource.kubernetes.io/pod-claim-name` annotation: the pod's name for a
    /// claim made from a template.
    pub pod_claim_name: Option<String>,
}

impl ClaimAllocation {
    /// `devices`, for a claim not made from a template.
    pub fn new(devices: Vec<AllocatedDevice>) -> Self {
        ClaimAllocation {
            devices,
            pod_claim_name: None,
        }
    }
}

/// What start-up recovery did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Recovery {
    /// Claims whose prepare had started but not completed, rolled back.
    pub rolled_back: Vec<String>,
    /// Completed claims whose CDI spec was missing or damaged and was written again, with what
    /// was found in its place.
    pub cdi_repaired: Vec<(String, String)>,
    /// CDI files of ours that no claim owned, removed.
    pub cdi_removed: Vec<PathBuf>,
    /// Temporary files of interrupted CDI writes, removed.
    pub cdi_temp_removed: Vec<PathBuf>,
    /// Unfinished prepares left alone: the instance that started them is still running (the
    /// old daemon during a rolling update).
    pub left_to_other_instance: Vec<String>,
    /// Why the checkpoint's records were lost (a corrupt file moved aside, or a missing file
    /// while CDI specs of ours existed); `None` when they were read.
    pub checkpoint_lost: Option<String>,
    /// Claims re-prepared from what the API server says (after a lost checkpoint).
    pub rebuilt: Vec<String>,
    /// Claims the API server listed that could not be re-prepared, with why.
    pub rebuild_failed: Vec<(String, String)>,
    /// CDI specs kept although no record owns them, because the API server could not be asked
    /// whether their claims still exist.
    pub kept_unverified: Vec<PathBuf>,
    /// Why the API server could not be asked (after a lost checkpoint).
    pub cluster_error: Option<String>,
    /// Prepared claims with opaque configuration whose backend prepare ran again, so what the
    /// configuration set up on the host (an MPS daemon, a time-slice) is in place again.
    pub reapplied: Vec<String>,
    /// Prepared claims whose configuration could not be applied again, with why (the claim
    /// stays prepared; its next prepare call tries again).
    pub reapply_failed: Vec<(String, String)>,
}

/// How long recovery waits for the API server's list of claims after a lost checkpoint.
const REBUILD_LIST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// How old a temporary CDI file must be before recovery removes it while another instance
/// runs (its writes take milliseconds).
const STALE_TEMP_MARGIN: std::time::Duration = std::time::Duration::from_secs(300);

type Commit = (Change, oneshot::Sender<Result<(), String>>);

/// Group commit: checkpoint changes that arrive while a write is in flight are applied together
/// with the next write, so concurrent prepares share fsyncs instead of queueing for one each.
async fn committer(store: Arc<Mutex<CheckpointStore>>, mut rx: mpsc::UnboundedReceiver<Commit>) {
    const MAX_BATCH: usize = 1024;
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(c) => batch.push(c),
                Err(_) => break,
            }
        }
        let (changes, replies): (Vec<Change>, Vec<_>) = batch.into_iter().unzip();
        let store = store.clone();
        let outcome = kubedev_core::blocking(move || store.lock().apply(changes)).await;
        match outcome {
            Ok(Ok(results)) => {
                for (reply, r) in replies.into_iter().zip(results) {
                    let _ = reply.send(r.map_err(|e| kubedev_core::echo::chain(&e)));
                }
            }
            Ok(Err(e)) => {
                let msg = format!("writing the checkpoint: {}", kubedev_core::echo::chain(&e));
                for reply in replies {
                    let _ = reply.send(Err(msg.clone()));
                }
            }
            Err(e) => {
                for reply in replies {
                    let _ = reply.send(Err(format!(
                        "writing the checkpoint: {}",
                        kubedev_core::echo::chain(&e)
                    )));
                }
            }
        }
    }
}

/// The DRA driver: implements the kubelet plugin's [`DraHandler`].
pub struct DraDriver {
    backends: Backends,
    claims: Arc<dyn ClaimSource>,
    store: Arc<Mutex<CheckpointStore>>,
    commits: mpsc::UnboundedSender<Commit>,
    cdi: Arc<CdiWriter>,
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    metrics: Option<Arc<Metrics>>,
    inventory: Option<Arc<parking_lot::RwLock<Inventory>>>,
    /// Exclusive devices of prepares checked but not yet recorded in the checkpoint, so two
    /// claims prepared at the same time cannot both take one.
    starting: Mutex<HashMap<kubedev_core::DeviceRef, ClaimRef>>,
    /// Claims' device status, written in the background.
    status: StatusWriter,
    /// Device metadata files for containers, when enabled.
    metadata: Option<Arc<MetadataWriter>>,
}

/// Exclusive devices a prepare holds until its start is recorded; given back on drop (also when
/// the kubelet gives up on the call and its future is dropped).
struct Starting<'a> {
    driver: &'a DraDriver,
    devices: Vec<kubedev_core::DeviceRef>,
}

impl Drop for Starting<'_> {
    fn drop(&mut self) {
        let mut starting = self.driver.starting.lock();
        for d in &self.devices {
            starting.remove(d);
        }
    }
}

/// Wraps a message as a failure with `reason` that the kubelet's next call may not meet: the
/// checkpoint, the CDI directory or an internal task failed.
fn retryable(reason: &'static str) -> impl Fn(String) -> ClaimError {
    move |message| ClaimError::retryable(reason, message)
}

impl std::fmt::Debug for DraDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DraDriver")
            .field("cdi", &self.cdi.dir())
            .finish()
    }
}

/// Runs checkpoint or CDI work that fails with a message off the async threads
/// ([`kubedev_core::blocking`]).
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, String> + Send + 'static,
) -> Result<T, String> {
    kubedev_core::blocking(f)
        .await
        .map_err(|e| kubedev_core::echo::chain(&e))?
}

/// A backend's failure for the kubelet: permanent when the backend says preparing again cannot
/// succeed (an unknown device, an invalid configuration).
fn backend_error(e: &kubedev_core::PrepareError, message: String) -> ClaimError {
    ClaimError::new("backend", Retry::from_retryable(e.is_retryable()), message)
}

impl DraDriver {
    /// A driver over `backends`, reading allocations from `claims`, recording prepares in `store`
    /// and writing CDI specs with `cdi`. Must be called within a Tokio runtime (it starts the
    /// checkpoint's group-commit task, which ends when the driver is dropped).
    pub fn new(
        backends: Backends,
        claims: Arc<dyn ClaimSource>,
        store: CheckpointStore,
        cdi: CdiWriter,
    ) -> Self {
        let store = Arc::new(Mutex::new(store));
        let (commits, rx) = mpsc::unbounded_channel();
        tokio::spawn(committer(store.clone(), rx));
        DraDriver {
            backends,
            status: StatusWriter::start(claims.clone()),
            claims,
            store,
            commits,
            cdi: Arc::new(cdi),
            locks: Mutex::new(HashMap::new()),
            metrics: None,
            inventory: None,
            starting: Mutex::new(HashMap::new()),
            metadata: None,
        }
    }

    /// Writes device metadata files for containers with `metadata` (KEP-5304).
    pub fn with_metadata(mut self, metadata: MetadataWriter) -> Self {
        self.metadata = Some(Arc::new(metadata));
        self
    }

    /// A copy of the inventory, for work done off the async threads.
    fn inventory_now(&self) -> Option<Inventory> {
        self.inventory.as_ref().map(|i| i.read().clone())
    }

    /// Writes (`ensure`: checks and repairs) `claim`'s device metadata; the CDI ID per main
    /// request. Nothing when metadata is off.
    async fn metadata_files(
        &self,
        claim: &ClaimRef,
        pod_claim_name: Option<String>,
        prepared: &[PreparedDevice],
        ensure: bool,
    ) -> Result<BTreeMap<String, String>, String> {
        let Some(m) = self.metadata.clone() else {
            return Ok(BTreeMap::new());
        };
        let inventory = self.inventory_now();
        let (claim, prepared) = (claim.clone(), prepared.to_vec());
        blocking(move || {
            let name = pod_claim_name.as_deref();
            if ensure {
                m.ensure_claim(&claim, name, &prepared, inventory.as_ref())
            } else {
                m.write_claim(&claim, name, &prepared, inventory.as_ref())
            }
        })
        .await
    }

    /// Removes `claim`'s device metadata, if metadata is on.
    async fn remove_metadata(&self, claim: &ClaimRef) -> Result<(), String> {
        let Some(m) = self.metadata.clone() else {
            return Ok(());
        };
        let claim = claim.clone();
        blocking(move || m.remove_claim(&claim)).await
    }

    /// Records prepare and unprepare durations and failures in `metrics`.
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Reads from `inventory` which devices allow multiple allocations. Without it, a device
    /// allocated with a share ID counts as shareable and any other as exclusive.
    pub fn with_inventory(mut self, inventory: Arc<parking_lot::RwLock<Inventory>>) -> Self {
        self.inventory = Some(inventory);
        self
    }

    /// Whether `d` may be prepared for several claims at once.
    fn shareable(&self, d: &AllocatedDevice) -> bool {
        if d.admin_access {
            return true;
        }
        let known = self.inventory.as_ref().and_then(|inv| {
            let inv = inv.read();
            inv.device(&d.device)
                .map(|dev| dev.allow_multiple_allocations)
        });
        known.unwrap_or(d.share_id.is_some())
    }

    /// Takes the exclusive devices of `devices` for `claim` until its prepare is recorded; fails
    /// with the device and the claim holding it when another claim's record (prepared or being
    /// prepared) or another prepare in flight has one of them. Give the returned devices back
    /// when the returned guard is dropped.
    /// Whether device `device` of pool `pool` is recorded as prepared for a claim now.
    pub fn device_in_use(&self, pool: &str, device: &str) -> bool {
        let store = self.store.lock();
        store.claims().values().any(|r| {
            r.devices
                .iter()
                .any(|d| d.device.pool.as_str() == pool && d.device.device.as_str() == device)
        })
    }

    fn take_exclusive(
        &self,
        claim: &ClaimRef,
        devices: &[AllocatedDevice],
    ) -> Result<Starting<'_>, (String, ClaimRef)> {
        let exclusive: Vec<&AllocatedDevice> =
            devices.iter().filter(|d| !self.shareable(d)).collect();
        if exclusive.is_empty() {
            return Ok(Starting {
                driver: self,
                devices: Vec::new(),
            });
        }
        let mut starting = self.starting.lock();
        for d in &exclusive {
            if let Some(other) = starting.get(&d.device).filter(|o| o.uid != claim.uid) {
                return Err((d.device.to_string(), other.clone()));
            }
        }
        {
            let store = self.store.lock();
            for r in store.claims().values() {
                if r.claim.uid == claim.uid {
                    continue;
                }
                for held in r.devices.iter().filter(|h| !h.admin_access) {
                    if let Some(d) = exclusive.iter().find(|d| d.device == held.device) {
                        return Err((d.device.to_string(), r.claim.clone()));
                    }
                }
            }
        }
        let taken: Vec<_> = exclusive.iter().map(|d| d.device.clone()).collect();
        for d in &taken {
            starting.insert(d.clone(), claim.clone());
        }
        Ok(Starting {
            driver: self,
            devices: taken,
        })
    }

    fn observe<T>(
        &self,
        operation: &str,
        started: std::time::Instant,
        result: Result<T, ClaimError>,
    ) -> Result<T, ClaimError> {
        if let Some(m) = &self.metrics {
            m.observe_operation(
                operation,
                started.elapsed(),
                result.as_ref().err().map(|f| (f.reason(), f.retry())),
            );
        }
        result
    }

    /// Persists one checkpoint change (possibly together with concurrent ones).
    async fn commit(&self, change: Change) -> Result<(), String> {
        let (tx, rx) = oneshot::channel();
        self.commits
            .send((change, tx))
            .map_err(|_| "the checkpoint writer stopped".to_string())?;
        rx.await
            .map_err(|_| "the checkpoint writer stopped".to_string())?
    }

    fn lock_for(&self, uid: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self.locks.lock();
        // Drop locks nobody holds, so the map does not grow with every claim ever seen.
        locks.retain(|_, l| Arc::strong_count(l) > 1);
        locks.entry(uid.to_string()).or_default().clone()
    }

    /// The kubelet's answer for `prepared`, with the CDI device IDs the claim's spec gave them.
    /// The first device of each request also gets the request's device metadata (`metadata`,
    /// main request → CDI ID), so every container using the request sees the file.
    fn answer(
        prepared: &[PreparedDevice],
        ids: Vec<Option<String>>,
        mut metadata: BTreeMap<String, String>,
    ) -> Vec<PreparedClaimDevice> {
        prepared
            .iter()
            .zip(ids)
            .map(|(p, id)| {
                let request = kubedev_core::base_request(&p.device.request).to_string();
                let mut cdi_device_ids: Vec<String> = id.into_iter().collect();
                cdi_device_ids.extend(metadata.remove(&request));
                PreparedClaimDevice {
                    request_names: vec![request],
                    pool: p.device.device.pool.to_string(),
                    device: p.device.device.device.to_string(),
                    cdi_device_ids,
                    share_id: p.device.share_id.clone(),
                }
            })
            .collect()
    }

    async fn with_store<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut CheckpointStore) -> Result<T, String> + Send + 'static,
    ) -> Result<T, String> {
        let store = self.store.clone();
        blocking(move || f(&mut store.lock())).await
    }

    /// Writes the CDI spec and device metadata of a claim whose devices the backend prepared;
    /// on failure undoes the backend's prepare, removes what was written and forgets the claim.
    async fn write_files(
        &self,
        claim: &ClaimRef,
        devices: &[AllocatedDevice],
        prepared: &[PreparedDevice],
        pod_claim_name: Option<String>,
    ) -> Result<(crate::cdi::CdiClaimSpec, BTreeMap<String, String>), ClaimError> {
        let cdi = self.cdi.clone();
        let (uid, p) = (claim.uid.clone(), prepared.to_vec());
        let written = blocking(move || {
            cdi.write_claim(&uid, &p)
                .map_err(|e| kubedev_core::echo::chain(&e))
        })
        .await;
        let metadata = match &written {
            Ok(_) => self
                .metadata_files(claim, pod_claim_name, prepared, false)
                .await
                .map_err(|e| format!("writing the device metadata: {e}")),
            Err(_) => Ok(BTreeMap::new()),
        };
        match written.and_then(|w| Ok((w, metadata?))) {
            Ok(w) => Ok(w),
            Err(e) => {
                if let Err(u) = self.backends.unprepare(claim, devices).await {
                    tracing::error!(claim = %claim, error = %kubedev_core::echo::Chain(&u), "rolling back after a CDI failure failed");
                }
                let cdi = self.cdi.clone();
                let uid = claim.uid.clone();
                if let Err(r) = blocking(move || {
                    cdi.remove_claim(&uid)
                        .map(|_| ())
                        .map_err(|e| kubedev_core::echo::chain(&e))
                })
                .await
                .and(self.remove_metadata(claim).await)
                {
                    tracing::error!(claim = %claim, error = %r, "removing the files of a failed prepare failed");
                }
                self.commit(Change::Remove {
                    uid: claim.uid.to_string(),
                })
                .await
                .map_err(retryable("checkpoint"))?;
                Err(ClaimError::retryable(
                    "cdi",
                    format!("writing the CDI spec of claim {claim}: {e}"),
                ))
            }
        }
    }

    async fn prepare_locked(
        &self,
        claim: &ClaimRef,
    ) -> Result<Vec<PreparedClaimDevice>, ClaimError> {
        let existing = {
            let store = self.store.lock();
            store.get(claim.uid.as_str()).cloned()
        };
        if let Some(r) = existing
            && r.state == ClaimState::PrepareCompleted
        {
            // Idempotent: the same answer again, with the CDI spec put back if it went missing
            // or was damaged.
            let cdi = self.cdi.clone();
            let (uid, prepared) = (claim.uid.clone(), r.prepared.clone());
            let (check, ids) = blocking(move || {
                cdi.ensure_claim_ids(&uid, &prepared)
                    .map_err(|e| kubedev_core::echo::chain(&e))
            })
            .await
            .map_err(retryable("cdi"))?;
            if let SpecCheck::Repaired { found } = check {
                tracing::warn!(claim = %claim, found = %found, "rewrote a missing or damaged CDI spec");
            }
            let metadata = self
                .metadata_files(claim, r.pod_claim_name.clone(), &r.prepared, true)
                .await
                .map_err(retryable("metadata"))?;
            self.status
                .send(StatusChange::Prepared(claim.clone(), r.prepared.clone()));
            return Ok(Self::answer(&r.prepared, ids, metadata));
        }

        let ClaimAllocation {
            devices,
            pod_claim_name,
        } = self.claims.allocation(claim).await?;
        if devices.is_empty() {
            return Err(ClaimError::permanent(
                "not_allocated",
                format!("claim {claim} has no devices allocated by this driver"),
            ));
        }
        for d in &devices {
            if self.backends.owner(&d.device.pool).is_none() {
                return Err(ClaimError::permanent(
                    "not_on_node",
                    format!("claim {claim}: device {} is not on this node", d.device),
                ));
            }
        }
        let taken = self
            .take_exclusive(claim, &devices)
            .map_err(|(device, other)| {
                ClaimError::retryable(
                    "device_in_use",
                    format!(
                        "claim {claim}: device {device} does not allow multiple allocations and is \
                     already prepared for claim {other}; unprepare that claim first"
                    ),
                )
            })?;
        let started = self
            .commit(Change::Start {
                claim: claim.clone(),
                devices: devices.clone(),
            })
            .await;
        // Recorded (or failed): from here the checkpoint speaks for these devices.
        drop(taken);
        started.map_err(retryable("checkpoint"))?;
        failpoint::reached("after-prepare-started").await;

        let prepared = match self
            .backends
            .prepare(&Consumer::Claim(claim.clone()), &devices)
            .await
        {
            Ok(p) => p,
            Err(e) => {
                self.commit(Change::Remove {
                    uid: claim.uid.to_string(),
                })
                .await
                .map_err(retryable("checkpoint"))?;
                return Err(backend_error(
                    &e,
                    format!("preparing claim {claim}: {}", kubedev_core::echo::chain(&e)),
                ));
            }
        };
        failpoint::reached("after-device-prepare").await;

        let (written, metadata) = self
            .write_files(claim, &devices, &prepared, pod_claim_name.clone())
            .await?;
        failpoint::reached("after-cdi-write").await;
        failpoint::reached("before-prepare-completed").await;

        let file_name = written
            .file
            .as_ref()
            .and_then(|f| f.file_name())
            .map(|f| f.to_string_lossy().into_owned());
        self.commit(Change::Complete {
            uid: claim.uid.to_string(),
            prepared: prepared.clone(),
            cdi_file: file_name,
            pod_claim_name,
        })
        .await
        .map_err(retryable("checkpoint"))?;
        tracing::info!(claim = %claim, devices = prepared.len(), "prepared");
        let answer = Self::answer(&prepared, written.device_ids, metadata);
        self.status
            .send(StatusChange::Prepared(claim.clone(), prepared));
        Ok(answer)
    }

    async fn unprepare_locked(&self, claim: &ClaimRef) -> Result<(), ClaimError> {
        let record = {
            let store = self.store.lock();
            store.get(claim.uid.as_str()).cloned()
        };
        if let Some(r) = &record {
            failpoint::reached("during-unprepare").await;
            self.backends
                .unprepare(&r.claim, &r.devices)
                .await
                .map_err(|e| {
                    backend_error(
                        &e,
                        format!(
                            "unpreparing claim {claim}: {}",
                            kubedev_core::echo::chain(&e)
                        ),
                    )
                })?;
        }
        let cdi = self.cdi.clone();
        let uid = claim.uid.clone();
        blocking(move || {
            cdi.remove_claim(&uid)
                .map(|_| ())
                .map_err(|e| kubedev_core::echo::chain(&e))
        })
        .await
        .map_err(retryable("checkpoint"))?;
        self.remove_metadata(claim)
            .await
            .map_err(retryable("metadata"))?;
        if record.is_some() {
            self.commit(Change::Remove {
                uid: claim.uid.to_string(),
            })
            .await
            .map_err(retryable("checkpoint"))?;
            tracing::info!(claim = %claim, "unprepared");
        }
        self.status.send(StatusChange::Unprepared(claim.clone()));
        Ok(())
    }
}

#[async_trait]
impl DraHandler for DraDriver {
    async fn prepare(&self, claim: &ClaimRef) -> Result<Vec<PreparedClaimDevice>, ClaimError> {
        let started = std::time::Instant::now();
        let span = tracing::info_span!("prepare", claim = %claim);
        let result = async {
            let lock = self.lock_for(claim.uid.as_str());
            let _held = lock.lock().await;
            self.prepare_locked(claim).await
        }
        .instrument(span)
        .await;
        self.observe("prepare", started, result)
    }

    async fn unprepare(&self, claim: &ClaimRef) -> Result<(), ClaimError> {
        let started = std::time::Instant::now();
        let span = tracing::info_span!("unprepare", claim = %claim);
        let result = async {
            let lock = self.lock_for(claim.uid.as_str());
            let _held = lock.lock().await;
            self.unprepare_locked(claim).await
        }
        .instrument(span)
        .await;
        self.observe("unprepare", started, result)
    }
}
