//! How the real kubelet calls kubedev's sockets, held to the testkit's kubelet emulator of the
//! same release. The daemon counts every request it is sent by gRPC method and the kind of
//! `:authority` it carried (`kubedev_kubelet_requests_total`); after the pods of the earlier
//! tests, the real kubelet's requests must be the ones the emulator makes: the plugin watcher's
//! registration calls, the DRA service the emulator chooses from kubedev's list, the health
//! stream the release opens, the device plugin's calls, each socket dialed with the
//! `:authority` the emulator sends, and nothing else.

use std::collections::BTreeMap;

use kubedev_kubelet_grpc::authority::ClientAuthority;
use kubedev_kubelet_grpc::dra::{HEALTH_SERVICES, SUPPORTED_DRA_SERVICES};
use kubedev_testkit::kubelet::{KUBELET_DRA_SERVICES, KubeletRelease};

use super::startup::kubedev_metrics;
use super::*;

/// The protobuf package of the kubelet's DRA services, before their version.
const DRA_PACKAGE: &str = "k8s.io.kubelet.pkg.apis.dra.";

pub(super) fn kubelet_calls(node: &Node, _root: &Path) -> anyhow::Result<()> {
    let release = kubelet_release(node)?;
    let seen = requests(&kubedev_metrics(node)?)?;
    ensure!(
        !seen.is_empty(),
        "kubedev counted no request from the kubelet"
    );
    let model = Model::of(release);
    eprintln!("  the kubelet ({release:?}) called:");
    for ((method, authority), n) in &seen {
        eprintln!("    {method} with :authority {authority}: {n}");
    }
    let problems = model.differences(&seen);
    ensure!(
        problems.is_empty(),
        "the real kubelet and the emulator of {release:?} call kubedev differently:\n{}",
        indent(&problems.join("\n"))
    );
    Ok(())
}

/// What the emulator of one release does on each socket.
struct Model {
    /// The DRA service it chooses from kubedev's list, e.g. `v1.DRAPlugin`.
    dra_service: String,
    /// The health service it opens (kubedev advertises health in the chart's default).
    health_service: String,
    registration: ClientAuthority,
    dra: ClientAuthority,
    device_plugin: ClientAuthority,
}

impl Model {
    fn of(release: KubeletRelease) -> Model {
        let dialing = release.dialing();
        let dra_service = SUPPORTED_DRA_SERVICES
            .iter()
            .find(|s| KUBELET_DRA_SERVICES.contains(s))
            .map_or_else(String::new, |s| s.to_string());
        // Up to 1.36 the kubelet opens `v1alpha1` whatever the plugin says; from 1.37 the
        // first health service the plugin advertises.
        let health_service = if release.watches_health_unadvertised() {
            "v1alpha1.DRAResourceHealth".to_string()
        } else {
            HEALTH_SERVICES[0].to_string()
        };
        Model {
            dra_service,
            health_service,
            registration: dialing.registration,
            dra: dialing.dra,
            device_plugin: dialing.device_plugin,
        }
    }

    /// The `:authority` the emulator sends for `method`, or `None` for a method it never
    /// calls.
    fn authority_for(&self, method: &str) -> Option<&ClientAuthority> {
        let (service, _) = method.strip_prefix('/')?.split_once('/')?;
        if service == "pluginregistration.Registration" {
            Some(&self.registration)
        } else if service == format!("{DRA_PACKAGE}{}", self.dra_service)
            || service == self.health_service
        {
            Some(&self.dra)
        } else if service == "v1beta1.DevicePlugin" {
            Some(&self.device_plugin)
        } else {
            None
        }
    }

    /// The methods every run of the earlier tests makes the emulator call.
    fn required(&self) -> Vec<String> {
        let dra = format!("/{DRA_PACKAGE}{}", self.dra_service);
        vec![
            "/pluginregistration.Registration/GetInfo".into(),
            "/pluginregistration.Registration/NotifyRegistrationStatus".into(),
            format!("{dra}/NodePrepareResources"),
            format!("{dra}/NodeUnprepareResources"),
            format!("/{}/NodeWatchResources", self.health_service),
            "/v1beta1.DevicePlugin/GetDevicePluginOptions".into(),
            "/v1beta1.DevicePlugin/ListAndWatch".into(),
            "/v1beta1.DevicePlugin/Allocate".into(),
        ]
    }

    /// Each way the requests `seen` differ from the emulator's.
    fn differences(&self, seen: &BTreeMap<(String, String), f64>) -> Vec<String> {
        let mut problems = Vec::new();
        for method in self.required() {
            if !seen.keys().any(|(m, _)| *m == method) {
                problems.push(format!("the emulator calls {method}; the kubelet did not"));
            }
        }
        for (method, authority) in seen.keys() {
            match self.authority_for(method) {
                None => problems.push(format!(
                    "the kubelet called {method}, which the emulator never calls"
                )),
                Some(want) if want.label() != authority => problems.push(format!(
                    "the kubelet sent :authority {authority} with {method}; the emulator sends {}",
                    want.label()
                )),
                Some(_) => {}
            }
        }
        problems
    }
}

/// The kubelet's release, from the node's status.
fn kubelet_release(node: &Node) -> anyhow::Result<KubeletRelease> {
    let version = node.kubectl_out(&[
        "get",
        "nodes",
        "-o",
        "jsonpath={.items[0].status.nodeInfo.kubeletVersion}",
    ])?;
    let minor = version
        .trim()
        .strip_prefix("v1.")
        .and_then(|r| r.split('.').next())
        .and_then(|m| m.parse::<u32>().ok())
        .with_context(|| format!("kubelet version {version:?}"))?;
    Ok(match minor {
        34 => KubeletRelease::V1_34,
        35 => KubeletRelease::V1_35,
        36 => KubeletRelease::V1_36,
        37 => KubeletRelease::V1_37,
        38 => KubeletRelease::V1_38,
        _ => bail!("the kubelet is {version}, a release the emulator does not model"),
    })
}

/// `kubedev_kubelet_requests_total` by (method, authority).
fn requests(samples: &startup::Samples) -> anyhow::Result<BTreeMap<(String, String), f64>> {
    let mut out = BTreeMap::new();
    for (series, value) in samples {
        let Some(labels) = series.strip_prefix("kubedev_kubelet_requests_total{") else {
            continue;
        };
        let label = |name: &str| {
            labels
                .split(&format!("{name}=\""))
                .nth(1)
                .and_then(|r| r.split('"').next())
                .map(str::to_string)
        };
        let (Some(method), Some(authority)) = (label("method"), label("authority")) else {
            bail!("cannot read the labels of {series}");
        };
        out.insert((method, authority), *value);
    }
    Ok(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn seen(lines: &[(&str, &str)]) -> BTreeMap<(String, String), f64> {
        lines
            .iter()
            .map(|(m, a)| ((m.to_string(), a.to_string()), 1.0))
            .collect()
    }

    fn as_1_37() -> Vec<(&'static str, &'static str)> {
        vec![
            (
                "/pluginregistration.Registration/GetInfo",
                "escaped-socket-path",
            ),
            (
                "/pluginregistration.Registration/NotifyRegistrationStatus",
                "escaped-socket-path",
            ),
            (
                "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources",
                "localhost",
            ),
            (
                "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeUnprepareResources",
                "localhost",
            ),
            ("/v1.DRAResourceHealth/NodeWatchResources", "localhost"),
            ("/v1beta1.DevicePlugin/GetDevicePluginOptions", "localhost"),
            ("/v1beta1.DevicePlugin/ListAndWatch", "localhost"),
            ("/v1beta1.DevicePlugin/Allocate", "localhost"),
            ("/v1beta1.DevicePlugin/GetPreferredAllocation", "localhost"),
        ]
    }

    #[test]
    fn a_kubelet_that_calls_as_the_emulator_does_matches() {
        let model = Model::of(KubeletRelease::V1_37);
        assert_eq!(model.differences(&seen(&as_1_37())), Vec::<String>::new());
    }

    #[test]
    fn another_service_version_authority_or_a_missing_call_is_named() {
        let model = Model::of(KubeletRelease::V1_37);
        let mut calls = as_1_37();
        calls[1].1 = "localhost";
        calls.retain(|(m, _)| !m.ends_with("NodeWatchResources"));
        calls.push((
            "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodePrepareResources",
            "localhost",
        ));
        let problems = model.differences(&seen(&calls));
        assert_eq!(problems.len(), 3, "{problems:#?}");
        assert!(problems[0].contains("/v1.DRAResourceHealth/NodeWatchResources"));
        assert!(problems.iter().any(|p| p.contains("v1beta1.DRAPlugin")));
        assert!(
            problems
                .iter()
                .any(|p| p.contains("sent :authority localhost with /pluginregistration"))
        );
        // Up to 1.36 the health stream is v1alpha1's.
        let old = Model::of(KubeletRelease::V1_36);
        assert!(
            old.differences(&seen(&as_1_37()))
                .iter()
                .any(|p| p.contains("v1alpha1.DRAResourceHealth"))
        );
    }

    #[test]
    fn the_counter_series_are_read_by_method_and_authority() {
        let samples: startup::Samples = [
            (
                "kubedev_kubelet_requests_total{method=\"/v1beta1.DevicePlugin/Allocate\",authority=\"localhost\"}".to_string(),
                3.0,
            ),
            ("kubedev_devices{api=\"dra\"}".to_string(), 4.0),
        ]
        .into_iter()
        .collect();
        let got = requests(&samples).unwrap();
        assert_eq!(
            got,
            [(
                (
                    "/v1beta1.DevicePlugin/Allocate".to_string(),
                    "localhost".to_string()
                ),
                3.0
            )]
            .into_iter()
            .collect()
        );
    }
}
