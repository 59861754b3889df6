//! [`StatelessPreparer`]: the whole [`Preparer`] of a backend from one method that gives a
//! device's edits (and, when preparing changes the host, one that undoes it).

use async_trait::async_trait;

use crate::edits::ContainerEdits;
use crate::error::PrepareError;
use crate::model::DeviceRef;
use crate::prepare::{AllocatedDevice, ClaimRef, Consumer, PreparedDevice, Preparer};

/// A backend whose `prepare` answers each device with its container edits: implement
/// [`device_edits`](Self::device_edits) and the [`Preparer`] comes with it. A backend that later
/// needs an undo adds [`release_device`](Self::release_device).
///
/// The [`Preparer`] it gets:
///
/// - `prepare` answers every allocated device with `device_edits` (and
///   [`device_status_data`](Self::device_status_data) for the claim's status), in order; the
///   first error (an unknown device, an unhealthy one) fails the prepare.
/// - `unprepare` calls [`release_device`](Self::release_device) for every device of the
///   claim, in order (nothing by default); the first error fails the unprepare, which the
///   kubelet retries.
/// - `planned_edits` (what `kubedev cdi generate` writes) is
///   [`planned_device_edits`](Self::planned_device_edits): `device_edits` unless the backend
///   says otherwise.
/// - no `pre_start`.
///
/// Preparing again must give the same edits, releasing again (or releasing a device never
/// prepared) must succeed, and different claims are prepared at once, as [`Preparer`]'s
/// contract asks. Implement [`Preparer`] itself instead when preparing needs the consumer or
/// the device's opaque configuration, or a change must be undone as a whole claim.
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

    /// Undoes what [`device_edits`](Self::device_edits) changed on the host for `device`, when
    /// its claim is unprepared; nothing by default. Called for devices that may never have
    /// been prepared, and again after a failure: it must succeed when there is nothing to
    /// undo.
    fn release_device(&self, device: &DeviceRef) -> Result<(), PrepareError> {
        let _ = device;
        Ok(())
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

    async fn unprepare(
        &self,
        _claim: &ClaimRef,
        devices: &[AllocatedDevice],
    ) -> Result<(), PrepareError> {
        devices
            .iter()
            .try_for_each(|a| self.release_device(&a.device))
    }

    async fn planned_edits(
        &self,
        device: &DeviceRef,
    ) -> Result<Option<ContainerEdits>, PrepareError> {
        self.planned_device_edits(device).map(Some)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use parking_lot::Mutex;

    use super::*;
    use crate::names::{DeviceName, PoolName};

    /// A backend that grew an undo: it records what it released and refuses `busy`.
    #[derive(Default)]
    struct Undoing {
        released: Mutex<Vec<String>>,
    }

    impl StatelessPreparer for Undoing {
        fn device_edits(&self, _device: &DeviceRef) -> Result<ContainerEdits, PrepareError> {
            Ok(ContainerEdits::new())
        }

        fn release_device(&self, device: &DeviceRef) -> Result<(), PrepareError> {
            if device.device.as_str() == "busy" {
                return Err(PrepareError::Unhealthy {
                    device: device.to_string(),
                    reason: "still in use".into(),
                });
            }
            self.released.lock().push(device.to_string());
            Ok(())
        }
    }

    fn devices(names: &[&str]) -> Vec<AllocatedDevice> {
        let pool = PoolName::new("node-a-fpga").unwrap();
        let device = |n: &str| DeviceRef {
            pool: pool.clone(),
            device: DeviceName::new(n).unwrap(),
        };
        names
            .iter()
            .map(|n| AllocatedDevice::new(device(n)))
            .collect()
    }

    #[tokio::test]
    async fn unprepare_releases_each_device_in_order_and_stops_at_the_first_error() {
        let claim = ClaimRef::parse("uid-1", "default", "c").unwrap();
        let backend = Undoing::default();
        let preparer: &dyn Preparer = &backend;
        preparer
            .unprepare(&claim, &devices(&["fpga1", "fpga0"]))
            .await
            .unwrap();
        let err = preparer
            .unprepare(&claim, &devices(&["fpga2", "busy", "fpga3"]))
            .await
            .unwrap_err();
        assert!(err.to_string().contains("still in use"), "{err}");
        assert_eq!(
            *backend.released.lock(),
            [
                "node-a-fpga/fpga1",
                "node-a-fpga/fpga0",
                "node-a-fpga/fpga2"
            ]
        );
    }
}
