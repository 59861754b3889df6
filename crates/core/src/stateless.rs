//! [`StatelessPreparer`]: the whole [`Preparer`] of a backend whose preparing leaves nothing to
//! undo, from one method that gives a device's edits.

use async_trait::async_trait;

use crate::{
    AllocatedDevice, ClaimRef, Consumer, ContainerEdits, DeviceRef, PrepareError, PreparedDevice,
    Preparer,
};

/// A backend whose `prepare` answers each device with its container edits and leaves nothing
/// to undo: implement [`device_edits`](Self::device_edits) and the [`Preparer`] comes with it.
///
/// The [`Preparer`] it gets:
///
/// - `prepare` answers every allocated device with `device_edits` (and
///   [`device_status_data`](Self::device_status_data) for the claim's status), in order; the
///   first error (an unknown device, an unhealthy one) fails the prepare.
/// - `unprepare` succeeds at once, for any claim, prepared or not.
/// - `planned_edits` (what `kubedev cdi generate` writes) is
///   [`planned_device_edits`](Self::planned_device_edits): `device_edits` unless the backend
///   says otherwise.
/// - no `pre_start`.
///
/// Preparing again must give the same edits, and different claims are prepared at once, as
/// [`Preparer`]'s contract asks. Implement [`Preparer`] itself instead when `prepare` makes a
/// change that `unprepare` must undo (a mediated device created, a driver bound), or needs the
/// consumer or the device's opaque configuration.
///
/// ```
/// use kubedev_core::{ContainerEdits, DeviceNode, DeviceRef, PrepareError, StatelessPreparer};
///
/// struct Serial;
///
/// impl StatelessPreparer for Serial {
///     fn device_edits(&self, device: &DeviceRef) -> Result<ContainerEdits, PrepareError> {
///         let node = format!("/dev/{}", device.device);
///         Ok(ContainerEdits::new().with_device_node(DeviceNode::new(node, "rw")))
///     }
/// }
/// ```
pub trait StatelessPreparer: Send + Sync + 'static {
    /// The container edits `device` gives a container. May act on the host only in ways that
    /// need no undoing; an unknown or unusable device is an error naming it.
    fn device_edits(&self, device: &DeviceRef) -> Result<ContainerEdits, PrepareError>;

    /// The edits [`device_edits`](Self::device_edits) would give, worked out without changing
    /// the host: what `kubedev cdi generate` writes. The default is `device_edits` itself, for
    /// backends whose `device_edits` changes nothing.
    fn planned_device_edits(&self, device: &DeviceRef) -> Result<ContainerEdits, PrepareError> {
        self.device_edits(device)
    }

    /// What a prepared `device` tells the cluster in its claim's status
    /// ([`PreparedDevice::status_data`]); nothing by default.
    fn device_status_data(&self, device: &DeviceRef) -> Option<serde_json::Value> {
        let _ = device;
        None
    }
}

#[async_trait]
impl<T: StatelessPreparer> Preparer for T {
    async fn prepare(
        &self,
        _consumer: &Consumer,
        devices: &[AllocatedDevice],
    ) -> Result<Vec<PreparedDevice>, PrepareError> {
        devices
            .iter()
            .map(|a| {
                let prepared = PreparedDevice::new(a.clone(), self.device_edits(&a.device)?);
                Ok(match self.device_status_data(&a.device) {
                    Some(data) => prepared.with_status_data(data),
                    None => prepared,
                })
            })
            .collect()
    }

    /// Nothing to undo.
    async fn unprepare(
        &self,
        _claim: &ClaimRef,
        _devices: &[AllocatedDevice],
    ) -> Result<(), PrepareError> {
        Ok(())
    }

    async fn planned_edits(
        &self,
        device: &DeviceRef,
    ) -> Result<Option<ContainerEdits>, PrepareError> {
        self.planned_device_edits(device).map(Some)
    }
}
