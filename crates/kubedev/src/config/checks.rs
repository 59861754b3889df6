//! Checks of a configuration beyond its own fields: the backends' sections as the backends check
//! them, the metrics address, and the files it names (kubeconfig, selection policies).

use std::path::Path;

use super::{Config, ConfigError, DevicePluginSection};

fn invalid(path: &Path, field: impl Into<String>, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        path: path.to_path_buf(),
        line: None,
        field: field.into(),
        message: message.into(),
    }
}

/// Where a device-plugin resource's selection policy comes from.
#[cfg_attr(not(feature = "wasm"), allow(dead_code))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PolicyModule<'a> {
    /// The module called `name` in the policy directory `dir` (hot-reloaded).
    InDir {
        /// `devicePlugin.policyDir`.
        dir: &'a Path,
        /// The module's file stem.
        name: &'a str,
    },
    /// A `.wasm` file, loaded once.
    File(&'a Path),
}

/// Where the policy `policy` of a resource comes from: a bare name (no `/`, no extension) names
/// a module of `devicePlugin.policyDir` when there is one; anything else is a file.
#[cfg_attr(not(feature = "wasm"), allow(dead_code))]
pub(crate) fn policy_module<'a>(policy: &'a Path, dp: &'a DevicePluginSection) -> PolicyModule<'a> {
    let bare = policy.components().count() == 1 && policy.extension().is_none();
    match (&dp.policy_dir, bare, policy.to_str()) {
        (Some(dir), true, Some(name)) => PolicyModule::InDir { dir, name },
        _ => PolicyModule::File(policy),
    }
}

/// Checks `address` as `host:port` (an IPv6 host in brackets).
fn check_address(address: &str) -> Result<(), String> {
    let example = "e.g. 0.0.0.0:9464, localhost:9464 or [::]:9464";
    let Some((host, port)) = address.rsplit_once(':') else {
        return Err(format!("{address:?} is not host:port, {example}"));
    };
    if host.is_empty() {
        return Err(format!("{address:?} has no host, {example}"));
    }
    if let Some(inner) = host.strip_prefix('[') {
        let ok = inner
            .strip_suffix(']')
            .is_some_and(|ip| ip.parse::<std::net::Ipv6Addr>().is_ok());
        if !ok {
            return Err(format!(
                "{address:?}: {host:?} is not an IPv6 address in brackets"
            ));
        }
    } else if host.contains(':') {
        return Err(format!(
            "{address:?}: an IPv6 host must be in brackets, e.g. [::]:9464"
        ));
    }
    if port.parse::<u16>().is_err() {
        return Err(format!(
            "{address:?}: {port:?} is not a port number (0 to 65535)"
        ));
    }
    Ok(())
}

impl Config {
    /// Checks what `kubedev run` checks when it builds the backends and starts serving, short of
    /// touching the host: each backend's section, the pool names made from the node name, the
    /// metrics address, and the CDI names of device-plugin resources.
    pub(super) fn validate_sections(&self, path: &Path) -> Result<(), ConfigError> {
        let mut pools: Vec<&str> = Vec::new();
        for (kind, section) in &self.backends {
            let Some(factory) = self.registry.get(kind) else {
                continue;
            };
            factory.check(section).map_err(|e| {
                let field = if e.field.is_empty() {
                    format!("backends.{kind}")
                } else {
                    format!("backends.{kind}.{}", e.field)
                };
                invalid(path, field, e.message)
            })?;
            if factory.own_pool() {
                pools.push(kind);
            }
        }
        if !pools.is_empty() {
            let node = self.node_name_or_host();
            for kind in pools {
                kubedev_core::factory::own_pool_name(&node, kind)
                    .map_err(|e| invalid(path, "nodeName", e.to_string()))?;
            }
        }
        if let Some(address) = &self.metrics.address {
            check_address(address).map_err(|m| invalid(path, "metrics.address", m))?;
        }
        let dp = &self.device_plugin;
        if dp.enabled && dp.cdi {
            for (i, r) in dp.resources.iter().enumerate() {
                let domain = r.name.split_once('/').map_or(r.name.as_str(), |(d, _)| d);
                kubedev_core::DriverName::new(domain).map_err(|e| {
                    invalid(
                        path,
                        format!("devicePlugin.resources[{i}].name"),
                        format!(
                            "with devicePlugin.cdi the domain {domain:?} names the CDI kind and \
                             must be a driver name: {e}"
                        ),
                    )
                })?;
            }
        }
        Ok(())
    }

    /// Reads what the configuration names the way `kubedev run` reads it before serving: the
    /// kubeconfig of DRA mode and the device-plugin resources' selection policies (each module
    /// is loaded and checked). Nothing is written and nothing is sent to the API server.
    pub(super) fn check_files(&self, path: &Path) -> Result<(), ConfigError> {
        if self.dra.enabled
            && let Some(kubeconfig) = &self.dra.kubeconfig
        {
            let kubeconfig = kubeconfig.clone();
            std::thread::scope(|s| {
                s.spawn(|| {
                    let runtime = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .map_err(|e| kubedev_core::echo::chain(&e))?;
                    runtime
                        .block_on(kubedev_apiserver::check_kubeconfig(&kubeconfig))
                        .map_err(|e| kubedev_core::echo::chain(&e))
                })
                .join()
                .unwrap_or_else(|_| Err("reading the kubeconfig failed".into()))
            })
            .map_err(|m| invalid(path, "dra.kubeconfig", m))?;
        }
        let dp = &self.device_plugin;
        if dp.enabled {
            self.check_policies(path, dp)?;
        }
        Ok(())
    }

    #[cfg(feature = "wasm")]
    fn check_policies(&self, path: &Path, dp: &DevicePluginSection) -> Result<(), ConfigError> {
        let mut sandbox = None;
        for (i, r) in dp.resources.iter().enumerate() {
            let Some(policy) = &r.policy else { continue };
            let sb = match &sandbox {
                Some(sb) => sb,
                None => sandbox.insert(
                    kubedev_sandbox::Sandbox::new(kubedev_sandbox::Limits::default()).map_err(
                        |e| {
                            invalid(
                                path,
                                format!("devicePlugin.resources[{i}].policy"),
                                kubedev_core::echo::chain(&e),
                            )
                        },
                    )?,
                ),
            };
            match policy_module(policy, dp) {
                PolicyModule::InDir { dir, .. } => {
                    kubedev_sandbox::PolicyDir::open(sb, dir).map_err(|e| {
                        invalid(
                            path,
                            "devicePlugin.policyDir",
                            format!("{}: {}", dir.display(), kubedev_core::echo::chain(&e)),
                        )
                    })?;
                }
                PolicyModule::File(file) => {
                    sb.load_file(file).map_err(|e| {
                        invalid(
                            path,
                            format!("devicePlugin.resources[{i}].policy"),
                            format!(
                                "loading the selection policy {}: {}",
                                file.display(),
                                kubedev_core::echo::chain(&e)
                            ),
                        )
                    })?;
                }
            }
        }
        Ok(())
    }

    /// Without the `wasm` feature, validation already refused every policy.
    #[cfg(not(feature = "wasm"))]
    fn check_policies(&self, _: &Path, _: &DevicePluginSection) -> Result<(), ConfigError> {
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_host_and_port() {
        for good in [
            "0.0.0.0:9464",
            "localhost:9464",
            "[::]:0",
            "node-a.example:65535",
        ] {
            assert_eq!(check_address(good), Ok(()), "{good}");
        }
        for (bad, why) in [
            ("localhost:notaport", "not a port number"),
            ("localhost:70000", "not a port number"),
            ("localhost", "not host:port"),
            (":9464", "no host"),
            ("::1:9464", "in brackets"),
            ("[zz]:9464", "not an IPv6 address"),
        ] {
            let err = check_address(bad).unwrap_err();
            assert!(err.contains(why), "{bad}: {err}");
        }
    }

    #[test]
    fn bare_policy_names_are_modules_of_the_policy_directory() {
        let mut dp = DevicePluginSection::default();
        assert_eq!(
            policy_module(Path::new("numa-pack"), &dp),
            PolicyModule::File(Path::new("numa-pack"))
        );
        dp.policy_dir = Some("/etc/kubedev/policies".into());
        assert_eq!(
            policy_module(Path::new("numa-pack"), &dp),
            PolicyModule::InDir {
                dir: Path::new("/etc/kubedev/policies"),
                name: "numa-pack"
            }
        );
        for file in ["numa-pack.wasm", "./numa-pack", "/p/numa-pack"] {
            assert_eq!(
                policy_module(Path::new(file), &dp),
                PolicyModule::File(Path::new(file))
            );
        }
    }
}
