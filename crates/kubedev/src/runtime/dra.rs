//! DRA mode: the driver and its plugin, recovery reporting and the API feature report.

use super::*;

pub(super) struct Dra {
    pub(super) driver: String,
    pub(super) handle: DraPluginHandle,
    pub(super) health: watch::Sender<Vec<DeviceHealthReport>>,
    pub(super) slices: Arc<dyn Publisher>,
    /// The driver itself, for work outside the kubelet's calls (rewriting specs whose edits
    /// changed).
    pub(super) prepared: Arc<DraDriver>,
}

pub(super) async fn start_dra(
    config: &Config,
    config_path: &Path,
    backends: &Backends,
    inventory: &Arc<parking_lot::RwLock<Inventory>>,
    cluster: Option<ClusterServices>,
    cancel: &CancellationToken,
    obs: &Observe,
) -> anyhow::Result<Option<Dra>> {
    let Some(spec) = config.dra(config_path, |k| std::env::var(k).ok())? else {
        return Ok(None);
    };
    let cluster = cluster.context("DRA mode needs the API server, and none was configured")?;
    kubedev_core::safefs::create_private_dir_all(&spec.state_dir)
        .with_context(|| format!("creating {}", spec.state_dir.display()))?;
    let (state_dir, boot) = (spec.state_dir.clone(), spec.boot_id_path.clone());
    let (store, outcome) = kubedev_core::blocking(move || CheckpointStore::open(&state_dir, &boot))
        .await?
        .context("opening the checkpoint")?;
    match &outcome {
        crate::checkpoint::LoadOutcome::Corrupt { .. } => {
            tracing::error!(checkpoint = %store.path().display(), "{outcome}");
        }
        _ => tracing::info!(checkpoint = %store.path().display(), "{outcome}"),
    }
    let cdi = CdiWriter::new(&spec.cdi_dir, &spec.driver);
    let mut driver = DraDriver::new(backends.clone(), cluster.claims.clone(), store, cdi)
        .with_metrics(obs.metrics.clone())
        .with_inventory(inventory.clone());
    if spec.device_metadata {
        driver = driver.with_metadata(crate::metadata::MetadataWriter::new(
            &spec.plugin_dir,
            &spec.cdi_dir,
            &spec.driver,
        ));
    }
    let driver = Arc::new(driver);
    let rec = driver
        .recover(&outcome)
        .await
        .context("start-up recovery")?;
    report_recovery(&rec, spec.driver.as_ref(), cluster.events.as_ref(), obs).await;
    if rec.retry_later {
        tokio::spawn(finish_recovery(
            driver.clone(),
            backends.failed_discoveries(),
            obs.metrics.clone(),
            obs.probes.clone(),
            cancel.child_token(),
        ));
    }
    let (health, health_rx) = watch::channel(Vec::new());
    let mut cfg = DraPluginConfig::new(spec.driver.clone())
        .plugin_dir(&spec.plugin_dir)
        .registry_dir(&spec.registry_dir)
        .health(spec.health)
        .observe_requests(obs.metrics.request_observer());
    if let Some(uid) = &spec.pod_uid {
        cfg = cfg.pod_uid(uid);
    }
    let in_use = driver.clone();
    let in_use_driver = driver.clone();
    let handle = DraPlugin::start(cfg, driver, health_rx, cancel.child_token())
        .context("starting the DRA plugin")?;
    tracing::info!(driver = %spec.driver, socket = %handle.dra_socket().display(), "DRA plugin started");
    obs.probes.add_socket(handle.dra_socket().to_path_buf());
    obs.probes
        .add_socket(handle.registration_socket().to_path_buf());
    obs.probes
        .set_dra(spec.driver.to_string(), handle.watch_status());
    obs.probes.set_slices(cluster.slices.clone());
    obs.metrics.track_slice_writes(cluster.slices.clone());
    if let Some(api) = &cluster.api {
        api.set_in_use(move |pool, device| in_use.device_in_use(pool, device));
        tokio::spawn(report_api_features(
            api.subscribe(),
            spec.driver.to_string(),
            cluster.events.clone(),
            obs.clone(),
            cancel.child_token(),
        ));
    }
    count_registrations(
        &obs.metrics,
        "dra",
        spec.driver.to_string(),
        handle.watch_status(),
        |s| (s.registrations, s.registered),
    );
    Ok(Some(Dra {
        driver: spec.driver.to_string(),
        handle,
        health,
        slices: cluster.slices,
        prepared: in_use_driver,
    }))
}

/// Reports each gated API feature the published devices need and the API server drops, as
/// long as that lasts: an ERROR line when it starts (INFO when it ends), the
/// `kubedev_api_feature_unavailable` gauge, a `FeatureUnavailable` Warning Event on the Node and
/// a `/readyz` note saying what was published instead.
pub(super) async fn report_api_features(
    mut reports: watch::Receiver<kubedev_apiserver::ApiReport>,
    driver: String,
    events: Option<kubedev_apiserver::NodeEvents>,
    obs: Observe,
    cancel: CancellationToken,
) {
    let mut shown: std::collections::BTreeMap<
        kubedev_apiserver::ApiFeature,
        kubedev_apiserver::Degradation,
    > = Default::default();
    loop {
        let report = reports.borrow_and_update().clone();
        let version = report
            .version
            .as_ref()
            .map(|v| format!("Kubernetes {v} ({})", v.git_version))
            .unwrap_or_else(|| "the API server".into());
        for (feature, d) in &report.degraded {
            if shown.get(feature) == Some(d) {
                continue;
            }
            let summary = format!(
                "DRA driver {driver} needs {} (feature gate {}), but {}. Instead: {}.",
                feature.fields(),
                feature.gate(),
                d.found,
                d.action
            );
            tracing::error!(feature = feature.gate(), server = %version, "{summary}");
            obs.metrics
                .api_feature_unavailable
                .get_or_create(&crate::metrics::FeatureLabels {
                    feature: feature.gate().into(),
                })
                .set(1);
            obs.probes.set_notice(
                &format!("api-feature/{}", feature.gate()),
                Some(summary.clone()),
            );
            if let Some(events) = &events
                && let Err(e) = events.warn("FeatureUnavailable", "Publish", &summary).await
            {
                tracing::warn!(error = %kubedev_core::echo::Chain(&e), "could not record the missing API feature as an Event");
            }
        }
        for feature in shown.keys() {
            if !report.degraded.contains_key(feature) {
                tracing::info!(
                    feature = feature.gate(),
                    server = %version,
                    "the API server keeps {} again (or nothing published needs them); publishing everything",
                    feature.fields()
                );
                obs.metrics
                    .api_feature_unavailable
                    .get_or_create(&crate::metrics::FeatureLabels {
                        feature: feature.gate().into(),
                    })
                    .set(0);
                obs.probes
                    .set_notice(&format!("api-feature/{}", feature.gate()), None);
            }
        }
        shown = report.degraded.clone();
        tokio::select! {
            _ = cancel.cancelled() => return,
            changed = reports.changed() => if changed.is_err() { return },
        }
    }
}

/// Logs, counts and (after a lost checkpoint) reports to the cluster what start-up recovery
/// did: an ERROR log, the `kubedev_dra_recovery_total` metric, a Warning Event on the Node and
/// a line on `/readyz`.
pub(super) async fn report_recovery(
    rec: &crate::dra_driver::Recovery,
    driver: &str,
    events: Option<&kubedev_apiserver::NodeEvents>,
    obs: &Observe,
) {
    let count = |outcome: &str, n: usize| {
        if n > 0 {
            obs.metrics
                .recovery
                .get_or_create(&crate::metrics::RecoveryLabels {
                    outcome: outcome.into(),
                })
                .inc_by(n as u64);
        }
    };
    count("rolled_back", rec.rolled_back.len());
    count("cdi_repaired", rec.cdi_repaired.len());
    count("cdi_removed", rec.cdi_removed.len());
    count("rebuilt", rec.rebuilt.len());
    count("rebuild_failed", rec.rebuild_failed.len());
    count("kept_unverified", rec.kept_unverified.len());
    let Some(lost) = &rec.checkpoint_lost else {
        if rec != &Default::default() {
            tracing::warn!(rolled_back = ?rec.rolled_back, cdi_repaired = ?rec.cdi_repaired, cdi_removed = ?rec.cdi_removed, cdi_temp_removed = ?rec.cdi_temp_removed, left_to_other_instance = ?rec.left_to_other_instance, "recovered from an unclean stop");
        }
        return;
    };
    count("checkpoint_lost", 1);
    let mut summary = format!(
        "DRA driver {driver} lost its record of prepared claims ({lost}). Rebuilt {} claim(s) from the API server",
        rec.rebuilt.len()
    );
    if !rec.rebuild_failed.is_empty() {
        summary.push_str(&format!(
            "; {} could not be prepared again ({})",
            rec.rebuild_failed.len(),
            rec.rebuild_failed
                .iter()
                .map(|(uid, e)| format!("{uid}: {e}"))
                .collect::<Vec<_>>()
                .join("; ")
        ));
    }
    if let Some(e) = &rec.cluster_error {
        summary.push_str(&format!(
            "; the API server could not be asked ({e}), so {} CDI spec(s) with no record were kept unverified",
            rec.kept_unverified.len()
        ));
    }
    summary.push_str(&format!(
        "; removed {} CDI spec(s) of claims the API server no longer lists as reserved on this node.",
        rec.cdi_removed.len()
    ));
    tracing::error!(
        rebuilt = ?rec.rebuilt,
        rebuild_failed = ?rec.rebuild_failed,
        kept_unverified = ?rec.kept_unverified,
        cdi_removed = ?rec.cdi_removed,
        cdi_repaired = ?rec.cdi_repaired,
        "{summary}"
    );
    obs.probes.add_notice(summary.clone());
    if let Some(events) = events
        && let Err(e) = events.warn("CheckpointLost", "Recover", &summary).await
    {
        tracing::warn!(error = %kubedev_core::echo::Chain(&e), "could not record the lost checkpoint as an Event");
    }
}

/// After a lost checkpoint whose rebuild could not ask the API server, or could not prepare a
/// claim again for a reason that may pass: tries again, 5 s after start and then with the wait
/// doubling up to 5 minutes, and at once when a backend's discovery fails or succeeds (the pools
/// it serves may have come back), until nothing is left to retry; logs and counts what each try
/// rebuilt and removed, and updates the `/readyz` note.
pub(super) async fn finish_recovery(
    driver: Arc<DraDriver>,
    mut discoveries: watch::Receiver<std::collections::BTreeSet<usize>>,
    metrics: Arc<Metrics>,
    probes: Arc<Probes>,
    cancel: CancellationToken,
) {
    let mut wait = Duration::from_secs(5);
    loop {
        let discovered = tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(wait) => false,
            Ok(()) = discoveries.changed() => true,
        };
        if !discovered {
            wait = (wait * 2).min(Duration::from_secs(300));
        }
        let rec = match driver.retry_rebuild().await {
            Ok(rec) if rec.cluster_error.is_none() => rec,
            Ok(rec) => {
                tracing::debug!(error = ?rec.cluster_error, "the API server still cannot list the claims to rebuild");
                continue;
            }
            Err(e) => {
                tracing::warn!(error = %kubedev_core::echo::Chain(&e), "finishing the recovery of a lost checkpoint failed; trying again");
                continue;
            }
        };
        for (outcome, n) in [
            ("rebuilt", rec.rebuilt.len()),
            ("rebuild_failed", rec.rebuild_failed.len()),
            ("cdi_removed", rec.cdi_removed.len()),
        ] {
            if n > 0 {
                metrics
                    .recovery
                    .get_or_create(&crate::metrics::RecoveryLabels {
                        outcome: outcome.into(),
                    })
                    .inc_by(n as u64);
            }
        }
        let summary = format!(
            "the API server answered: rebuilt {} more claim(s), {} could not be prepared again, removed {} CDI spec(s) of claims it does not list as reserved on this node",
            rec.rebuilt.len(),
            rec.rebuild_failed.len(),
            rec.cdi_removed.len()
        );
        if rec.retry_later {
            tracing::warn!(rebuilt = ?rec.rebuilt, rebuild_failed = ?rec.rebuild_failed, cdi_removed = ?rec.cdi_removed, "the recovery of a lost checkpoint is not finished: {summary}; trying again");
            continue;
        }
        tracing::warn!(rebuilt = ?rec.rebuilt, rebuild_failed = ?rec.rebuild_failed, cdi_removed = ?rec.cdi_removed, "finished the recovery of a lost checkpoint: {summary}");
        probes.add_notice(format!("recovery finished later: {summary}"));
        return;
    }
}
