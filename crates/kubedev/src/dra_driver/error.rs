//! What the driver's own steps on a claim fail with (its backends' failures are their own), and
//! the reason each kind gives the kubelet and the metrics.

use std::sync::Arc;

use kubedev_core::{BlockingError, ClaimRef, PrepareError};
use kubedev_kubelet_grpc::dra::ClaimError;

use crate::cdi::CdiError;
use crate::checkpoint::CheckpointError;
use crate::metadata::MetadataError;

/// A step of the driver's own failed: the checkpoint, a CDI spec, device metadata, the thread
/// it ran on, or rolling back a prepare a crash interrupted.
#[derive(Debug, thiserror::Error)]
pub enum StepError {
    /// The checkpoint could not be written, or refused the change.
    #[error("writing the checkpoint: {0}")]
    Checkpoint(#[source] Arc<CheckpointError>),
    /// The checkpoint's writer is gone: the driver is stopping.
    #[error("the checkpoint writer stopped")]
    WriterStopped,
    /// A claim's CDI spec could not be written, checked, listed or removed.
    #[error(transparent)]
    Cdi(#[from] CdiError),
    /// A claim's device metadata could not be written or removed.
    #[error(transparent)]
    Metadata(#[from] MetadataError),
    /// The backend's unprepare of a claim whose prepare a crash interrupted failed.
    #[error("rolling back claim {claim}: {source}")]
    RollBack {
        /// The claim.
        claim: Box<ClaimRef>,
        /// The backend's failure.
        #[source]
        source: Box<PrepareError>,
    },
    /// The thread the step ran on failed (it panicked, or could not start).
    #[error(transparent)]
    Task(#[from] BlockingError),
}

impl From<CheckpointError> for StepError {
    fn from(e: CheckpointError) -> Self {
        StepError::Checkpoint(Arc::new(e))
    }
}

impl StepError {
    /// The reason the kubelet and `kubedev_dra_operation_errors_total` are given.
    pub fn reason(&self) -> &'static str {
        match self {
            StepError::Checkpoint(_) | StepError::WriterStopped => "checkpoint",
            StepError::Cdi(_) => "cdi",
            StepError::Metadata(_) => "metadata",
            StepError::Task(_) => "internal",
            StepError::RollBack { .. } => "backend",
        }
    }

    /// This failure for the kubelet, as the end of `context` (what the driver was doing), with
    /// its causes: retryable, as the next call may not meet it.
    pub fn for_kubelet(&self, context: std::fmt::Arguments<'_>) -> ClaimError {
        ClaimError::retryable(
            self.reason(),
            format!("{context}: {}", kubedev_core::echo::chain(self)),
        )
    }
}
