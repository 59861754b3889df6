//! Applying a changed configuration while the daemon runs: what must change is worked out
//! first (everything that can fail), then the backends and device-plugin resources that
//! changed are swapped; the rest keeps serving.

use super::*;
use crate::config::{ResourceConfig, ResourceSpec};

/// What a new configuration changes, worked out before anything changes.
struct ReloadPlan {
    /// The device-plugin resources the new configuration serves, by name.
    wanted: BTreeMap<String, (ResourceSpec, ResourceConfig)>,
    /// Running resources to stop: gone, changed, or every one when a section-wide setting
    /// changed.
    to_stop: Vec<String>,
    /// Resources to start, with their loaded policies.
    to_start: Vec<(ResourceSpec, ResourceConfig, Option<PolicySource>)>,
    /// Backend slots whose section changed: the slot, the kind and the new backend (none when
    /// the kind is no longer configured).
    rebuilt: Vec<(usize, String, Option<Backend>)>,
    /// Sections whose change takes effect at the next restart.
    restart_needed: Vec<&'static str>,
}

/// Whether a setting of the whole `devicePlugin` section changed, so every resource restarts.
fn device_plugin_section_changed(old: &Config, new: &Config) -> bool {
    let (a, b) = (&old.device_plugin, &new.device_plugin);
    a.enabled != b.enabled
        || a.directory != b.directory
        || a.kubelet_socket != b.kubelet_socket
        || a.cdi != b.cdi
        || a.cdi_dir != b.cdi_dir
        || a.policy_dir != b.policy_dir
}

impl Running {
    /// Applies a new configuration: backends whose section changed are rebuilt (the others keep
    /// running), device-plugin resources that were added, removed or changed are started or
    /// stopped (the others keep serving). Everything that can fail — building backends, loading
    /// policies — happens before anything changes, so an error leaves the running set as it
    /// was. Changes to `dra`, `metrics` and `nodeName` in DRA mode take effect at the next
    /// restart; they are logged. Returns a summary of what changed.
    pub(super) async fn reload(
        &mut self,
        new: Config,
        sh: &Shared<'_>,
        watchers: &mut JoinSet<()>,
        tx: &mpsc::Sender<(usize, Watched)>,
    ) -> anyhow::Result<String> {
        let plan = self.plan_reload(&new, sh).await?;
        let mut summary = self.swap_backends(plan.rebuilt, sh, watchers, tx).await;
        summary.extend(
            self.swap_resources(plan.wanted, plan.to_stop, plan.to_start, &new, sh)
                .await?,
        );
        if !plan.restart_needed.is_empty() {
            tracing::warn!(
                sections = ?plan.restart_needed,
                "these configuration changes take effect at the next restart"
            );
        }
        self.config = new;
        self.publish(sh.obs).await;
        Ok(if summary.is_empty() {
            "nothing to change".to_string()
        } else {
            summary.join(", ")
        })
    }

    /// Everything that can fail, before anything changes: the new resources and their
    /// policies, then the changed backends (last, since building one may act on the host: the
    /// vGPU type manager).
    async fn plan_reload(&mut self, new: &Config, sh: &Shared<'_>) -> anyhow::Result<ReloadPlan> {
        let old = &self.config;
        let resources = new.resources(&self.path)?;
        let section_changed = device_plugin_section_changed(old, new);
        let wanted: BTreeMap<String, (ResourceSpec, ResourceConfig)> = if new.device_plugin.enabled
        {
            resources
                .into_iter()
                .zip(new.device_plugin.resources.iter().cloned())
                .map(|(r, raw)| (r.name.to_string(), (r, raw)))
                .collect()
        } else {
            BTreeMap::new()
        };
        let to_stop: Vec<String> = self
            .dps
            .servers
            .iter()
            .filter(|(name, s)| {
                section_changed || wanted.get(*name).is_none_or(|(_, raw)| *raw != s.config)
            })
            .map(|(name, _)| name.clone())
            .collect();
        let mut to_start = Vec::new();
        for (name, (r, raw)) in &wanted {
            if self.dps.servers.contains_key(name) && !to_stop.contains(name) {
                continue;
            }
            let policy = self
                .dps
                .policies
                .load(r, &new.device_plugin, sh.cancel)
                .await?;
            to_start.push((r.clone(), raw.clone(), policy));
        }
        let mut rebuilt = Vec::new();
        for (slot, kind) in new.registry.kinds().enumerate() {
            if backend_changed(old, new, kind) {
                rebuilt.push((
                    slot,
                    kind.to_owned(),
                    build_backend(new, kind, BuildMode::Serve)?,
                ));
            }
        }
        let mut restart_needed = Vec::new();
        if old.dra != new.dra {
            restart_needed.push("dra");
        }
        if old.metrics != new.metrics {
            restart_needed.push("metrics");
        }
        if old.node_name != new.node_name && self.dra.is_some() {
            restart_needed.push("nodeName");
        }
        Ok(ReloadPlan {
            wanted,
            to_stop,
            to_start,
            rebuilt,
            restart_needed,
        })
    }

    /// Swaps the rebuilt backends in: stops each old watcher, swaps the slot, discovers it
    /// again and watches it. Returns what it did, for the summary.
    async fn swap_backends(
        &mut self,
        rebuilt: Vec<(usize, String, Option<Backend>)>,
        sh: &Shared<'_>,
        watchers: &mut JoinSet<()>,
        tx: &mpsc::Sender<(usize, Watched)>,
    ) -> Vec<String> {
        let mut summary = Vec::new();
        for (slot, kind, backend) in rebuilt {
            if let Some(stop) = self.watcher_stops.remove(&slot) {
                stop.cancel();
            }
            let present = backend.is_some();
            sh.backends.set(slot, backend.clone());
            self.rediscover(sh.backends, slot).await;
            self.clock.clear_stale(slot);
            if let Some(b) = &backend {
                let stop = sh.cancel.child_token();
                spawn_watcher(watchers, slot, b, sh.backends, tx.clone(), stop.clone());
                self.watcher_stops.insert(slot, stop);
            }
            summary.push(format!(
                "backend {kind} {}",
                if present { "(re)started" } else { "stopped" }
            ));
        }
        if let Some(dra) = self.dra.as_ref().filter(|_| !summary.is_empty()) {
            // Rebuilt backends may give prepared claims other edits or other device data.
            let driver = dra.prepared.clone();
            tokio::spawn(async move { driver.refresh_edits().await });
        }
        summary
    }

    /// Stops the resources of `to_stop` and starts those of `to_start`. Returns what it did,
    /// for the summary.
    async fn swap_resources(
        &mut self,
        wanted: BTreeMap<String, (ResourceSpec, ResourceConfig)>,
        to_stop: Vec<String>,
        to_start: Vec<(ResourceSpec, ResourceConfig, Option<PolicySource>)>,
        new: &Config,
        sh: &Shared<'_>,
    ) -> anyhow::Result<Vec<String>> {
        let mut summary = Vec::new();
        for name in &to_stop {
            self.dps.stop(name, sh.obs).await;
            if !wanted.contains_key(name) {
                summary.push(format!("resource {name} stopped"));
            }
        }
        let started: Vec<String> = to_start.iter().map(|(r, ..)| r.name.to_string()).collect();
        // Resources started or stopped: the selection is made again at the next publish.
        self.selection = None;
        if !to_start.is_empty() {
            let snapshot = self.inventory.read().clone();
            self.dps
                .start(to_start, &new.device_plugin, &snapshot, sh)
                .await?;
            summary.extend(started.iter().map(|n| format!("resource {n} started")));
        }
        Ok(summary)
    }
}
