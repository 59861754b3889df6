//! The health watcher: Xid events and periodic probes of every GPU on a blocking thread, the
//! devices whose health changed sent as events, and a rediscovery asked for when the driver is
//! reloaded under it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use kubedev_core::{DeviceName, DeviceRef, Health, SourceError, SourceEvent};
use nvml_wrapper::Nvml;
use tokio::sync::mpsc;

use super::{BACKEND, Discovered, Inner};
use crate::devices::{DeviceKind, Owned, instance_of};
use crate::ffi;

/// The longest single wait on the event set: how quickly a dropped `watch` stops.
const MAX_WAIT_MS: u64 = 200;

impl Inner {
    /// The health of every published device of GPU `gpu_uuid` now.
    fn device_healths(&self, d: &Discovered, gpu_uuid: &str) -> Vec<(DeviceName, Health)> {
        let Some(pos) = d.machine.gpus.iter().position(|g| g.uuid == gpu_uuid) else {
            return Vec::new();
        };
        let owned = if d
            .built
            .kinds
            .values()
            .any(|k| matches!(k, DeviceKind::Placement { .. }))
        {
            self.owned_placements()
        } else {
            Owned::new()
        };
        let health = self.health.lock();
        d.built
            .kinds
            .iter()
            .filter(|(_, k)| k.gpu() == pos)
            .map(|(name, k)| {
                let gi = instance_of(gpu_uuid, k, &owned);
                (name.clone(), health.health(gpu_uuid, gi))
            })
            .collect()
    }

    /// The watcher loop, on a blocking thread until `stop` is set or nobody listens. After a
    /// driver reload it waits for discovery to load NVML again and watches the new handle.
    pub(super) fn watch_blocking(
        &self,
        events: &mpsc::Sender<SourceEvent>,
        stop: &AtomicBool,
    ) -> Result<(), SourceError> {
        while self.watch_round(events, stop)? {
            while self.module_changed() {
                if stop.load(Ordering::Relaxed) || events.is_closed() {
                    return Ok(());
                }
                std::thread::sleep(Duration::from_millis(MAX_WAIT_MS));
            }
        }
        Ok(())
    }

    /// One watch on one NVML handle: `Ok(true)` when the driver changed under it and watching
    /// must start again on a new handle, `Ok(false)` when the watch is over.
    fn watch_round(
        &self,
        events: &mpsc::Sender<SourceEvent>,
        stop: &AtomicBool,
    ) -> Result<bool, SourceError> {
        let nvml = self
            .nvml()
            .map_err(|e| SourceError::unavailable(BACKEND, &e))?;
        let discovered = self.discovered_or_discover()?;
        let uuids: Vec<String> = discovered
            .machine
            .gpus
            .iter()
            .map(|g| g.uuid.clone())
            .collect();
        let xids = ffi::XidEvents::open(&nvml, &uuids)
            .map_err(|e| SourceError::unavailable(BACKEND, &e))?;
        tracing::debug!(gpus = ?xids.watched().collect::<Vec<_>>(), "watching Xid events");
        let poll = Duration::from_millis(self.config.health_poll_millis);
        let wait_ms = u32::try_from(self.config.health_poll_millis.min(MAX_WAIT_MS)).unwrap_or(200);
        let mut last_probe = Instant::now();
        let mut failures = 0u32;
        let send = |gpus: &[String]| self.send_changed_health(events, &discovered, gpus);
        loop {
            if stop.load(Ordering::Relaxed) || events.is_closed() {
                return Ok(false);
            }
            let mut probe_now = false;
            match xids.wait(&nvml, wait_ms) {
                ffi::Wait::Xid { gpu_uuid, gi, xid } => {
                    failures = 0;
                    let changed = self
                        .health
                        .lock()
                        .on_xid(&gpu_uuid, gi, xid, Instant::now());
                    if changed {
                        tracing::warn!(gpu = %gpu_uuid, gpu_instance = ?gi, xid = ?xid, "GPU Xid error");
                        if !send(std::slice::from_ref(&gpu_uuid)) {
                            return Ok(false);
                        }
                    }
                }
                ffi::Wait::Lost => probe_now = true,
                ffi::Wait::Timeout => failures = 0,
                ffi::Wait::Failed(e) => {
                    failures += 1;
                    if failures == 1 || failures.is_power_of_two() {
                        tracing::warn!(error = %e, failures, "waiting for NVML events failed");
                    }
                    std::thread::sleep(Duration::from_millis(MAX_WAIT_MS));
                }
            }
            if probe_now || last_probe.elapsed() >= poll {
                last_probe = Instant::now();
                if self.module_changed() {
                    // Discovery loads NVML again and finds the new version's files; this
                    // watcher's handle is stale.
                    tracing::warn!("the NVIDIA driver was reloaded or upgraded; discovering again");
                    return Ok(events.blocking_send(SourceEvent::Rediscover).is_ok());
                }
                if !send(&self.probe_gpus(&nvml, &uuids)) {
                    return Ok(false);
                }
            }
        }
    }

    /// Probes each of `uuids` and returns those whose health changed.
    fn probe_gpus(&self, nvml: &Nvml, uuids: &[String]) -> Vec<String> {
        let mut changed = Vec::new();
        for uuid in uuids {
            let p = ffi::probe(nvml, uuid);
            if self.health.lock().on_probe(uuid, &p, Instant::now()) {
                tracing::info!(gpu = %uuid, probe = ?p, "GPU health changed");
                changed.push(uuid.clone());
            }
        }
        changed
    }

    /// Sends the devices of `gpus` whose health differs from what was last reported (the
    /// devices of the latest discovery, or of `watched` before there is one); false when nobody
    /// listens any more.
    fn send_changed_health(
        &self,
        events: &mpsc::Sender<SourceEvent>,
        watched: &Arc<Discovered>,
        gpus: &[String],
    ) -> bool {
        let d = self.current().unwrap_or_else(|| watched.clone());
        for uuid in gpus {
            for (name, h) in self.device_healths(&d, uuid) {
                {
                    let mut reported = self.reported.lock();
                    if reported.get(&name) == Some(&h) {
                        continue;
                    }
                    reported.insert(name.clone(), h.clone());
                }
                let ev = SourceEvent::Health {
                    device: DeviceRef::new(self.pool.clone(), name),
                    health: h,
                };
                if events.blocking_send(ev).is_err() {
                    return false;
                }
            }
        }
        true
    }
}

/// Sets the flag when dropped: stops the blocking watcher when `watch` is cancelled.
pub(super) struct StopOnDrop(pub(super) Arc<AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}
