//! Devices that do not allow multiple allocations: which those are, and the claim that holds
//! one (recorded in the checkpoint, or being prepared right now).

use std::collections::HashMap;
use std::sync::Arc;

use kubedev_core::{AllocatedDevice, ClaimRef, DeviceRef, Inventory};
use parking_lot::{Mutex, RwLock};

use super::journal::Recorded;

/// Which devices are exclusive, and those that prepares checked but have not yet recorded in
/// the checkpoint, so two claims prepared at the same time cannot both take one.
#[derive(Debug, Default)]
pub(super) struct Exclusive {
    /// Where allowing multiple allocations is read from; without it, a device allocated with a
    /// share ID counts as shareable and any other as exclusive.
    inventory: Option<Arc<RwLock<Inventory>>>,
    /// Exclusive devices of prepares in flight, and the claim of each.
    starting: Mutex<HashMap<DeviceRef, ClaimRef>>,
}

/// Exclusive devices a prepare holds until its start is recorded; given back on drop (also when
/// the kubelet gives up on the call and its future is dropped).
pub(super) struct Starting<'a> {
    exclusive: &'a Exclusive,
    devices: Vec<DeviceRef>,
}

impl Drop for Starting<'_> {
    fn drop(&mut self) {
        let mut starting = self.exclusive.starting.lock();
        for d in &self.devices {
            starting.remove(d);
        }
    }
}

impl Exclusive {
    /// Reads from `inventory` which devices allow multiple allocations.
    pub(super) fn read_from(&mut self, inventory: Arc<RwLock<Inventory>>) {
        self.inventory = Some(inventory);
    }

    /// Whether `d` may be prepared for several claims at once.
    fn shareable(&self, d: &AllocatedDevice) -> bool {
        if d.admin_access {
            return true;
        }
        let known = self.inventory.as_ref().and_then(|inv| {
            inv.read()
                .device(&d.device)
                .map(|dev| dev.allow_multiple_allocations)
        });
        known.unwrap_or(d.share_id.is_some())
    }

    /// Takes the exclusive devices of `devices` for `claim` until its prepare is recorded; fails
    /// with the device and the claim holding it when another claim's record in `recorded`
    /// (prepared or being prepared) or another prepare in flight has one of them. The devices
    /// are given back when the returned guard is dropped.
    pub(super) fn take(
        &self,
        claim: &ClaimRef,
        devices: &[AllocatedDevice],
        recorded: &Recorded,
    ) -> Result<Starting<'_>, (DeviceRef, ClaimRef)> {
        let exclusive: Vec<&DeviceRef> = devices
            .iter()
            .filter(|d| !self.shareable(d))
            .map(|d| &d.device)
            .collect();
        if exclusive.is_empty() {
            return Ok(Starting {
                exclusive: self,
                devices: Vec::new(),
            });
        }
        let mut starting = self.starting.lock();
        for &d in &exclusive {
            if let Some(other) = starting.get(d).filter(|o| o.uid != claim.uid) {
                return Err((d.clone(), other.clone()));
            }
            let mut held = recorded.holders(d.pool.as_str(), d.device.as_str());
            if let Some((other, _)) =
                held.find(|(r, admin_access)| !admin_access && r.claim.uid != claim.uid)
            {
                return Err((d.clone(), other.claim.clone()));
            }
        }
        let taken: Vec<DeviceRef> = exclusive.into_iter().cloned().collect();
        for d in &taken {
            starting.insert(d.clone(), claim.clone());
        }
        Ok(Starting {
            exclusive: self,
            devices: taken,
        })
    }
}
