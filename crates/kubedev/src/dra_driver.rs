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
//!
//! The driver's parts: `claim_source.rs` (where allocations come from), `claim_status.rs`
//! (the claims' device status, written in the background), `handler.rs` (the kubelet's calls,
//! one claim at a time), `prepare.rs` and `unprepare.rs`, `exclusive.rs` (devices only one
//! claim may hold), `journal.rs` (the checkpoint: the records as last persisted and the group
//! commit), `error.rs` (what the driver's own steps fail with), `device_metadata.rs`
//! (KEP-5304 files), `recover.rs` (start-up recovery), `rebuild.rs` (after a lost checkpoint)
//! and `refresh.rs` (edits that changed under prepared claims).

use std::sync::Arc;

use kubedev_core::Inventory;
use kubedev_kubelet_grpc::dra::{ClaimError, Retry};

use crate::backends::Backends;
use crate::cdi::CdiWriter;
use crate::checkpoint::CheckpointStore;
use crate::metadata::MetadataWriter;
use crate::metrics::Metrics;

mod claim_source;
mod claim_status;
mod device_metadata;
mod error;
mod exclusive;
mod handler;
mod journal;
mod prepare;
mod rebuild;
mod recover;
mod refresh;
mod unprepare;

pub use claim_source::{CLAIM_GONE, ClaimAllocation, ClaimSource, ReservedClaim};
pub use error::StepError;
pub use recover::Recovery;

use claim_status::StatusWriter;
use device_metadata::ClaimMetadata;
use exclusive::Exclusive;
use handler::ClaimLocks;
use journal::Journal;

/// The DRA driver: implements the kubelet plugin's [`DraHandler`](kubedev_kubelet_grpc::dra::DraHandler).
pub struct DraDriver {
    backends: Backends,
    claims: Arc<dyn ClaimSource>,
    /// The checkpoint: its records as last persisted and the way changes reach it.
    journal: Journal,
    cdi: Arc<CdiWriter>,
    /// Each claim's lock while it is prepared, unprepared or refreshed.
    locks: ClaimLocks,
    metrics: Option<Arc<Metrics>>,
    /// Which devices only one claim may hold, and those prepares in flight took.
    exclusive: Exclusive,
    /// Claims' device status, written in the background.
    status: StatusWriter,
    /// Device metadata files for containers, when enabled.
    metadata: ClaimMetadata,
}

impl std::fmt::Debug for DraDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DraDriver")
            .field("cdi", &self.cdi.dir())
            .finish()
    }
}

/// Runs checkpoint, CDI or metadata work off the async threads ([`kubedev_core::blocking`]).
async fn blocking<T: Send + 'static, E: Into<StepError> + Send + 'static>(
    f: impl FnOnce() -> Result<T, E> + Send + 'static,
) -> Result<T, StepError> {
    kubedev_core::blocking(f).await?.map_err(Into::into)
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
        DraDriver {
            backends,
            status: StatusWriter::start(claims.clone()),
            claims,
            journal: Journal::start(store),
            cdi: Arc::new(cdi),
            locks: ClaimLocks::default(),
            metrics: None,
            exclusive: Exclusive::default(),
            metadata: ClaimMetadata::default(),
        }
    }

    /// Writes device metadata files for containers with `metadata` (KEP-5304).
    pub fn with_metadata(mut self, metadata: MetadataWriter) -> Self {
        self.metadata.on(metadata);
        self
    }

    /// Records prepare and unprepare durations and failures in `metrics`.
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Reads from `inventory` which devices allow multiple allocations. Without it, a device
    /// allocated with a share ID counts as shareable and any other as exclusive.
    pub fn with_inventory(mut self, inventory: Arc<parking_lot::RwLock<Inventory>>) -> Self {
        self.exclusive.read_from(inventory.clone());
        self.metadata.read_from(inventory);
        self
    }

    /// Whether device `device` of pool `pool` is recorded as prepared for a claim now.
    pub fn device_in_use(&self, pool: &str, device: &str) -> bool {
        self.journal
            .recorded()
            .holders(pool, device)
            .next()
            .is_some()
    }
}
