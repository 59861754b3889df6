//! Devices that do not allow multiple allocations: which those are, and the claim that holds
//! one (recorded in the checkpoint, or being prepared right now).

use kubedev_core::{AllocatedDevice, ClaimRef};

use super::DraDriver;

/// Exclusive devices a prepare holds until its start is recorded; given back on drop (also when
/// the kubelet gives up on the call and its future is dropped).
pub(super) struct Starting<'a> {
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

impl DraDriver {
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

    /// Whether device `device` of pool `pool` is recorded as prepared for a claim now.
    pub fn device_in_use(&self, pool: &str, device: &str) -> bool {
        self.journal.recorded().values().any(|r| {
            r.devices
                .iter()
                .any(|d| d.device.pool.as_str() == pool && d.device.device.as_str() == device)
        })
    }

    /// Takes the exclusive devices of `devices` for `claim` until its prepare is recorded; fails
    /// with the device and the claim holding it when another claim's record (prepared or being
    /// prepared) or another prepare in flight has one of them. The devices are given back
    /// when the returned guard is dropped.
    pub(super) fn take_exclusive(
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
            for r in self.journal.recorded().values() {
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
}
