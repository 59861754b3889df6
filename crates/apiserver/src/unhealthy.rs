//! Devices whose health is `Unhealthy`: the policy that says whether they are published
//! (tainted) or left out, and the inventory without those it leaves out. Pure: no I/O.

use std::borrow::Cow;

use kubedev_core::{HealthState, Inventory, Pool};

/// Whether a device of a pool is prepared for a claim now: `(pool, device)`.
pub(crate) type InUse = dyn Fn(&str, &str) -> bool + Send + Sync;

/// What the publisher does with devices whose health is `Unhealthy`.
///
/// A published unhealthy device carries the taint `<driver>/unhealthy` with the health reason
/// in its value (made a label value: `Xid-79-GPU-has-fallen-off-the-bus`), effect `NoExecute`
/// when the backend says the device is unusable for the workloads already on it
/// ([`kubedev_core::Health::evict`]) and `NoSchedule` otherwise. The taint goes as soon as the
/// device is healthy again. Devices with `Unknown` health are published as they are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum UnhealthyDevices {
    /// Taint them where the API server keeps device taints (`DRADeviceTaints` on: by default
    /// from Kubernetes 1.36), leave them out where it does not (the default).
    #[default]
    Auto,
    /// Leave them out of the ResourceSlices, so nothing new is allocated on them (safe on every
    /// cluster, but the cluster does not see why a device went away).
    Omit,
    /// Publish them tainted. Needs `DRADeviceTaints` on the cluster; where it is off the API
    /// server would drop the taint and the device would look usable, so kubedev leaves them
    /// out instead and reports the feature as unavailable.
    Taint,
    /// Publish them tainted while a claim prepared on this node holds them (so the cluster sees
    /// why, and a `NoExecute` taint evicts their pods), and leave them out once none does
    /// (decided at each publish).
    TaintWhileInUse,
}

impl UnhealthyDevices {
    /// What this policy does on a server that keeps device taints (`taints_kept`) or not:
    /// `Auto` becomes `Taint` or `Omit`; the others stay.
    pub fn resolve(self, taints_kept: bool) -> UnhealthyDevices {
        match self {
            UnhealthyDevices::Auto if taints_kept => UnhealthyDevices::Taint,
            UnhealthyDevices::Auto => UnhealthyDevices::Omit,
            other => other,
        }
    }
}

/// Whether an unhealthy device is published (with its taint) under `policy`, on an API server
/// that keeps device taints (`taints_kept`) or not, while a claim on this node holds it (`held`)
/// or not. This is the one place that decides what an unhealthy device becomes: where it is not
/// published, it is left out of the slices. A server that keeps no taints would publish it
/// looking usable, so there it is always left out.
pub(crate) fn publishes_unhealthy(policy: UnhealthyDevices, taints_kept: bool, held: bool) -> bool {
    taints_kept
        && match policy.resolve(taints_kept) {
            UnhealthyDevices::Omit | UnhealthyDevices::Auto => false,
            UnhealthyDevices::Taint => true,
            UnhealthyDevices::TaintWhileInUse => held,
        }
}

/// What publishing an inventory's unhealthy devices left out.
#[derive(Debug, Default)]
pub(crate) struct UnhealthyLeftOut {
    /// Per pool, the unhealthy devices the policy would have published tainted but that were
    /// left out because the API server keeps no taints: `pool <name>: left out <devices> …`.
    pub(crate) for_want_of_taints: Vec<String>,
}

/// `inventory` without the unhealthy devices [`publishes_unhealthy`] leaves out, borrowed when
/// it leaves out none; and what was left out for want of device taints.
pub(crate) fn unhealthy_left_out<'a>(
    inventory: &'a Inventory,
    policy: UnhealthyDevices,
    taints_kept: bool,
    in_use: &InUse,
) -> (Cow<'a, Inventory>, UnhealthyLeftOut) {
    let published = |pool: &Pool, d: &kubedev_core::Device| {
        d.health.state != HealthState::Unhealthy
            || publishes_unhealthy(
                policy,
                taints_kept,
                in_use(pool.name.as_str(), d.name.as_str()),
            )
    };
    let mut report = UnhealthyLeftOut::default();
    if inventory.devices().all(|(p, d)| published(p, d)) {
        return (Cow::Borrowed(inventory), report);
    }
    let mut out = inventory.clone();
    for pool in &mut out.pools {
        let mut wanted_taints = Vec::new();
        let snapshot = std::mem::take(&mut pool.devices);
        for d in snapshot {
            if published(pool, &d) {
                pool.devices.push(d);
                continue;
            }
            let held = in_use(pool.name.as_str(), d.name.as_str());
            // `Auto` means "leave out where taints are not kept": nothing was overridden.
            if !taints_kept
                && policy != UnhealthyDevices::Auto
                && publishes_unhealthy(policy, true, held)
            {
                wanted_taints.push(d.name.to_string());
            }
        }
        if !wanted_taints.is_empty() {
            report.for_want_of_taints.push(format!(
                "pool {}: left out {} that are unhealthy",
                pool.name,
                sample(&wanted_taints)
            ));
        }
    }
    (Cow::Owned(out), report)
}

/// Up to three names and how many more.
pub(crate) fn sample(names: &[String]) -> String {
    let shown: Vec<&str> = names.iter().take(3).map(String::as_str).collect();
    let mut s = format!(
        "{} device{} ({}",
        names.len(),
        if names.len() == 1 { "" } else { "s" },
        shown.join(", ")
    );
    if names.len() > shown.len() {
        s.push_str(&format!(", … {} more", names.len() - shown.len()));
    }
    s.push(')');
    s
}
