//! `kubedev cdi generate`: a CDI spec for the devices the configured backends find, for
//! container runtimes used outside Kubernetes (`podman run --device <kind>=gpu-0`) or to check
//! what a container would get before any pod asks.
//!
//! Each device found becomes one CDI device named after it (`<pool>-<device>` when two pools
//! have a device of the same name), with the edits its backend's `prepare` would give, worked
//! out without changing the host. Devices whose edits only exist once prepared (a MIG placement,
//! a function still to be bound to vfio-pci) or that cannot be used now are left out and
//! listed with the reason. An extra device `all` carries the edits of every device together.

use std::collections::BTreeMap;
use std::path::Path;

use crate::cdi::CdiSpec;
use anyhow::Context as _;
use kubedev_core::{ContainerEdits, DeviceRef};

use crate::config::Config;

/// The CDI class used when only a vendor (the DRA driver name) is known.
pub const DEFAULT_CLASS: &str = "device";

/// The name of the device that holds every other device's edits.
pub const ALL_DEVICE: &str = "all";

/// A device left out of the spec, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    /// The device.
    pub device: DeviceRef,
    /// Why it is not in the spec.
    pub reason: String,
}

/// What `cdi generate` produced.
#[derive(Debug, Clone)]
pub struct Generated {
    /// The spec, or `None` when no device could be described.
    pub spec: Option<CdiSpec>,
    /// Devices left out.
    pub skipped: Vec<Skipped>,
    /// How many devices discovery found.
    pub found: usize,
    /// The backends that ran.
    pub backends: Vec<String>,
}

/// The CDI kind to use: `kind` when given, else `<dra.driverName>/device`.
pub fn kind_for(config: &Config, kind: Option<&str>) -> anyhow::Result<String> {
    match (kind, &config.dra.driver_name) {
        (Some(k), _) => Ok(k.to_string()),
        (None, Some(driver)) => Ok(format!("{driver}/{DEFAULT_CLASS}")),
        (None, None) => anyhow::bail!(
            "no CDI kind: give --kind VENDOR/CLASS (e.g. --kind example.com/device), or set \
             dra.driverName in the configuration"
        ),
    }
}

/// CDI device names for `devices`: the device name, or `<pool>-<device>` when another pool has
/// a device of the same name (a pool name's '/' separators, which CDI names lack, become '-').
fn names(devices: &[DeviceRef]) -> Vec<String> {
    let mut count: BTreeMap<&str, usize> = BTreeMap::new();
    for d in devices {
        *count.entry(d.device.as_str()).or_default() += 1;
    }
    devices
        .iter()
        .map(|d| {
            if count[d.device.as_str()] > 1 {
                format!("{}-{}", d.pool.as_str().replace('/', "-"), d.device)
            } else {
                d.device.to_string()
            }
        })
        .collect()
}

/// Discovers devices as the daemon would and builds the spec of `kind` from their planned
/// edits. Nothing on the host is changed and no socket is opened.
pub async fn generate(config: &Config, path: &Path, kind: &str) -> anyhow::Result<Generated> {
    let found = crate::discover::discover(config, path).await?;
    let devices: Vec<DeviceRef> = found
        .inventory
        .pools
        .iter()
        .flat_map(|p| {
            p.devices
                .iter()
                .map(|d| DeviceRef::new(p.name.clone(), d.name.clone()))
        })
        .collect();
    let mut described: Vec<(String, ContainerEdits)> = Vec::new();
    let mut skipped = Vec::new();
    for (device, name) in devices.iter().zip(names(&devices)) {
        match found.set.planned_edits(device).await {
            Ok(Some(edits)) if edits.is_empty() => skipped.push(Skipped {
                device: device.clone(),
                reason: "it needs no container edits".into(),
            }),
            Ok(Some(edits)) => described.push((name, edits)),
            Ok(None) => skipped.push(Skipped {
                device: device.clone(),
                reason: "its container edits are only known once it is prepared".into(),
            }),
            Err(e) => skipped.push(Skipped {
                device: device.clone(),
                reason: kubedev_core::echo::chain(&e),
            }),
        }
    }
    let spec = if described.is_empty() {
        None
    } else {
        if described.len() > 1 && !described.iter().any(|(n, _)| n == ALL_DEVICE) {
            let mut all = ContainerEdits::default();
            for (_, e) in &described {
                all.merge(e);
            }
            described.push((ALL_DEVICE.to_string(), all));
        }
        Some(CdiSpec::for_devices(kind, &described).with_context(|| format!("CDI kind {kind:?}"))?)
    };
    Ok(Generated {
        spec,
        skipped,
        found: devices.len(),
        backends: found.backends,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn r(pool: &str, device: &str) -> DeviceRef {
        DeviceRef::new(
            kubedev_core::PoolName::new(pool).unwrap(),
            kubedev_core::DeviceName::new(device).unwrap(),
        )
    }

    #[test]
    fn names_are_device_names_unless_two_pools_share_one() {
        let n = names(&[
            r("node-a", "gpu-0"),
            r("node-a/static", "dev-0"),
            r("node-a/other", "dev-0"),
        ]);
        assert_eq!(n, ["gpu-0", "node-a-static-dev-0", "node-a-other-dev-0"]);
        for name in &n {
            crate::cdi::validate_device_name(name).unwrap();
        }
    }
}
