//! Discovery: reading the machine through NVML, keeping lost GPUs published (unhealthy), and
//! building the pool with each device's health.

use std::sync::Arc;
use std::time::Instant;

use kubedev_core::SourceError;

use super::{BACKEND, Discovered, Inner};
use crate::config::MigStrategy;
use crate::devices::{Built, build_pool};
use crate::error::NvidiaError;
use crate::ffi::{self, MachineRead};
use crate::health::Probe;
use crate::snapshot::MachineInfo;
use crate::topology::Topology;

impl Inner {
    /// Discovers the machine now: reloads NVML when the kernel module changed version, reads
    /// every GPU, and publishes the pool built from them (kept for prepare and the watcher).
    pub(super) fn discover_blocking(&self) -> Result<Arc<Discovered>, SourceError> {
        let read = self.read_machine()?;
        let mut machine = read.machine;
        self.refresh_driver(machine.driver_version.as_deref());
        let previous = self.current();
        self.keep_lost_gpus(&mut machine, read.failed, previous.as_deref());
        machine.gpus.sort_by_key(|g| g.index);
        if machine.ancestor_levels.len() != machine.gpus.len() {
            // A GPU was carried over from the last discovery: the level matrix no longer lines
            // up; rebuild it from the last one where possible.
            machine.ancestor_levels = realign_levels(&machine, previous.as_deref());
        }
        let topology = Topology::from_machine(&machine);
        let built = self.build_and_record(&machine, &topology);
        built.pool.validate().map_err(|error| SourceError::Model {
            backend: BACKEND.into(),
            error,
        })?;
        let d = Arc::new(Discovered {
            machine,
            topology,
            built,
        });
        *self.discovered.write() = Some(d.clone());
        Ok(d)
    }

    /// Every GPU as NVML shows it now, loading NVML again first when the kernel module changed
    /// version under it.
    fn read_machine(&self) -> Result<MachineRead, SourceError> {
        if self.module_changed() {
            tracing::warn!(
                module = ?self.module_version(),
                "the NVIDIA kernel module changed version; loading NVML again"
            );
            *self.nvml.lock() = None;
        }
        let nvml = self
            .nvml()
            .map_err(|e| SourceError::unavailable(BACKEND, &e))?;
        let mig = self.config.mig_strategy != MigStrategy::None;
        ffi::read_machine(&nvml, &self.ctx.host, mig).map_err(|e| match &e {
            NvidiaError::Unavailable(_) => SourceError::unavailable(BACKEND, &e),
            _ => SourceError::Unavailable {
                backend: BACKEND.into(),
                reason: format!("NVML unavailable: {}", kubedev_core::echo::chain(&e)),
            },
        })
    }

    /// Adds to `machine` the GPUs of the `previous` discovery that NVML has now lost, marked
    /// lost in the health tracker, so they stay published (unhealthy) under their names and
    /// their claims see it; any other GPU that could not be read is logged and skipped.
    fn keep_lost_gpus(
        &self,
        machine: &mut MachineInfo,
        failed: Vec<(u32, NvidiaError)>,
        previous: Option<&Discovered>,
    ) {
        let now = Instant::now();
        for (index, err) in failed {
            let lost = matches!(err, NvidiaError::Nvml { gpu_lost: true, .. });
            let known =
                previous.and_then(|p| p.machine.gpus.iter().find(|g| g.index == index).cloned());
            match (lost, known) {
                (true, Some(gpu)) => {
                    // Keep publishing a lost GPU under its name, unhealthy, so its claims see it.
                    self.health.lock().on_probe(
                        &gpu.uuid,
                        &Probe::Lost(kubedev_core::echo::chain(&err)),
                        now,
                    );
                    machine.gpus.push(gpu);
                }
                _ => {
                    tracing::warn!(gpu = index, error = %kubedev_core::echo::Chain(&err), "GPU skipped")
                }
            }
        }
    }

    /// The pool of `machine` with each device's health now, recorded as what was last reported
    /// so the watcher sends only later changes; devices that cannot be built are logged and
    /// left out.
    fn build_and_record(&self, machine: &MachineInfo, topology: &Topology) -> Built {
        let owned = self.owned_placements();
        let health = self.health.lock();
        let (built, errors) = build_pool(
            self.pool.clone(),
            &self.config,
            machine,
            topology,
            &|uuid, gi| health.health(uuid, gi),
            &owned,
        );
        for e in errors {
            tracing::warn!(error = %kubedev_core::echo::Chain(&e), "device skipped");
        }
        // Recorded while the tracker is locked, so the watcher compares its next change with
        // exactly what this discovery publishes.
        *self.reported.lock() = built
            .pool
            .devices
            .iter()
            .map(|dev| (dev.name.clone(), dev.health.clone()))
            .collect();
        built
    }
}

/// The level matrix for `machine.gpus` from the last discovery's, by UUID.
fn realign_levels(machine: &MachineInfo, previous: Option<&Discovered>) -> Vec<Vec<Option<u32>>> {
    let n = machine.gpus.len();
    let mut out = vec![vec![None; n]; n];
    let Some(prev) = previous else { return out };
    let pos = |uuid: &str| prev.machine.gpus.iter().position(|g| g.uuid == uuid);
    for (i, a) in machine.gpus.iter().enumerate() {
        for (j, b) in machine.gpus.iter().enumerate() {
            if let (Some(pi), Some(pj)) = (pos(&a.uuid), pos(&b.uuid)) {
                out[i][j] = prev
                    .machine
                    .ancestor_levels
                    .get(pi)
                    .and_then(|r| r.get(pj))
                    .copied()
                    .flatten();
            }
        }
    }
    out
}
