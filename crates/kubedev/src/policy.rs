//! Selection policies for device-plugin resources (`GetPreferredAllocation`): WebAssembly
//! modules run in the sandbox when the `wasm` feature is on; without it, configuration that names
//! a policy is refused.

#[cfg(feature = "wasm")]
mod imp {
    use std::path::PathBuf;
    use std::sync::Arc;
    use std::time::Duration;

    use anyhow::Context as _;
    use kubedev_core::Inventory;
    use kubedev_kubelet_grpc::device_plugin::{PreferenceRequest, ResourceDevices};

    use crate::config::{DevicePluginSection, PolicyModule, ResourceSpec, policy_module};
    use crate::metrics::Metrics;

    /// Where a resource's selection policy comes from.
    enum Module {
        /// A module loaded once at start.
        Fixed(kubedev_sandbox::WasmPolicy),
        /// A module of the watched policy directory, looked up at every call so a reload takes
        /// effect at once (a bad new module leaves the old one in place).
        Dir(Arc<kubedev_sandbox::PolicyDir>, String),
    }

    /// A device-plugin resource's selection policy.
    pub(crate) struct PolicySource {
        module: Module,
        /// The resource's claim name and metric series, made at the first call.
        calls: std::sync::OnceLock<ResourceCalls>,
    }

    /// A resource's claim name as its policy is shown it, and its series of the policy metrics.
    struct ResourceCalls {
        /// `device-plugin/<resource>`.
        claim: String,
        ok: prometheus_client::metrics::counter::Counter,
        fuel: prometheus_client::metrics::histogram::Histogram,
    }

    impl PolicySource {
        fn new(module: Module) -> Self {
            PolicySource {
                module,
                calls: std::sync::OnceLock::new(),
            }
        }

        fn current(&self) -> Option<kubedev_sandbox::WasmPolicy> {
            match &self.module {
                Module::Fixed(p) => Some(p.clone()),
                Module::Dir(dir, name) => dir.get(name),
            }
        }

        /// The policy's choice for the kubelet's request, or `None` for the default (NUMA
        /// packing): no module (yet), or the module failed (logged and counted).
        pub(crate) fn choose(
            &self,
            resource: &ResourceDevices,
            inventory: &Inventory,
            request: &PreferenceRequest<'_>,
            metrics: &Metrics,
        ) -> Option<Vec<String>> {
            let policy = self.current()?;
            let name = resource.name().as_str();
            let calls = self.calls.get_or_init(|| ResourceCalls {
                claim: format!("device-plugin/{name}"),
                ok: metrics
                    .policy_calls
                    .get_or_create(&crate::metrics::PolicyLabels {
                        resource: name.to_string(),
                        result: "ok".to_string(),
                    })
                    .clone(),
                fuel: metrics
                    .policy_fuel
                    .get_or_create(&crate::metrics::ResourceLabels {
                        resource: name.to_string(),
                    })
                    .clone(),
            });
            let domain = name.split('/').next().unwrap_or_default();
            let mut candidates = Vec::with_capacity(request.available.len());
            for id in request.available {
                let r = &request.device(id)?.device;
                candidates.push(kubedev_sandbox::Candidate::inventory(
                    domain,
                    r.pool.as_str(),
                    inventory.device(r)?,
                ));
            }
            let input =
                kubedev_sandbox::PolicyInput::new(&calls.claim, "", request.size, candidates);
            let outcome = policy.evaluate(&input);
            match outcome {
                Ok(eval) => {
                    calls.ok.inc();
                    calls.fuel.observe(eval.fuel_used as f64);
                    let must: Vec<usize> = request
                        .must_include
                        .iter()
                        .filter_map(|m| request.available.iter().position(|a| a == m))
                        .collect();
                    eval.decision.preferred(request.size, &must).map(|idx| {
                        idx.into_iter()
                            .map(|i| request.available[i].clone())
                            .collect()
                    })
                }
                Err(e) => {
                    metrics
                        .policy_calls
                        .get_or_create(&crate::metrics::PolicyLabels {
                            resource: name.to_string(),
                            result: "error".to_string(),
                        })
                        .inc();
                    tracing::warn!(resource = %resource.name(), error = %kubedev_core::echo::Chain(&e), "selection policy failed; using NUMA packing");
                    None
                }
            }
        }
    }

    /// How often the policy directory is read again when nothing was noticed: a safety net
    /// where inotify works, the only way to notice changes where it does not.
    const POLICY_RESYNC: Duration = Duration::from_secs(60);
    const POLICY_POLL: Duration = Duration::from_secs(2);

    /// Loads the policy directory at once (compiling off the async threads), then again
    /// whenever a file in it is created, replaced, written or removed, until `stop`.
    async fn watch_policy_dir(
        dir: Arc<kubedev_sandbox::PolicyDir>,
        path: PathBuf,
        stop: tokio_util::sync::CancellationToken,
    ) {
        let mut watch = kubedev_core::dirwatch::DirWatch::new().noticing_writes();
        loop {
            // Watched again after every wake-up: a directory re-created meanwhile is followed.
            watch.watch(&path);
            let loading = dir.clone();
            if kubedev_core::blocking(move || loading.reload())
                .await
                .is_err()
            {
                return;
            }
            let resync = if watch.is_polling() {
                POLICY_POLL
            } else {
                POLICY_RESYNC
            };
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = watch.wait(resync) => {}
            }
        }
    }

    /// Where device-plugin resources get their selection policies: one sandbox, and the
    /// watched policy directory once a resource names a module in it.
    #[derive(Default)]
    pub(crate) struct PolicyState {
        sandbox: Option<kubedev_sandbox::Sandbox>,
        dir: Option<(PathBuf, Arc<kubedev_sandbox::PolicyDir>)>,
        /// Stops the policy directory's watcher when dropped.
        watch: Option<tokio_util::sync::DropGuard>,
    }

    impl PolicyState {
        /// The policy of resource `r`, loaded (a failure names the resource and the module).
        /// A module of the policy directory is compiled on the directory's own thread, so this
        /// does not wait for it; a single module file is compiled off the async threads (within
        /// the sandbox's compile timeout), and `cancel` (a signal) stops the wait at once.
        pub(crate) async fn load(
            &mut self,
            r: &ResourceSpec,
            dp: &DevicePluginSection,
            cancel: &tokio_util::sync::CancellationToken,
        ) -> anyhow::Result<Option<PolicySource>> {
            let Some(path) = &r.policy else {
                return Ok(None);
            };
            if self.sandbox.is_none() {
                self.sandbox = Some(kubedev_sandbox::Sandbox::new(
                    kubedev_sandbox::Limits::default(),
                )?);
            }
            let sb = self.sandbox.as_ref().context("sandbox missing")?;
            match policy_module(path, dp) {
                PolicyModule::InDir { dir, name } => {
                    if self.dir.as_ref().is_none_or(|(p, _)| p != dir) {
                        // Off the start-up path: the watcher compiles the modules.
                        let opened = kubedev_sandbox::PolicyDir::open_deferred(sb, dir)
                            .with_context(|| format!("devicePlugin.policyDir {}", dir.display()))?;
                        let opened = Arc::new(opened);
                        let stop = tokio_util::sync::CancellationToken::new();
                        tokio::spawn(watch_policy_dir(
                            opened.clone(),
                            dir.to_path_buf(),
                            stop.clone(),
                        ));
                        self.watch = Some(stop.drop_guard());
                        self.dir = Some((dir.to_path_buf(), opened));
                    }
                    let dir = self
                        .dir
                        .as_ref()
                        .map(|(_, d)| d.clone())
                        .context("policy directory missing")?;
                    if dir.get(name).is_none() {
                        tracing::info!(resource = %r.name, policy = %name, "NUMA packing until the policy is loaded from the policy directory");
                    }
                    Ok(Some(PolicySource::new(Module::Dir(dir, name.to_owned()))))
                }
                PolicyModule::File(path) => {
                    let context = || {
                        format!(
                            "devicePlugin resource {}: loading the selection policy {}",
                            r.name,
                            path.display()
                        )
                    };
                    let (sb, file) = (sb.clone(), path.to_path_buf());
                    let loading = kubedev_core::blocking(move || sb.load_file(&file));
                    let policy = tokio::select! {
                        loaded = loading => loaded.context("the policy loader failed")?.with_context(context)?,
                        _ = cancel.cancelled() => anyhow::bail!("stopped while {}", context()),
                    };
                    Ok(Some(PolicySource::new(Module::Fixed(policy))))
                }
            }
        }
    }
}

#[cfg(not(feature = "wasm"))]
mod imp {
    use kubedev_core::Inventory;
    use kubedev_kubelet_grpc::device_plugin::{PreferenceRequest, ResourceDevices};

    use crate::config::{DevicePluginSection, ResourceSpec};
    use crate::metrics::Metrics;

    /// No policy can exist in a build without the `wasm` feature.
    pub(crate) enum PolicySource {}

    impl PolicySource {
        pub(crate) fn choose(
            &self,
            _: &ResourceDevices,
            _: &Inventory,
            _: &PreferenceRequest<'_>,
            _: &Metrics,
        ) -> Option<Vec<String>> {
            match *self {}
        }
    }

    /// Refuses every policy: this build has no WebAssembly sandbox.
    #[derive(Default)]
    pub(crate) struct PolicyState;

    impl PolicyState {
        pub(crate) async fn load(
            &mut self,
            r: &ResourceSpec,
            _: &DevicePluginSection,
            _: &tokio_util::sync::CancellationToken,
        ) -> anyhow::Result<Option<PolicySource>> {
            match &r.policy {
                None => Ok(None),
                Some(p) => anyhow::bail!(
                    "devicePlugin resource {}: policy {}: this kubedev was built without the \
                     `wasm` feature",
                    r.name,
                    p.display()
                ),
            }
        }
    }
}

pub(crate) use imp::{PolicySource, PolicyState};
