//! Event sets and the control file: registration, delivery of Xid events, GPU-lost notices, and
//! the control lines that inject events or lose and restore GPUs at run time.

use std::collections::{BTreeMap, VecDeque};
use std::io::{Read, Seek, SeekFrom};
use std::path::PathBuf;

use serde::Deserialize;

use super::{Mock, Nv};
use crate::codes::*;
use crate::machine::XidEvent;

/// Event types a GPU supports when the machine file does not say.
const DEFAULT_EVENT_TYPES: u64 =
    EVENT_SINGLE_BIT_ECC | EVENT_DOUBLE_BIT_ECC | EVENT_PSTATE | EVENT_XID | EVENT_CLOCK;

/// An event waiting in an event set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Delivered {
    pub(crate) gpu: u32,
    pub(crate) event_type: u64,
    pub(crate) data: u64,
    pub(crate) gi: u32,
    pub(crate) ci: u32,
}

/// What a wait on an event set found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WaitOutcome {
    Event(Delivered),
    GpuLost,
    Nothing,
}

#[derive(Debug, Default)]
pub(super) struct EventSetRt {
    /// GPU index → registered event type bits.
    registered: BTreeMap<u32, u64>,
    queue: VecDeque<Delivered>,
    lost_notice: bool,
}

#[derive(Debug)]
pub(super) struct ControlTail {
    pub(super) path: PathBuf,
    pub(super) offset: u64,
    pub(super) partial: Vec<u8>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ControlLine {
    xid: Option<u64>,
    gpu: Option<u32>,
    gi: Option<u32>,
    ci: Option<u32>,
    lost: Option<u32>,
    restore: Option<u32>,
}
impl Mock {
    /// Supported event types of a GPU.
    pub(crate) fn supported_events(&self, gpu: u32) -> u64 {
        self.machine.gpus[gpu as usize]
            .supported_event_types
            .unwrap_or(DEFAULT_EVENT_TYPES)
    }

    /// Creates an event set.
    pub(crate) fn create_event_set(&mut self) -> Nv<u32> {
        if self.next_event_set > 0xffff {
            return Err(ERROR_MEMORY);
        }
        let id = self.next_event_set;
        self.next_event_set += 1;
        self.event_sets.insert(id, EventSetRt::default());
        Ok(id)
    }

    /// Frees an event set.
    pub(crate) fn free_event_set(&mut self, id: u32) -> Nv<()> {
        self.event_sets
            .remove(&id)
            .map(|_| ())
            .ok_or(ERROR_INVALID_ARGUMENT)
    }

    /// Whether an event set exists.
    pub(crate) fn has_event_set(&self, id: u32) -> bool {
        self.event_sets.contains_key(&id)
    }

    /// Registers `types` of GPU `gpu` with event set `set`.
    pub(crate) fn register(&mut self, gpu: u32, types: u64, set: u32) -> Nv<()> {
        self.gpu(gpu)?;
        if types & !self.supported_events(gpu) != 0 {
            return Err(ERROR_NOT_SUPPORTED);
        }
        let es = self
            .event_sets
            .get_mut(&set)
            .ok_or(ERROR_INVALID_ARGUMENT)?;
        *es.registered.entry(gpu).or_insert(0) |= types;
        self.deliver();
        Ok(())
    }

    /// Moves pending Xid events to every event set that has their GPU registered for Xids;
    /// events nobody listens to yet stay pending.
    fn deliver(&mut self) {
        let mut keep = VecDeque::new();
        while let Some(ev) = self.pending.pop_front() {
            let mut taken = false;
            for es in self.event_sets.values_mut() {
                if es
                    .registered
                    .get(&ev.gpu)
                    .is_some_and(|t| t & EVENT_XID != 0)
                {
                    es.queue.push_back(Delivered {
                        gpu: ev.gpu,
                        event_type: EVENT_XID,
                        data: ev.xid,
                        gi: ev.gi.unwrap_or(u32::MAX),
                        ci: ev.ci.unwrap_or(u32::MAX),
                    });
                    taken = true;
                }
            }
            if !taken {
                keep.push_back(ev);
            }
        }
        self.pending = keep;
    }

    /// Takes the next event of a set (after reading the control file).
    pub(crate) fn take_event(&mut self, set: u32) -> Nv<WaitOutcome> {
        self.poll_control();
        let es = self
            .event_sets
            .get_mut(&set)
            .ok_or(ERROR_INVALID_ARGUMENT)?;
        if es.lost_notice {
            es.lost_notice = false;
            return Ok(WaitOutcome::GpuLost);
        }
        Ok(es
            .queue
            .pop_front()
            .map_or(WaitOutcome::Nothing, WaitOutcome::Event))
    }

    /// Reads new complete lines of the control file and applies them.
    pub(crate) fn poll_control(&mut self) {
        let Some(tail) = self.control.as_mut() else {
            return;
        };
        let Ok(mut file) = std::fs::File::open(&tail.path) else {
            return;
        };
        let Ok(len) = file.metadata().map(|m| m.len()) else {
            return;
        };
        if len < tail.offset {
            // Truncated or replaced: start over.
            tail.offset = 0;
            tail.partial.clear();
        }
        if len == tail.offset {
            return;
        }
        let mut buf = Vec::new();
        if file.seek(SeekFrom::Start(tail.offset)).is_err() || file.read_to_end(&mut buf).is_err() {
            return;
        }
        tail.offset += buf.len() as u64;
        tail.partial.extend_from_slice(&buf);
        let Some(last_newline) = tail.partial.iter().rposition(|&b| b == b'\n') else {
            return;
        };
        let complete: Vec<u8> = tail.partial.drain(..=last_newline).collect();
        let text = String::from_utf8_lossy(&complete).into_owned();
        for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
            if let Err(why) = self.apply_control(line) {
                eprintln!("nvml-mock: ignoring control line {line:?}: {why}");
            }
        }
        self.deliver();
    }

    fn apply_control(&mut self, line: &str) -> Result<(), String> {
        let c: ControlLine = serde_json::from_str(line).map_err(|e| e.to_string())?;
        let n = self.gpus.len() as u32;
        let check = |g: u32| {
            if g < n {
                Ok(g)
            } else {
                Err(format!("GPU {g} does not exist ({n} GPUs)"))
            }
        };
        match c {
            ControlLine {
                xid: Some(xid),
                gpu: Some(gpu),
                gi,
                ci,
                lost: None,
                restore: None,
            } => {
                check(gpu)?;
                self.pending.push_back(XidEvent { xid, gpu, gi, ci });
            }
            ControlLine {
                xid: None,
                gpu: None,
                gi: None,
                ci: None,
                lost: Some(g),
                restore: None,
            } => {
                check(g)?;
                if !self.gpus[g as usize].lost {
                    self.gpus[g as usize].lost = true;
                    for es in self.event_sets.values_mut() {
                        if es.registered.contains_key(&g) {
                            es.lost_notice = true;
                        }
                    }
                }
            }
            ControlLine {
                xid: None,
                gpu: None,
                gi: None,
                ci: None,
                lost: None,
                restore: Some(g),
            } => {
                check(g)?;
                self.gpus[g as usize].lost = false;
            }
            _ => {
                return Err(
                    "expected {\"xid\":N,\"gpu\":N}, {\"lost\":N} or {\"restore\":N}".to_string(),
                );
            }
        }
        Ok(())
    }
}
