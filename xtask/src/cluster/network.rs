//! The pods' network: a bridge of the run's own with one /24 on it, nothing routed beyond.
//!
//! The host holds the bridge's first address, where the API server listens, so a pod in its
//! own network namespace (kubedev's daemon as the chart installs it by default) reaches the API
//! server and the kubelet's probes reach the pod. The CNI bridge plugin attaches each pod with
//! an address from the /24 and no other route: a pod can reach the host's address on the bridge
//! and other pods, and nothing else. The host keeps its forwarding setting (the bridge is not a
//! gateway) and nothing is masqueraded.

use std::net::Ipv4Addr;
use std::path::Path;
use std::process::Command;

use anyhow::{Context as _, ensure};

/// The bridge's name.
pub(crate) const BRIDGE: &str = "kubedev0";
/// The host's address on the bridge: the API server's.
pub(crate) const HOST: Ipv4Addr = Ipv4Addr::new(10, 244, 0, 1);
/// The prefix length of the pods' /24.
const PREFIX: u8 = 24;

/// Whether `ip` is on the pods' /24.
pub(crate) fn on_pod_network(ip: Ipv4Addr) -> bool {
    ip.octets()[..3] == HOST.octets()[..3]
}

/// Runs `ip` with `args`; fails with what it printed.
fn ip(args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .context("running `ip` (Debian package iproute2)")?;
    ensure!(
        out.status.success(),
        "`ip {}` failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(())
}

/// Whether the bridge exists.
pub(crate) fn exists() -> bool {
    Path::new("/sys/class/net").join(BRIDGE).exists()
}

/// Makes the bridge with the host's address on it, up (one left by an earlier run is made
/// anew).
pub(crate) fn create() -> anyhow::Result<()> {
    remove()?;
    ip(&["link", "add", BRIDGE, "type", "bridge"])
        .context("making the pods' bridge (the kernel's bridge module)")?;
    ip(&["addr", "add", &format!("{HOST}/{PREFIX}"), "dev", BRIDGE])?;
    ip(&["link", "set", BRIDGE, "up"])
}

/// Removes the bridge, if there is one (the pods' ends of their links go with their network
/// namespaces).
pub(crate) fn remove() -> anyhow::Result<()> {
    if exists() {
        ip(&["link", "del", BRIDGE])?;
    }
    Ok(())
}

/// The CNI configuration list that attaches pods to the bridge, their addresses' record kept
/// in `ipam_dir`.
pub(crate) fn conflist(ipam_dir: &Path) -> String {
    let [a, b, c, _] = HOST.octets();
    serde_json::json!({
        "cniVersion": "1.0.0",
        "name": "kubedev-pods",
        "plugins": [{
            "type": "bridge",
            "bridge": BRIDGE,
            // The address is the run's: the plugin neither adds one nor turns on forwarding.
            "isGateway": false,
            "ipMasq": false,
            "ipam": {
                "type": "host-local",
                "dataDir": ipam_dir,
                // No route: only the /24 itself, which the address brings.
                "ranges": [[{
                    "subnet": format!("{a}.{b}.{c}.0/{PREFIX}"),
                    "rangeStart": format!("{a}.{b}.{c}.10"),
                }]],
            },
        }],
    })
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pod_network_is_the_bridges_24_only() {
        assert!(on_pod_network(HOST));
        assert!(on_pod_network(Ipv4Addr::new(10, 244, 0, 200)));
        assert!(!on_pod_network(Ipv4Addr::new(10, 244, 1, 2)));
        assert!(!on_pod_network(Ipv4Addr::new(10, 88, 0, 2)));
    }

    #[test]
    fn pods_get_no_route_beyond_the_bridge() {
        let conf: serde_json::Value =
            serde_json::from_str(&conflist(Path::new("/x"))).unwrap_or_default();
        let plugin = &conf["plugins"][0];
        assert_eq!(plugin["bridge"], BRIDGE);
        assert_eq!(plugin["isGateway"], false);
        assert_eq!(plugin["ipMasq"], false);
        assert!(plugin["ipam"]["routes"].is_null());
        assert_eq!(plugin["ipam"]["ranges"][0][0]["subnet"], "10.244.0.0/24");
    }
}
