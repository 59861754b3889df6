//! GPU health: a cheap probe of one GPU, and the Xid event set with its waits.

use std::mem;

use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::error::{NvmlError, nvml_sym, nvml_try};
use nvml_wrapper::{EventSet, Nvml};
use nvml_wrapper_sys::bindings as sys;

use super::nvml_err;
use crate::error::NvidiaError;
use crate::health::Probe;

/// Asks the GPU something cheap, to tell whether it answers.
pub(crate) fn probe(nvml: &Nvml, uuid: &str) -> Probe {
    let dev = match nvml.device_by_uuid(uuid) {
        Ok(d) => d,
        Err(NvmlError::GpuLost) => return Probe::Lost("NVML reports the GPU is lost".into()),
        Err(e) => return Probe::Failed(kubedev_core::echo::chain(&e)),
    };
    match dev.memory_info() {
        Ok(_) => Probe::Answers,
        Err(NvmlError::GpuLost) => {
            Probe::Lost("NVML reports the GPU has fallen off the bus".into())
        }
        Err(e) => Probe::Failed(kubedev_core::echo::chain(&e)),
    }
}

/// What one wait on the Xid event set gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Wait {
    /// An Xid on the GPU with this UUID, scoped to a GPU instance when NVML says so (`None`
    /// xid: NVML did not give the code).
    Xid {
        gpu_uuid: String,
        gi: Option<u32>,
        xid: Option<u64>,
    },
    /// Some GPU is lost: probe them all.
    Lost,
    /// Nothing within the timeout.
    Timeout,
    /// The wait failed otherwise.
    Failed(String),
}

/// An event set with Xid critical errors registered for every GPU that supports them.
pub(crate) struct XidEvents<'n> {
    set: EventSet<'n>,
    /// (raw handle address, UUID) of each registered GPU, to name the GPU of an event even when
    /// it no longer answers.
    gpus: Vec<(usize, String)>,
}

impl std::fmt::Debug for XidEvents<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XidEvents")
            .field("gpus", &self.gpus)
            .finish()
    }
}

impl<'n> XidEvents<'n> {
    /// Registers every GPU in `uuids` that supports Xid events; those that do not are logged.
    pub(crate) fn open(nvml: &'n Nvml, uuids: &[String]) -> Result<Self, NvidiaError> {
        let mut set = nvml
            .create_event_set()
            .map_err(|e| nvml_err("nvmlEventSetCreate", "the system", &e))?;
        let mut gpus = Vec::new();
        for uuid in uuids {
            let dev = match nvml.device_by_uuid(uuid.as_str()) {
                Ok(d) => d,
                Err(e) => {
                    tracing::warn!(gpu = %uuid, error = %kubedev_core::echo::Chain(&e), "GPU not watched for Xid errors");
                    continue;
                }
            };
            match dev.supported_event_types() {
                Ok(t) if t.contains(EventTypes::CRITICAL_XID_ERROR) => {}
                other => {
                    tracing::warn!(gpu = %uuid, supported = ?other.ok(), "GPU does not report Xid errors; not watched");
                    continue;
                }
            }
            // SAFETY: see `nvlinks`; only the address is kept, as an identity.
            let addr = unsafe { dev.handle() } as usize;
            match dev.register_events(EventTypes::CRITICAL_XID_ERROR, set) {
                Ok(s) => {
                    set = s;
                    gpus.push((addr, uuid.clone()));
                }
                Err(e) => {
                    // A failed registration frees the set: start a new one with the GPUs
                    // registered so far.
                    tracing::warn!(gpu = %uuid, error = %kubedev_core::echo::Chain(&e.error), "registering Xid events failed; GPU not watched");
                    set = nvml
                        .create_event_set()
                        .map_err(|e| nvml_err("nvmlEventSetCreate", "the system", &e))?;
                    let kept = std::mem::take(&mut gpus);
                    for (a, u) in kept {
                        let Ok(d) = nvml.device_by_uuid(u.as_str()) else {
                            continue;
                        };
                        match d.register_events(EventTypes::CRITICAL_XID_ERROR, set) {
                            Ok(s) => {
                                set = s;
                                gpus.push((a, u));
                            }
                            Err(e) => {
                                return Err(nvml_err("nvmlDeviceRegisterEvents", u, &e.error));
                            }
                        }
                    }
                }
            }
        }
        Ok(XidEvents { set, gpus })
    }

    /// The GPUs registered.
    pub(crate) fn watched(&self) -> impl Iterator<Item = &str> {
        self.gpus.iter().map(|(_, u)| u.as_str())
    }

    /// Waits up to `timeout_ms` for one event.
    ///
    /// The wait is called raw: nvml-wrapper's `EventData` drops the GPU and compute instance ids
    /// that scope an Xid to one MIG device.
    pub(crate) fn wait(&self, nvml: &Nvml, timeout_ms: u32) -> Wait {
        let sym = match nvml_sym(nvml.lib().nvmlEventSetWait_v2.as_ref()) {
            Ok(s) => s,
            Err(e) => return Wait::Failed(kubedev_core::echo::chain(&e)),
        };
        // SAFETY: an all-zero struct of integers and a pointer is a valid value.
        let mut data: sys::nvmlEventData_t = unsafe { mem::zeroed() };
        // SAFETY: the set is live (owned by `self`) and `data` is a valid out-pointer; the
        // handle is only used for this call, never freed here.
        let code = unsafe { sym(self.set.handle(), &mut data, timeout_ms) };
        match nvml_try(code) {
            Ok(()) => {}
            Err(NvmlError::Timeout) => return Wait::Timeout,
            Err(NvmlError::GpuLost) => return Wait::Lost,
            Err(e) => return Wait::Failed(kubedev_core::echo::chain(&e)),
        }
        if data.eventType & u64::from(sys::nvmlEventTypeXidCriticalError) == 0 {
            return Wait::Timeout;
        }
        let addr = data.device as usize;
        let Some(gpu_uuid) = self
            .gpus
            .iter()
            .find(|(a, _)| *a == addr)
            .map(|(_, u)| u.clone())
        else {
            return Wait::Failed("an Xid event for a GPU that is not watched".into());
        };
        let xid = (data.eventData != 999).then_some(data.eventData);
        let gi = (data.gpuInstanceId != u32::MAX).then_some(data.gpuInstanceId);
        Wait::Xid { gpu_uuid, gi, xid }
    }
}
