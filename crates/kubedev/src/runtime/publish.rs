//! Publishing an inventory to both APIs: which API owns each device, the health clock of the
//! DRA health stream, and the held-device metrics.

use super::*;

/// How long the kubelet keeps a device's health without a new report before it shows
/// `Unknown`; the health stream repeats its snapshot well within it.
pub(super) const HEALTH_TIMEOUT_SECONDS: i64 = 30;

/// Health of every device with the time it last changed, for the DRA health stream, and the
/// pools whose backend's watch has failed: their devices are reported `Unknown` until the
/// backend is discovered again.
#[derive(Debug, Default)]
pub(super) struct HealthClock {
    since: HashMap<DeviceRef, (Health, i64)>,
    /// Pool → (backend slot, why its health is unknown).
    stale: HashMap<PoolName, (usize, String)>,
}

impl HealthClock {
    /// Reports the devices of `pools` (slot `slot`'s) as `Unknown`, for `why`.
    pub(super) fn set_stale(&mut self, slot: usize, pools: &[PoolName], why: String) {
        for p in pools {
            self.stale.insert(p.clone(), (slot, why.clone()));
        }
    }

    /// Reports slot `slot`'s devices as the backend says again; true when any were stale.
    pub(super) fn clear_stale(&mut self, slot: usize) -> bool {
        let before = self.stale.len();
        self.stale.retain(|_, (s, _)| *s != slot);
        self.stale.len() != before
    }

    pub(super) fn reports(&mut self, inventory: &Inventory) -> Vec<DeviceHealthReport> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
            .unwrap_or(0);
        let mut seen = HashMap::new();
        let mut out = Vec::new();
        for (pool, dev) in inventory.devices() {
            let r = DeviceRef::new(pool.name.clone(), dev.name.clone());
            let health = match self.stale.get(&pool.name) {
                Some((_, why)) => Health::unknown(why.clone()),
                None => dev.health.clone(),
            };
            let since = match self.since.get(&r) {
                Some((h, t)) if *h == health => *t,
                _ => now,
            };
            out.push(DeviceHealthReport {
                pool: pool.name.to_string(),
                device: dev.name.to_string(),
                health: health.clone(),
                last_updated: since,
                timeout_seconds: HEALTH_TIMEOUT_SECONDS,
            });
            seen.insert(r, (health, since));
        }
        self.since = seen;
        out
    }
}

/// The inventory DRA publishes: every device no device-plugin resource takes (by `selection`,
/// made for this inventory), so the scheduler never hands one device to a device-plugin pod and
/// a DRA claim. Without a selection, all of it.
pub(super) fn dra_view(inventory: &Inventory, selection: Option<&Selection>) -> Inventory {
    let Some(selection) = selection.filter(|s| !s.is_empty()) else {
        return inventory.clone();
    };
    let taken = selection.taken_by_any();
    let pools = inventory
        .pools
        .iter()
        .zip(taken)
        .map(|(pool, taken)| {
            let mut kept = Pool::new(pool.name.clone(), Vec::new());
            kept.shared_counters = pool.shared_counters.clone();
            kept.devices = pool
                .devices
                .iter()
                .zip(taken)
                .filter(|(_, taken)| !taken)
                .map(|(d, _)| d.clone())
                .collect();
            kept
        })
        .collect();
    Inventory::new(pools)
}

/// Counts what the device-plugin publisher published (`dp`, with the result of its publish),
/// publishes the DRA `view` to the slices and the DRA health stream, and counts devices by
/// API, resource, pool and health.
pub(super) async fn publish_all(
    dp_published: Option<Result<(), kubedev_core::PublishError>>,
    dp: Option<&DevicePluginPublisher>,
    dra: Option<&Dra>,
    view: Option<Arc<Inventory>>,
    clock: &mut HealthClock,
    obs: &Observe,
) {
    obs.metrics.devices.clear();
    if let Some(Err(e)) = &dp_published {
        tracing::error!(error = %kubedev_core::echo::Chain(e), "device-plugin publishing failed");
    }
    if let Some(p) = dp {
        count_device_plugin_devices(p, obs);
    }
    let (Some(dra), Some(view)) = (dra, view) else {
        return;
    };
    for pool in &view.pools {
        let mut counts: std::collections::BTreeMap<String, i64> = Default::default();
        for d in &pool.devices {
            *counts.entry(d.health.state.to_string()).or_default() += 1;
        }
        for (health, n) in counts {
            obs.metrics
                .devices
                .get_or_create(&crate::metrics::DeviceLabels {
                    api: "dra".into(),
                    resource: dra.driver.clone(),
                    pool: pool.name.to_string(),
                    health,
                })
                .set(n);
        }
    }
    let reports = clock.reports(&view);
    let published = dra.slices.publish_shared(view).await;
    obs.metrics
        .slice_publishes
        .get_or_create(&crate::metrics::ResultLabels {
            result: if published.is_ok() { "ok" } else { "error" }.into(),
        })
        .inc();
    obs.probes.set_published(published.is_ok());
    if let Err(e) = published {
        tracing::error!(error = %kubedev_core::echo::Chain(&e), "ResourceSlice publishing failed");
    }
    dra.health.send_replace(reports);
}

/// Counts each device-plugin resource's devices by pool and health into the devices metric.
fn count_device_plugin_devices(p: &DevicePluginPublisher, obs: &Observe) {
    for r in p.resources() {
        let mut counts: std::collections::BTreeMap<(String, String), i64> = Default::default();
        for d in r.subscribe().borrow().iter() {
            let pool = d.device.pool.to_string();
            *counts
                .entry((pool, d.health.state.to_string()))
                .or_default() += 1;
        }
        for ((pool, health), n) in counts {
            obs.metrics
                .devices
                .get_or_create(&crate::metrics::DeviceLabels {
                    api: "device-plugin".into(),
                    resource: r.name().to_string(),
                    pool,
                    health,
                })
                .set(n);
        }
    }
}

/// Counts the kubelet's accepted registrations of one server into the registrations metric and
/// keeps the registered gauge at the server's state; `state` reads the server's status as its
/// registration count and whether it is registered now. The gauge's series goes when the server
/// does.
pub(super) fn count_registrations<S: Send + Sync + 'static>(
    metrics: &Arc<Metrics>,
    api: &'static str,
    resource: String,
    mut status: watch::Receiver<S>,
    state: fn(&S) -> (u64, bool),
) {
    let metrics = metrics.clone();
    tokio::spawn(async move {
        let labels = crate::metrics::RegistrationLabels {
            api: api.into(),
            resource,
        };
        let mut seen = 0u64;
        loop {
            let (now, registered) = state(&status.borrow_and_update());
            if now > seen {
                metrics
                    .registrations
                    .get_or_create(&labels)
                    .inc_by(now - seen);
                seen = now;
            }
            metrics
                .registered
                .get_or_create(&labels)
                .set(i64::from(registered));
            if status.changed().await.is_err() {
                break;
            }
        }
        metrics.registered.remove(&labels);
    });
}

/// Keeps the held-devices metric current from the kubelet's pod resources API, so device metrics
/// carry pod, namespace and container labels. A missing socket is skipped quietly (the kubelet
/// may not serve it, or may be restarting); other failures are logged once per change.
pub(super) async fn watch_holders(
    config: Config,
    metrics: Arc<Metrics>,
    cancel: CancellationToken,
) {
    use kubedev_kubelet_grpc::pod_resources::{Holding, PodResourcesClient, device_uses};
    let socket = config.metrics.pod_resources_socket.clone();
    let every = Duration::from_secs(config.metrics.pod_resources_interval_seconds.max(1));
    let mut last_error: Option<String> = None;
    loop {
        if socket.exists() {
            let listed = async {
                let mut c = PodResourcesClient::connect(&socket, Duration::from_secs(5)).await?;
                c.list().await
            }
            .await;
            match listed {
                Ok(pods) => {
                    last_error = None;
                    let rows = crate::who_uses::filter(device_uses(&pods), Some(&config), &[]);
                    metrics.held_devices.clear();
                    for r in rows {
                        let (api, resource, device) = match r.holding {
                            Holding::DevicePlugin { resource, device } => {
                                ("device-plugin", resource, device)
                            }
                            Holding::Dra {
                                driver,
                                pool,
                                device,
                                ..
                            } => ("dra", driver, format!("{pool}/{device}")),
                        };
                        metrics
                            .held_devices
                            .get_or_create(&crate::metrics::HolderLabels {
                                api: api.into(),
                                resource,
                                device,
                                namespace: r.namespace,
                                pod: r.pod,
                                container: r.container,
                            })
                            .set(1);
                    }
                }
                Err(e) => {
                    let e = kubedev_core::echo::chain(&e);
                    if last_error.as_deref() != Some(e.as_str()) {
                        tracing::warn!(error = %e, "reading the kubelet's pod resources failed");
                        last_error = Some(e);
                    }
                }
            }
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// Polls the encoded metrics until `want` holds, for at most a few seconds.
    async fn eventually(metrics: &Metrics, want: impl Fn(&str) -> bool) -> String {
        for _ in 0..200 {
            let text = metrics.encode();
            if want(&text) {
                return text;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        metrics.encode()
    }

    #[tokio::test]
    async fn registered_follows_the_servers_state_and_goes_with_it() {
        let metrics = Metrics::new();
        let (tx, rx) = watch::channel((0u64, false));
        count_registrations(&metrics, "dra", "gpu.example.com".into(), rx, |s| *s);
        let series = "kubedev_kubelet_registered{api=\"dra\",resource=\"gpu.example.com\"}";
        let text = eventually(&metrics, |t| t.contains(&format!("{series} 0"))).await;
        assert!(text.contains(&format!("{series} 0")), "{text}");

        tx.send_replace((1, true));
        let text = eventually(&metrics, |t| t.contains(&format!("{series} 1"))).await;
        assert!(text.contains(&format!("{series} 1")), "{text}");
        assert!(
            text.contains(
                "kubedev_kubelet_registrations_total{api=\"dra\",resource=\"gpu.example.com\"} 1"
            ),
            "{text}"
        );

        // The kubelet dropped the registration.
        tx.send_replace((1, false));
        let text = eventually(&metrics, |t| t.contains(&format!("{series} 0"))).await;
        assert!(text.contains(&format!("{series} 0")), "{text}");

        // The server is gone: so is its series.
        drop(tx);
        let text = eventually(&metrics, |t| !t.contains(series)).await;
        assert!(!text.contains(series), "{text}");
    }
}
