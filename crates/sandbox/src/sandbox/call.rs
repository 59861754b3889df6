//! One policy call: the store data and its resource limits, the `kubedev.log` import, and the
//! ABI-version and select calls under fuel, memory and wall-clock limits.

use parking_lot::Mutex;
use std::sync::{Arc, Weak};

use wasmtime::{
    Caller, Global, Instance, Memory, ModuleExport, ResourceLimiter, Store, TypedFunc, Val,
};

use super::{Compiled, LOG_FUEL, MAX_TABLE_ELEMENTS, SandboxInner, TICK, VERSION_CALL_FUEL, chain};
use crate::abi::{self, EXPORT_ALLOC, EXPORT_INPUTS, EXPORT_MEMORY, EXPORT_VERSION, RawDecision};
use crate::encode::Message;
use crate::error::{CallContext, HostFault, PolicyError, classify, is_busy};
use crate::inputs::MAX_DECLARATION_BYTES;
use crate::ratelimit::TokenBucket;

/// Store data of one call.
pub(crate) struct Host {
    memory_limit: usize,
    peak_memory: usize,
    memory_denied: Option<usize>,
    pub(crate) log: LogSink,
}

impl Host {
    /// Gets the store data of a reused instance ready for a new call that logs to `log`.
    fn start_call(&mut self, log: LogSink) {
        self.log = log;
        self.peak_memory = 0;
        self.memory_denied = None;
    }
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
        self.arm(&mut store, fuel)?;
        Ok(store)
    }

    /// Gives `store` `fuel` and a wall-clock deadline from now.
    fn arm(&self, store: &mut Store<Host>, fuel: u64) -> Result<(), wasmtime::Error> {
        store.set_fuel(fuel)?;
        let ticks = self.limits.timeout.as_nanos().div_ceil(TICK.as_nanos()) + 1;
        store.set_epoch_deadline(u64::try_from(ticks).unwrap_or(u64::MAX));
        Ok(())
    }

    /// Instantiates `compiled` in a new store with `log` and `fuel`. When every instance slot
    /// is taken, the idle instances of every module are dropped and it tries once more, so
    /// instances kept for reuse never make a call fail as busy.
    fn instantiate(
        &self,
        compiled: &Compiled,
        mut log: LogSink,
        fuel: u64,
    ) -> Result<(Store<Host>, Instance), PolicyError> {
        let policy = log.policy.clone();
        let mut evicted = false;
        loop {
            let mut store = self
                .new_store(log, fuel)
                .map_err(|e| PolicyError::Runtime {
                    policy: policy.to_string(),
                    message: chain(&e),
                })?;
            match compiled.pre.instantiate(&mut store) {
                Ok(instance) => return Ok((store, instance)),
                Err(e) if is_busy(&e) && !evicted => {
                    evicted = true;
                    self.drop_idle_instances();
                    log = store.into_data().log;
                }
                Err(e) => return Err(classify(&policy, &e, &self.context(&store, fuel))),
            }
        }
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
        let (mut store, instance) = self.instantiate(compiled, log, fuel)?;
        let fault = |m: String| wasmtime::Error::new(HostFault::Contract(m));
        let result = (|| {
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

    /// Runs one `kubedev_select` call on an instance in the state instantiation leaves it
    /// in: a fresh one, or one restored after an earlier call.
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
        let Ready {
            mut store,
            exports,
            image,
        } = self.ready_instance(compiled, log, fuel)?;
        let decision = exports
            .select(&mut store, input, len, candidates, limits)
            .map_err(|f| self.failure(&policy, &store, fuel, f))?;
        let fuel_used = fuel - store.get_fuel().unwrap_or(0);
        let memory_bytes = store
            .data()
            .peak_memory
            .max(exports.memory.data_size(&store));
        let log = std::mem::take(&mut store.data_mut().log.lines);
        if let Some(image) = image
            && image.restore(&mut store, exports.memory)
        {
            let mut idle = compiled.idle.lock();
            if idle.len() < IDLE_PER_MODULE {
                idle.push(Ready {
                    store,
                    exports,
                    image: Some(image),
                });
            }
        }
        Ok(CallOutput {
            decision,
            fuel_used,
            memory_bytes,
            log,
        })
    }

    /// An instance of `compiled` for a call logging to `log` with `fuel`: an idle one, or a
    /// new one (with its image taken when its module's instances can be reused).
    fn ready_instance(
        &self,
        compiled: &Compiled,
        log: LogSink,
        fuel: u64,
    ) -> Result<Ready, PolicyError> {
        let idle = compiled.idle.lock().pop();
        if let Some(mut ready) = idle {
            ready.store.data_mut().start_call(log);
            self.arm(&mut ready.store, fuel)
                .map_err(|e| PolicyError::Runtime {
                    policy: ready.store.data().log.policy.to_string(),
                    message: chain(&e),
                })?;
            return Ok(ready);
        }
        let policy = log.policy.clone();
        let (mut store, instance) = self.instantiate(compiled, log, fuel)?;
        let exports = SelectExports::of_instance(&mut store, instance, compiled)
            .map_err(|f| self.failure(&policy, &store, fuel, f))?;
        let image = compiled.globals.as_deref().and_then(|globals| {
            Image::take(&mut store, instance, exports.memory, compiled, globals)
        });
        Ok(Ready {
            store,
            exports,
            image,
        })
    }

    /// The error for a select call's `failure` in `store`, which had `fuel`.
    fn failure(
        &self,
        policy: &str,
        store: &Store<Host>,
        fuel: u64,
        failure: SelectFailure,
    ) -> PolicyError {
        match failure {
            SelectFailure::Wasm(e) => classify(policy, &e, &self.context(store, fuel)),
            SelectFailure::BadOutput(reason) => PolicyError::BadOutput {
                policy: policy.to_string(),
                reason,
            },
        }
    }

    /// Drops the idle instances of every module, freeing their slots.
    fn drop_idle_instances(&self) {
        let modules: Vec<_> = self
            .cache
            .lock()
            .values()
            .filter_map(Weak::upgrade)
            .collect();
        for module in modules {
            module.idle.lock().clear();
        }
    }
}

/// Most instances of one module kept for reuse.
const IDLE_PER_MODULE: usize = 2;
/// Largest memory an instance kept for reuse may have: restoring it is a write of the whole.
const MAX_IMAGE_BYTES: usize = 256 << 10;
/// Granularity of the non-zero runs of an image.
const RUN_BYTES: usize = 64;

/// An instance with its store, and, when it can be reused, what to restore after a call.
pub(crate) struct Ready {
    store: Store<Host>,
    exports: SelectExports,
    image: Option<Image>,
}

/// What instantiation left in an instance: its memory, the same for every instance of the
/// module, and the values of its mutable globals.
struct Image {
    memory: Arc<MemoryImage>,
    globals: Vec<(Global, Val)>,
}

/// A memory as instantiation left it: its size and the runs of its non-zero bytes.
pub(crate) struct MemoryImage {
    size: usize,
    runs: Vec<(usize, Box<[u8]>)>,
}

impl MemoryImage {
    /// The image of `data`; `None` when it is over [`MAX_IMAGE_BYTES`].
    fn of(data: &[u8]) -> Option<MemoryImage> {
        if data.len() > MAX_IMAGE_BYTES {
            return None;
        }
        let mut runs: Vec<(usize, Box<[u8]>)> = Vec::new();
        let mut run: Option<usize> = None;
        for (i, chunk) in data.chunks(RUN_BYTES).enumerate() {
            let at = i * RUN_BYTES;
            match (chunk.iter().any(|&b| b != 0), run) {
                (true, None) => run = Some(at),
                (false, Some(start)) => {
                    runs.push((start, data[start..at].into()));
                    run = None;
                }
                _ => {}
            }
        }
        if let Some(start) = run {
            runs.push((start, data[start..].into()));
        }
        Some(MemoryImage {
            size: data.len(),
            runs,
        })
    }
}

impl Image {
    /// The image of a new `instance` of `compiled`, whose mutable globals are the exports
    /// `globals`; `None` when its memory is over [`MAX_IMAGE_BYTES`] or a global is missing.
    /// The memory is imaged once per module: a module whose instances can be restored has no
    /// start function, so instantiation always leaves the same bytes.
    fn take(
        store: &mut Store<Host>,
        instance: Instance,
        memory: Memory,
        compiled: &Compiled,
        globals: &[ModuleExport],
    ) -> Option<Image> {
        let memory = compiled
            .memory_image
            .get_or_init(|| MemoryImage::of(memory.data(&*store)).map(Arc::new))
            .clone()?;
        let globals = globals
            .iter()
            .map(
                |export| match instance.get_module_export(&mut *store, export) {
                    Some(wasmtime::Extern::Global(g)) => Some((g, g.get(&mut *store))),
                    _ => None,
                },
            )
            .collect::<Option<Vec<_>>>()?;
        Some(Image { memory, globals })
    }

    /// Puts `memory` and the globals back as the image has them; `false` when that cannot
    /// be done (the memory grew).
    fn restore(&self, store: &mut Store<Host>, memory: Memory) -> bool {
        let data = memory.data_mut(&mut *store);
        if data.len() != self.memory.size {
            return false;
        }
        data.fill(0);
        for (at, bytes) in &self.memory.runs {
            data[*at..*at + bytes.len()].copy_from_slice(bytes);
        }
        self.globals
            .iter()
            .all(|(global, value)| global.set(&mut *store, *value).is_ok())
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
    /// Looks up the memory, allocator and select function of `instance`.
    fn of_instance(
        store: &mut Store<Host>,
        instance: Instance,
        compiled: &Compiled,
    ) -> Result<Self, SelectFailure> {
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

    /// Writes `input` (`len` bytes) into the memory, calls `kubedev_select` and decodes its
    /// answer.
    fn select(
        &self,
        store: &mut Store<Host>,
        input: &Message,
        len: i32,
        candidates: usize,
        limits: &crate::limits::Limits,
    ) -> Result<RawDecision, SelectFailure> {
        let ptr = self.write_input(store, input, len)?;
        let packed = self
            .select
            .call(&mut *store, (ptr as i32, len))
            .map_err(SelectFailure::Wasm)? as u64;
        read_output(
            store,
            self.memory,
            packed,
            candidates,
            limits.max_output_bytes,
        )
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
