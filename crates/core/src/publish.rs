//! The `Publisher` trait: how the runtime makes an inventory visible.

use std::sync::Arc;

use async_trait::async_trait;

use crate::error::PublishError;
use crate::model::Inventory;

/// Makes an inventory visible to Kubernetes: as ResourceSlices through the API server, or as
/// ListAndWatch snapshots through device-plugin servers.
///
/// Contract:
/// - `publish` is given the complete inventory every time, never a delta, and is idempotent:
///   publishing the same inventory twice changes nothing the second time.
/// - It may be called again before an earlier call's effects are visible; the last call wins.
/// - Calls are not made concurrently on one publisher (the runtime serialises them).
/// - A [`PublishError::Transport`] is retried by the runtime with backoff; the publisher keeps no
///   half-applied state that would break the next call.
#[async_trait]
pub trait Publisher: Send + Sync + 'static {
    /// Publishes `inventory`.
    async fn publish(&self, inventory: &Inventory) -> Result<(), PublishError>;

    /// Publishes `inventory`, which the publisher may keep as it is, without a copy. The
    /// default publishes `&inventory`; a publisher that keeps what it was given (to derive it
    /// again later) overrides it. The runtime calls this one.
    async fn publish_shared(&self, inventory: Arc<Inventory>) -> Result<(), PublishError> {
        self.publish(&inventory).await
    }

    /// Whether what was last published has reached its destination. A publisher that writes in
    /// the background (ResourceSlices) reports it here; one that is done when `publish` returns
    /// keeps the default, [`SyncState::Synced`].
    fn sync_state(&self) -> SyncState {
        SyncState::Synced
    }

    /// The writes this publisher has made to its destination since it started; all zero for a
    /// publisher that writes nothing of its own (the default).
    fn write_counts(&self) -> WriteCounts {
        WriteCounts::default()
    }
}

/// Writes a publisher made to its destination (e.g. ResourceSlices in the API server).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct WriteCounts {
    /// Objects created.
    pub creates: u64,
    /// Objects updated.
    pub updates: u64,
    /// Objects deleted.
    pub deletes: u64,
    /// Writes refused because the object had changed meanwhile (retried after re-reading).
    pub conflicts: u64,
    /// Failed attempts (retried with backoff).
    pub failures: u64,
}

impl WriteCounts {
    /// Counts from their parts.
    pub fn new(creates: u64, updates: u64, deletes: u64, conflicts: u64, failures: u64) -> Self {
        WriteCounts {
            creates,
            updates,
            deletes,
            conflicts,
            failures,
        }
    }
}

/// How far a publisher has got with the last inventory it was given.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SyncState {
    /// Nothing was published yet.
    NotStarted,
    /// Being written.
    Pending,
    /// Written as given.
    Synced,
    /// The last attempt failed (it is retried); the reason.
    Failing(String),
}
