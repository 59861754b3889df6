//! One policy call: the store data and its resource limits, the `kubedev.log` import, and the
//! ABI-version and select calls under fuel, memory and wall-clock limits.

use parking_lot::Mutex;
use std::sync::Arc;

use wasmtime::{Caller, Memory, ModuleExport, ResourceLimiter, Store, TypedFunc};

use super::{Compiled, LOG_FUEL, MAX_TABLE_ELEMENTS, SandboxInner, TICK, VERSION_CALL_FUEL, chain};
use crate::abi::{self, EXPORT_ALLOC, EXPORT_INPUTS, EXPORT_MEMORY, EXPORT_VERSION, RawDecision};
use crate::encode::Message;
use crate::error::{CallContext, HostFault, PolicyError, classify};
use crate::inputs::MAX_DECLARATION_BYTES;
use crate::ratelimit::TokenBucket;

/// Store data of one call.
pub(crate) struct Host {
    memory_limit: usize,
    peak_memory: usize,
    memory_denied: Option<usize>,
    pub(crate) log: LogSink,
}

/// Where `kubedev.log` lines go: captured for the caller and, rate-limited, to `tracing`.
pub(crate) struct LogSink {
    pub(crate) policy: Arc<str>,
    pub(crate) lines_left: u32,
    pub(crate) line_bytes: usize,
    pub(crate) lines: Vec<String>,
    pub(crate) dropped: u32,
    pub(crate) bucket: Arc<Mutex<TokenBucket>>,
}

impl LogSink {
    fn line(&mut self, bytes: &[u8]) {
        if self.lines_left == 0 {
            self.dropped = self.dropped.saturating_add(1);
            return;
        }
        self.lines_left -= 1;
        let mut cut = bytes.len().min(self.line_bytes);
        // Cut on a character boundary when the text is UTF-8.
        while cut < bytes.len() && cut > 0 && (bytes[cut] & 0xC0) == 0x80 {
            cut -= 1;
        }
        // Control characters escaped: a policy's line never starts another log line or
        // reaches a terminal as an escape sequence.
        let text = String::from_utf8_lossy(&bytes[..cut]).chars().fold(
            String::with_capacity(cut),
            |mut t, c| {
                if c.is_control() && c != '\t' {
                    t.extend(c.escape_default());
                } else {
                    t.push(c);
                }
                t
            },
        );
        let allowed = self.bucket.lock().take();
        if allowed {
            tracing::debug!(target: "kubedev_sandbox::guest", policy = %self.policy, "{text}");
        }
        self.lines.push(text);
    }
}

impl ResourceLimiter for Host {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.memory_limit {
            self.memory_denied = Some(desired);
            return Err(wasmtime::Error::new(HostFault::Memory {
                requested: desired,
            }));
        }
        self.peak_memory = self.peak_memory.max(desired);
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= MAX_TABLE_ELEMENTS)
    }

    fn instances(&self) -> usize {
        1
    }

    fn tables(&self) -> usize {
        1
    }

    fn memories(&self) -> usize {
        1
    }
}

/// The `kubedev.log(ptr, len)` import.
pub(super) fn host_log(mut caller: Caller<'_, Host>, ptr: i32, len: i32) -> wasmtime::Result<()> {
    let (ptr, len) = (ptr as u32 as usize, len as u32 as usize);
    let fuel = caller.get_fuel()?;
    caller.set_fuel(fuel.saturating_sub(LOG_FUEL + len as u64))?;
    let Some(wasmtime::Extern::Memory(mem)) = caller.get_export(EXPORT_MEMORY) else {
        return Err(wasmtime::Error::new(HostFault::Contract(
            "kubedev.log called by a module without memory".into(),
        )));
    };
    let (data, host) = mem.data_and_store_mut(&mut caller);
    let size = data.len();
    let Some(bytes) = ptr.checked_add(len).and_then(|end| data.get(ptr..end)) else {
        return Err(wasmtime::Error::new(HostFault::Contract(format!(
            "kubedev.log({ptr}, {len}) reads outside the memory of {size} bytes"
        ))));
    };
    host.log.line(bytes);
    Ok(())
}

/// The result of one successful call.
#[derive(Debug)]
pub(crate) struct CallOutput {
    pub(crate) decision: RawDecision,
    pub(crate) fuel_used: u64,
    pub(crate) memory_bytes: usize,
    pub(crate) log: Vec<String>,
}

impl SandboxInner {
    fn new_store(&self, log: LogSink, fuel: u64) -> Result<Store<Host>, wasmtime::Error> {
        let mut store = Store::new(
            &self.engine,
            Host {
                memory_limit: self.limits.memory_bytes,
                peak_memory: 0,
                memory_denied: None,
                log,
            },
        );
        store.limiter(|h: &mut Host| -> &mut dyn ResourceLimiter { h });
        store.set_fuel(fuel)?;
        let ticks = self.limits.timeout.as_nanos().div_ceil(TICK.as_nanos()) + 1;
        store.set_epoch_deadline(u64::try_from(ticks).unwrap_or(u64::MAX));
        Ok(store)
    }

    fn context(&self, store: &Store<Host>, fuel: u64) -> CallContext {
        CallContext {
            fuel,
            memory_limit: self.limits.memory_bytes,
            timeout: self.limits.timeout,
            max_instances: self.limits.max_concurrent_calls,
            memory_denied: store.data().memory_denied,
        }
    }

    /// Calls the ABI-version export and, if the module has one, the input declaration;
    /// returns the version and the declaration's text.
    pub(super) fn call_version(
        &self,
        policy: &str,
        compiled: &Compiled,
    ) -> Result<(i32, Option<String>), PolicyError> {
        let _active = self.ticker.enter();
        let log = LogSink {
            policy: Arc::from(policy),
            lines_left: 0,
            line_bytes: 0,
            lines: Vec::new(),
            dropped: 0,
            bucket: Arc::new(Mutex::new(TokenBucket::new(0.0, 0.0))),
        };
        let fuel = VERSION_CALL_FUEL.min(self.limits.fuel);
        let mut store = self
            .new_store(log, fuel)
            .map_err(|e| PolicyError::Runtime {
                policy: policy.to_string(),
                message: chain(&e),
            })?;
        let fault = |m: String| wasmtime::Error::new(HostFault::Contract(m));
        let result = (|| {
            let instance = compiled.pre.instantiate(&mut store)?;
            let f: TypedFunc<(), i32> = typed(&instance, &mut store, &compiled.version)
                .map_err(|e| e.context(format!("calling {EXPORT_VERSION}")))?;
            let version = f
                .call(&mut store, ())
                .map_err(|e| e.context(format!("calling {EXPORT_VERSION}")))?;
            let Some(export) = &compiled.declaration else {
                return Ok((version, None));
            };
            let f: TypedFunc<(), i64> = typed(&instance, &mut store, export)?;
            let packed = f
                .call(&mut store, ())
                .map_err(|e| e.context(format!("calling {EXPORT_INPUTS}")))?
                as u64;
            let (ptr, len) = ((packed >> 32) as usize, (packed & 0xffff_ffff) as usize);
            if len > MAX_DECLARATION_BYTES {
                return Err(fault(format!(
                    "{EXPORT_INPUTS} declares {len} bytes, the limit is {MAX_DECLARATION_BYTES}"
                )));
            }
            let memory = match instance.get_module_export(&mut store, &compiled.memory) {
                Some(wasmtime::Extern::Memory(m)) => m,
                _ => return Err(fault(format!("{EXPORT_MEMORY:?} is missing"))),
            };
            let data = memory.data(&store);
            let bytes = ptr
                .checked_add(len)
                .and_then(|e| data.get(ptr..e))
                .ok_or_else(|| {
                    fault(format!(
                        "{EXPORT_INPUTS} points at {len} bytes at {ptr}, outside the memory of {} bytes",
                        data.len()
                    ))
                })?;
            let text = std::str::from_utf8(bytes).map_err(|e| {
                fault(format!(
                    "{EXPORT_INPUTS} is not UTF-8: {}",
                    kubedev_core::echo::chain(&e)
                ))
            })?;
            Ok((version, Some(text.to_string())))
        })();
        result.map_err(|e| classify(policy, &e, &self.context(&store, fuel)))
    }

    /// Runs one `kubedev_select` call on a fresh instance.
    pub(crate) fn call_select(
        &self,
        compiled: &Compiled,
        input: &Message,
        candidates: usize,
        log: LogSink,
    ) -> Result<CallOutput, PolicyError> {
        let policy = log.policy.clone();
        let limits = &self.limits;
        let len = match i32::try_from(input.len()) {
            Ok(l) if input.len() <= limits.memory_bytes => l,
            _ => {
                return Err(PolicyError::InputTooLarge {
                    policy: policy.to_string(),
                    size: input.len(),
                    limit: limits.memory_bytes,
                });
            }
        };
        let _active = self.ticker.enter();
        let fuel = limits.fuel;
        let mut store = self
            .new_store(log, fuel)
            .map_err(|e| PolicyError::Runtime {
                policy: policy.to_string(),
                message: chain(&e),
            })?;
        let (decision, memory) = match self.run_select(&mut store, compiled, input, len, candidates)
        {
            Ok(answer) => answer,
            Err(SelectFailure::Wasm(e)) => {
                return Err(classify(&policy, &e, &self.context(&store, fuel)));
            }
            Err(SelectFailure::BadOutput(reason)) => {
                return Err(PolicyError::BadOutput {
                    policy: policy.to_string(),
                    reason,
                });
            }
        };
        let fuel_used = fuel - store.get_fuel().unwrap_or(0);
        let memory_bytes = store.data().peak_memory.max(memory.data_size(&store));
        let log = std::mem::take(&mut store.data_mut().log.lines);
        Ok(CallOutput {
            decision,
            fuel_used,
            memory_bytes,
            log,
        })
    }

    /// Instantiates the module, writes `input` (`len` bytes) into its memory, calls
    /// `kubedev_select` and decodes its answer; returns the answer and the instance's memory.
    fn run_select(
        &self,
        store: &mut Store<Host>,
        compiled: &Compiled,
        input: &Message,
        len: i32,
        candidates: usize,
    ) -> Result<(RawDecision, Memory), SelectFailure> {
        let exports = SelectExports::of_new_instance(store, compiled)?;
        let ptr = exports.write_input(store, input, len)?;
        let packed = exports
            .select
            .call(&mut *store, (ptr as i32, len))
            .map_err(SelectFailure::Wasm)? as u64;
        let decision = read_output(
            store,
            exports.memory,
            packed,
            candidates,
            self.limits.max_output_bytes,
        )?;
        Ok((decision, exports.memory))
    }
}

/// Why a select call failed.
enum SelectFailure {
    /// A trap or a host fault, classified with the store's state.
    Wasm(wasmtime::Error),
    /// An answer that breaks the contract.
    BadOutput(String),
}

/// The contract exports of the instance a select call runs on.
struct SelectExports {
    memory: Memory,
    alloc: TypedFunc<i32, i32>,
    select: TypedFunc<(i32, i32), i64>,
}

impl SelectExports {
    /// Instantiates the module and looks up its memory, allocator and select function.
    fn of_new_instance(
        store: &mut Store<Host>,
        compiled: &Compiled,
    ) -> Result<Self, SelectFailure> {
        let instance = compiled
            .pre
            .instantiate(&mut *store)
            .map_err(SelectFailure::Wasm)?;
        let memory = match instance.get_module_export(&mut *store, &compiled.memory) {
            Some(wasmtime::Extern::Memory(m)) => m,
            _ => {
                return Err(SelectFailure::BadOutput(format!(
                    "{EXPORT_MEMORY:?} is missing"
                )));
            }
        };
        let alloc = typed(&instance, store, &compiled.alloc).map_err(SelectFailure::Wasm)?;
        let select = typed(&instance, store, &compiled.select).map_err(SelectFailure::Wasm)?;
        Ok(SelectExports {
            memory,
            alloc,
            select,
        })
    }

    /// Has the module allocate `len` bytes and writes `input` there; returns the address.
    fn write_input(
        &self,
        store: &mut Store<Host>,
        input: &Message,
        len: i32,
    ) -> Result<usize, SelectFailure> {
        let ptr = self
            .alloc
            .call(&mut *store, len)
            .map_err(SelectFailure::Wasm)? as u32 as usize;
        if ptr == 0 {
            return Err(SelectFailure::BadOutput(format!(
                "{EXPORT_ALLOC}({len}) returned 0 (no memory for the input)"
            )));
        }
        let memory = self.memory;
        let written = memory
            .write(&mut *store, ptr, &input.records)
            .and_then(|()| memory.write(&mut *store, ptr + input.records.len(), &input.strings));
        if written.is_err() {
            return Err(SelectFailure::BadOutput(format!(
                "{EXPORT_ALLOC}({len}) returned {ptr}, but {len} bytes from there are outside the memory of {} bytes",
                memory.data_size(&*store)
            )));
        }
        Ok(ptr)
    }
}

/// Decodes the output `kubedev_select` answered with (its address and length, `packed`),
/// refused when over `max_output_bytes` or outside the memory.
fn read_output(
    store: &Store<Host>,
    memory: Memory,
    packed: u64,
    candidates: usize,
    max_output_bytes: usize,
) -> Result<RawDecision, SelectFailure> {
    let (out_ptr, out_len) = ((packed >> 32) as usize, (packed & 0xffff_ffff) as usize);
    if out_len > max_output_bytes {
        return Err(SelectFailure::BadOutput(format!(
            "output of {out_len} bytes is over the limit of {max_output_bytes} bytes"
        )));
    }
    let data = memory.data(store);
    let Some(bytes) = out_ptr
        .checked_add(out_len)
        .and_then(|e| data.get(out_ptr..e))
    else {
        return Err(SelectFailure::BadOutput(format!(
            "output at {out_ptr} of {out_len} bytes is outside the memory of {} bytes",
            data.len()
        )));
    };
    abi::decode_output(bytes, candidates).map_err(SelectFailure::BadOutput)
}

fn typed<P, R>(
    instance: &wasmtime::Instance,
    store: &mut Store<Host>,
    export: &ModuleExport,
) -> wasmtime::Result<TypedFunc<P, R>>
where
    P: wasmtime::WasmParams,
    R: wasmtime::WasmResults,
{
    match instance.get_module_export(&mut *store, export) {
        Some(wasmtime::Extern::Func(f)) => f.typed::<P, R>(&*store),
        _ => Err(wasmtime::Error::new(HostFault::Contract(
            "a contract export is missing from the instance".into(),
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_policy_log_line_is_cut_and_its_control_characters_escaped() {
        let mut sink = LogSink {
            policy: Arc::from("p"),
            lines_left: 2,
            line_bytes: 24,
            lines: Vec::new(),
            dropped: 0,
            bucket: Arc::new(Mutex::new(TokenBucket::new(0.0, 0.0))),
        };
        sink.line(b"one\nERROR forged\x1b[2J and more text");
        sink.line("é".repeat(20).as_bytes());
        sink.line(b"dropped");
        assert_eq!(sink.lines[0], "one\\nERROR forged\\u{1b}[2J and");
        assert_eq!(sink.lines[1], "é".repeat(12));
        assert_eq!(sink.dropped, 1);
    }
}
