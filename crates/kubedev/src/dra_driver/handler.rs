//! The kubelet's calls: each claim prepared or unprepared under its own lock, in a span, with
//! its duration and outcome recorded in the metrics.

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use kubedev_core::{ClaimRef, ClaimUid};
use kubedev_kubelet_grpc::dra::{ClaimError, DraHandler, PreparedClaimDevice};
use tracing::Instrument as _;

use super::DraDriver;

/// One lock per claim, held while it is prepared, unprepared or refreshed; a claim nobody
/// holds a lock of has no entry.
#[derive(Debug, Default)]
pub(super) struct ClaimLocks(parking_lot::Mutex<HashMap<ClaimUid, Arc<tokio::sync::Mutex<()>>>>);

impl ClaimLocks {
    /// The lock of the claim with UID `uid`.
    pub(super) fn of(&self, uid: &ClaimUid) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self.0.lock();
        // Drop locks nobody holds, so the map does not grow with every claim ever seen.
        locks.retain(|_, l| Arc::strong_count(l) > 1);
        locks.entry(uid.clone()).or_default().clone()
    }
}

impl DraDriver {
    /// Records the duration and outcome of `operation` in the metrics; returns `result`.
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
}

#[async_trait]
impl DraHandler for DraDriver {
    async fn prepare(&self, claim: &ClaimRef) -> Result<Vec<PreparedClaimDevice>, ClaimError> {
        let started = std::time::Instant::now();
        let _kubelet_waits = self.status.kubelet_waits();
        let span = tracing::info_span!("prepare", claim = %claim);
        let result = async {
            let lock = self.locks.of(&claim.uid);
            let _held = lock.lock().await;
            self.prepare_locked(claim).await
        }
        .instrument(span)
        .await;
        self.observe("prepare", started, result)
    }

    async fn unprepare(&self, claim: &ClaimRef) -> Result<(), ClaimError> {
        let started = std::time::Instant::now();
        let _kubelet_waits = self.status.kubelet_waits();
        let span = tracing::info_span!("unprepare", claim = %claim);
        let result = async {
            let lock = self.locks.of(&claim.uid);
            let _held = lock.lock().await;
            self.unprepare_locked(claim).await
        }
        .instrument(span)
        .await;
        self.observe("unprepare", started, result)
    }
}
