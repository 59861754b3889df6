//! Claim device status (KEP-4817): after a prepare, this driver's devices go into the claim's
//! `status.devices` (condition `Ready`, the backend's data and network interface); after an
//! unprepare they are taken out again.
//!
//! The writes never hold up the kubelet: they are queued and made in the background, one at a
//! time and in the order the claims were prepared and unprepared (so a claim's clearing never
//! lands before its own earlier write), each tried a few times with a growing pause.

use std::sync::Arc;
use std::time::Duration;

use kubedev_core::{ClaimRef, PreparedDevice};
use tokio::sync::mpsc;

use crate::dra_driver::ClaimSource;

/// One change of a claim's device status.
#[derive(Debug)]
pub(crate) enum StatusChange {
    /// The claim's devices are prepared, as the backend answered.
    Prepared(ClaimRef, Vec<PreparedDevice>),
    /// The claim is unprepared.
    Unprepared(ClaimRef),
}

/// Pauses between the attempts of one write; after the last it is given up (and logged).
const RETRY_PAUSES: [Duration; 3] = [
    Duration::from_millis(200),
    Duration::from_secs(1),
    Duration::from_secs(5),
];

/// The queue of status writes and the task making them.
#[derive(Debug, Clone)]
pub(crate) struct StatusWriter {
    tx: mpsc::UnboundedSender<StatusChange>,
}

impl StatusWriter {
    /// Starts the background writer over `claims` (within a Tokio runtime); it ends when every
    /// handle is dropped.
    pub(crate) fn start(claims: Arc<dyn ClaimSource>) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(write_all(claims, rx));
        StatusWriter { tx }
    }

    /// Queues `change`.
    pub(crate) fn send(&self, change: StatusChange) {
        // The writer only stops when the runtime does; nothing is left to report to then.
        let _ = self.tx.send(change);
    }
}

async fn write_all(claims: Arc<dyn ClaimSource>, mut rx: mpsc::UnboundedReceiver<StatusChange>) {
    while let Some(change) = rx.recv().await {
        let (claim, what) = match &change {
            StatusChange::Prepared(c, _) => (c, "writing"),
            StatusChange::Unprepared(c) => (c, "clearing"),
        };
        let mut pauses = RETRY_PAUSES.iter();
        loop {
            let result = match &change {
                StatusChange::Prepared(c, devices) => claims.report_prepared(c, devices).await,
                StatusChange::Unprepared(c) => claims.report_unprepared(c).await,
            };
            match (result, pauses.next()) {
                (Ok(()), _) => break,
                (Err(error), Some(pause)) => {
                    tracing::debug!(claim = %claim, %error, "{what} the claim's device status failed; trying again");
                    tokio::time::sleep(*pause).await;
                }
                (Err(error), None) => {
                    tracing::warn!(claim = %claim, %error, "{what} the claim's device status failed; given up (the devices stay prepared)");
                    break;
                }
            }
        }
    }
}
