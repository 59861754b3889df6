//! Selection policies for device-plugin resources (`GetPreferredAllocation`): WebAssembly
//! modules run in the sandbox when the `wasm` feature is on; without it, configuration that names
//! a policy is refused.

#[cfg(feature = "wasm")]
mod imp {
    use std::path::PathBuf;
    use std::sync::Arc;
    use std::time::Duration;

    use anyhow::Context as _;
    use kubedev_core::{DeviceRef, Inventory};
    use kubedev_kubelet_grpc::device_plugin::{PreferenceRequest, ResourceDevices};

    use crate::config::{DevicePluginSection, PolicyModule, ResourceSpec, policy_module};
    use crate::metrics::Metrics;

    /// Where a resource's selection policy comes from.
    pub(crate) enum PolicySource {
        /// A module loaded once at start.
        Fixed(kubedev_sandbox::WasmPolicy),
        /// A module of the watched policy directory, looked up at every call so a reload takes
        /// effect at once (a bad new module leaves the old one in place).
        Dir(Arc<kubedev_sandbox::PolicyDir>, String),
    }

    impl PolicySource {
        fn current(&self) -> Option<kubedev_sandbox::WasmPolicy> {
            match self {
                PolicySource::Fixed(p) => Some(p.clone()),
                PolicySource::Dir(dir, name) => dir.get(name),
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
            let domain = resource
                .name()
                .as_str()
                .split('/')
                .next()
                .unwrap_or_default()
                .to_string();
            let refs: Vec<DeviceRef> = request
                .available
                .iter()
                .map(|id| request.device(id).map(|d| d.device.clone()))
                .collect::<Option<_>>()?;
            let mut candidates = Vec::with_capacity(refs.len());
            for r in &refs {
                let device = inventory.device(r)?;
                candidates.push(kubedev_sandbox::Candidate::inventory(
                    &domain,
                    r.pool.as_str(),
                    device,
                ));
            }
            let claim = format!("device-plugin/{}", resource.name());
            let input = kubedev_sandbox::PolicyInput::new(&claim, "", request.size, candidates);
            let must: Vec<usize> = request
                .must_include
                .iter()
                .filter_map(|m| request.available.iter().position(|a| a == m))
                .collect();
            let outcome = policy.evaluate(&input);
            metrics
                .policy_calls
                .get_or_create(&crate::metrics::PolicyLabels {
                    resource: resource.name().to_string(),
                    result: if outcome.is_ok() { "ok" } else { "error" }.to_string(),
                })
                .inc();
            if let Ok(eval) = &outcome {
                metrics
                    .policy_fuel
                    .get_or_create(&crate::metrics::ResourceLabels {
                        resource: resource.name().to_string(),
                    })
                    .observe(eval.fuel_used as f64);
            }
            match outcome {
                Ok(eval) => eval.decision.preferred(request.size, &must).map(|idx| {
                    idx.into_iter()
                        .map(|i| request.available[i].clone())
                        .collect()
                }),
                Err(e) => {
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
                    Ok(Some(PolicySource::Dir(dir, name.to_owned())))
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
                    Ok(Some(PolicySource::Fixed(policy)))
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
