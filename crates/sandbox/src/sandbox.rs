//! [`Sandbox`]: the shared engine, the module cache, the epoch ticker, and the one function
//! that runs a policy call under its limits.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::{Duration, Instant};

use sha2::{Digest as _, Sha256};
use wasmtime::{
    Caller, Config, Engine, EngineWeak, ExternType, InstanceAllocationStrategy, InstancePre,
    Linker, Module, ModuleExport, OptLevel, PoolingAllocationConfig, ResourceLimiter, Store,
    TypedFunc, ValType,
};

use crate::abi::{
    self, ABI_VERSION, EXPORT_ALLOC, EXPORT_INPUTS, EXPORT_MEMORY, EXPORT_SELECT, EXPORT_VERSION,
    IMPORT_LOG, IMPORT_MODULE, RawDecision,
};
use crate::encode::Message;
use crate::error::{CallContext, HostFault, PolicyError, classify};
use crate::inputs::{Inputs, MAX_DECLARATION_BYTES};
use crate::limits::Limits;
use crate::policy::WasmPolicy;
use crate::ratelimit::TokenBucket;

/// How often the epoch advances while calls run: the granularity of the wall-clock guard.
const TICK: Duration = Duration::from_millis(2);
/// After this long without calls the ticker thread sleeps until the next call.
const IDLE_PARK: Duration = Duration::from_secs(1);
/// Native stack a policy may use (its shadow stack lives in linear memory).
const MAX_WASM_STACK: usize = 256 << 10;
/// Most table elements a policy may have.
const MAX_TABLE_ELEMENTS: usize = 10_000;
/// Fuel charged for one `kubedev.log` call, plus one unit per byte.
const LOG_FUEL: u64 = 1_000;
/// Fuel of the ABI-version call made when a module is loaded.
const VERSION_CALL_FUEL: u64 = 1_000_000;

/// The WebAssembly host for selection policies: one engine configured for deterministic,
/// bounded execution, a cache of compiled modules keyed by content hash, and the limits
/// every call runs under. Cheap to clone; clones share everything.
#[derive(Clone)]
pub struct Sandbox {
    pub(crate) inner: Arc<SandboxInner>,
}

impl std::fmt::Debug for Sandbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sandbox")
            .field("limits", &self.inner.limits)
            .field("cached_modules", &self.cached_modules())
            .finish_non_exhaustive()
    }
}

pub(crate) struct SandboxInner {
    engine: Engine,
    linker: Linker<Host>,
    pub(crate) limits: Limits,
    cache: Mutex<HashMap<[u8; 32], Weak<Compiled>>>,
    ticker: Arc<Ticker>,
}

impl Drop for SandboxInner {
    fn drop(&mut self) {
        self.ticker.shut_down();
    }
}

/// A compiled module that keeps the contract, shared by every policy loaded from the same
/// bytes.
pub(crate) struct Compiled {
    pub(crate) digest: [u8; 32],
    pub(crate) size: usize,
    pub(crate) compile_time: Duration,
    pub(crate) imports_log: bool,
    /// What the policy reads (everything unless it declares less).
    pub(crate) inputs: Inputs,
    /// The text of its input declaration, if it has one.
    pub(crate) declaration_text: Option<String>,
    pre: InstancePre<Host>,
    memory: ModuleExport,
    alloc: ModuleExport,
    select: ModuleExport,
    version: ModuleExport,
    declaration: Option<ModuleExport>,
}

impl Sandbox {
    /// A sandbox whose calls run under `limits`.
    pub fn new(limits: Limits) -> Result<Sandbox, PolicyError> {
        limits
            .check()
            .map_err(|message| PolicyError::Engine { message })?;
        let mut config = Config::new();
        config
            .consume_fuel(true)
            .epoch_interruption(true)
            // Determinism: the same input gives the same answer and fuel on every machine.
            .cranelift_nan_canonicalization(true)
            .wasm_relaxed_simd(false)
            .relaxed_simd_deterministic(true)
            .wasm_memory64(false)
            .wasm_multi_memory(false)
            .max_wasm_stack(MAX_WASM_STACK)
            .cranelift_opt_level(OptLevel::Speed);
        let slots = limits.max_concurrent_calls;
        let mut pool = PoolingAllocationConfig::new();
        pool.total_core_instances(slots)
            .total_memories(slots)
            .total_tables(slots)
            .max_memories_per_module(1)
            .max_tables_per_module(1)
            .table_elements(MAX_TABLE_ELEMENTS)
            .max_memory_size(limits.memory_bytes)
            // Reset small memories with memset instead of madvise: fewer syscalls per call.
            .linear_memory_keep_resident(256 << 10)
            .table_keep_resident(64 << 10);
        config.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
        let engine = Engine::new(&config).map_err(|e| PolicyError::Engine {
            message: e.to_string(),
        })?;
        let mut linker = Linker::new(&engine);
        linker
            .func_wrap(IMPORT_MODULE, IMPORT_LOG, host_log)
            .map_err(|e| PolicyError::Engine {
                message: e.to_string(),
            })?;
        let ticker = Ticker::start(engine.weak()).map_err(|e| PolicyError::Engine {
            message: format!("start the epoch ticker thread: {e}"),
        })?;
        Ok(Sandbox {
            inner: Arc::new(SandboxInner {
                engine,
                linker,
                limits,
                cache: Mutex::new(HashMap::new()),
                ticker,
            }),
        })
    }

    /// The limits calls run under.
    pub fn limits(&self) -> &Limits {
        &self.inner.limits
    }

    /// Compiles (or takes from the cache) and checks a policy module. The module must keep
    /// the contract of the crate docs; the check calls its ABI-version export once.
    pub fn load(&self, name: &str, wasm: &[u8]) -> Result<WasmPolicy, PolicyError> {
        let compiled = self.compile(name, wasm)?;
        Ok(WasmPolicy::new(name, compiled, self.clone()))
    }

    /// [`Sandbox::load`] of a file; the policy is named after the file stem.
    pub fn load_file(&self, path: &Path) -> Result<WasmPolicy, PolicyError> {
        let bytes = read_module(path, self.inner.limits.max_module_bytes)?;
        check_magic(path, &bytes)?;
        self.load(&policy_name(path), &bytes)
    }

    /// Number of compiled modules in the cache that a live policy still uses.
    pub fn cached_modules(&self) -> usize {
        let cache = self.inner.cache.lock().unwrap_or_else(|p| p.into_inner());
        cache.values().filter(|w| w.strong_count() > 0).count()
    }

    pub(crate) fn compile(&self, name: &str, wasm: &[u8]) -> Result<Arc<Compiled>, PolicyError> {
        let limits = &self.inner.limits;
        let bad = |reason: String| PolicyError::BadModule {
            policy: name.to_string(),
            reason,
        };
        if wasm.len() > limits.max_module_bytes {
            return Err(bad(format!(
                "module has {} bytes, the limit is {}",
                wasm.len(),
                limits.max_module_bytes
            )));
        }
        if !wasm.starts_with(WASM_MAGIC) {
            return Err(bad(
                "it is not a WebAssembly module (it does not start with \\0asm)".to_string(),
            ));
        }
        let digest: [u8; 32] = Sha256::digest(wasm).into();
        {
            let mut cache = self.inner.cache.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(c) = cache.get(&digest).and_then(Weak::upgrade) {
                return Ok(c);
            }
            cache.retain(|_, w| w.strong_count() > 0);
        }
        crate::shape::check(wasm, limits).map_err(bad)?;
        let started = Instant::now();
        let module = self.compile_with_deadline(wasm).map_err(bad)?;
        let compile_time = started.elapsed();
        let (exports, declaration, imports_log) = check_contract(&module, limits).map_err(bad)?;
        let pre = self
            .inner
            .linker
            .instantiate_pre(&module)
            .map_err(|e| bad(format!("cannot be linked: {}", chain(&e))))?;
        let mut compiled = Compiled {
            digest,
            size: wasm.len(),
            compile_time,
            imports_log,
            inputs: Inputs::default(),
            declaration_text: None,
            pre,
            memory: exports[0],
            alloc: exports[1],
            select: exports[2],
            version: exports[3],
            declaration,
        };
        let (version, declared) = self
            .inner
            .call_version(name, &compiled)
            .map_err(|e| bad(strip_policy(&e, name)))?;
        if version != ABI_VERSION as i32 {
            return Err(bad(format!(
                "{EXPORT_VERSION} returned {version}, this host speaks ABI version {ABI_VERSION}"
            )));
        }
        if let Some(text) = declared {
            compiled.inputs = Inputs::parse(&text)
                .map_err(|e| bad(format!("the declaration of {EXPORT_INPUTS}: {e}")))?;
            compiled.declaration_text = Some(text);
        }
        let compiled = Arc::new(compiled);
        let mut cache = self.inner.cache.lock().unwrap_or_else(|p| p.into_inner());
        // Another thread may have compiled the same bytes meanwhile: keep one copy.
        if let Some(c) = cache.get(&digest).and_then(Weak::upgrade) {
            return Ok(c);
        }
        cache.insert(digest, Arc::downgrade(&compiled));
        Ok(compiled)
    }
}

impl Sandbox {
    /// Compiles `wasm` on a thread of its own and waits at most the compile timeout; a module
    /// that takes longer is refused (its compilation finishes in the background and is
    /// dropped), so neither start-up nor a reload waits on it.
    fn compile_with_deadline(&self, wasm: &[u8]) -> Result<Module, String> {
        let timeout = self.inner.limits.compile_timeout;
        let (tx, rx) = std::sync::mpsc::channel();
        let engine = self.inner.engine.clone();
        let bytes = wasm.to_vec();
        std::thread::Builder::new()
            .name("kubedev-policy-compile".into())
            .spawn(move || {
                let _ = tx.send(Module::from_binary(&engine, &bytes));
            })
            .map_err(|e| format!("cannot start a compiler thread: {e}"))?;
        match rx.recv_timeout(timeout) {
            Ok(Ok(module)) => Ok(module),
            Ok(Err(e)) => Err(format!("does not compile: {}", chain(&e))),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => Err(format!(
                "it did not compile within {} s, the most allowed",
                timeout.as_secs_f64()
            )),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                Err("the compiler thread stopped without an answer".into())
            }
        }
    }
}

/// The error message without the `policy NAME: ` prefix.
pub(crate) fn strip_policy(e: &PolicyError, name: &str) -> String {
    let s = e.to_string();
    s.strip_prefix(&format!("policy {name}: "))
        .map(str::to_string)
        .unwrap_or(s)
}

fn chain(e: &wasmtime::Error) -> String {
    e.chain()
        .map(|c| c.to_string())
        .collect::<Vec<_>>()
        .join(": ")
}

/// The policy name of a file: its stem.
pub(crate) fn policy_name(path: &Path) -> String {
    path.file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.display().to_string())
}

/// The first four bytes of every WebAssembly module.
const WASM_MAGIC: &[u8] = b"\0asm";

/// A policy file that is not WebAssembly at all is [`PolicyError::NotWasm`], named by its path
/// (rather than the compiler's dump of the bytes it found).
pub(crate) fn check_magic(path: &Path, bytes: &[u8]) -> Result<(), PolicyError> {
    if bytes.starts_with(WASM_MAGIC) {
        Ok(())
    } else {
        Err(PolicyError::NotWasm {
            policy: policy_name(path),
            path: path.to_path_buf(),
        })
    }
}

/// Reads a module file, refusing files over `max` bytes before reading them.
pub(crate) fn read_module(path: &Path, max: usize) -> Result<Vec<u8>, PolicyError> {
    let meta = std::fs::metadata(path).map_err(|e| PolicyError::io(path, e))?;
    if meta.len() > max as u64 {
        return Err(PolicyError::BadModule {
            policy: policy_name(path),
            reason: format!("file has {} bytes, the limit is {max}", meta.len()),
        });
    }
    std::fs::read(path).map_err(|e| PolicyError::io(path, e))
}

fn describe(ty: &ExternType) -> String {
    match ty {
        ExternType::Func(f) => format!(
            "function ({}) -> ({})",
            f.params()
                .map(|p| p.to_string())
                .collect::<Vec<_>>()
                .join(", "),
            f.results()
                .map(|p| p.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
        ExternType::Memory(_) => "memory".into(),
        ExternType::Table(_) => "table".into(),
        ExternType::Global(_) => "global".into(),
        ExternType::Tag(_) => "tag".into(),
    }
}

fn func_is(ty: &ExternType, params: &[ValType], results: &[ValType]) -> bool {
    let ExternType::Func(f) = ty else {
        return false;
    };
    let eq = |a: ValType, b: &ValType| {
        matches!(
            (a, b),
            (ValType::I32, ValType::I32) | (ValType::I64, ValType::I64)
        )
    };
    f.params().len() == params.len()
        && f.results().len() == results.len()
        && f.params().zip(params).all(|(a, b)| eq(a, b))
        && f.results().zip(results).all(|(a, b)| eq(a, b))
}

/// The export handles of the contract: memory, alloc, select, version.
type ContractExports = [ModuleExport; 4];

/// Checks imports and exports; returns the export handles, the optional input declaration
/// export and whether the module imports `kubedev.log`.
fn check_contract(
    module: &Module,
    limits: &Limits,
) -> Result<(ContractExports, Option<ModuleExport>, bool), String> {
    let mut imports_log = false;
    for imp in module.imports() {
        let ty = imp.ty();
        if imp.module() == IMPORT_MODULE
            && imp.name() == IMPORT_LOG
            && func_is(&ty, &[ValType::I32, ValType::I32], &[])
        {
            imports_log = true;
            continue;
        }
        return Err(format!(
            "imports {}.{} ({}); a policy may import only {IMPORT_MODULE}.{IMPORT_LOG}: function (i32, i32) -> ()",
            imp.module(),
            imp.name(),
            describe(&ty)
        ));
    }
    let export_ty = |name: &str| module.exports().find(|e| e.name() == name).map(|e| e.ty());
    match export_ty(EXPORT_MEMORY) {
        Some(ExternType::Memory(m)) => {
            if m.is_64() || m.is_shared() {
                return Err("memory must be a 32-bit unshared memory".into());
            }
            let min = m.minimum().saturating_mul(m.page_size());
            if min > limits.memory_bytes as u64 {
                return Err(format!(
                    "memory starts at {min} bytes, over the limit of {} bytes",
                    limits.memory_bytes
                ));
            }
        }
        Some(other) => {
            return Err(format!(
                "export {EXPORT_MEMORY:?} is a {}, not a memory",
                describe(&other)
            ));
        }
        None => return Err(format!("does not export {EXPORT_MEMORY:?}")),
    }
    let funcs: [(&str, &[ValType], &[ValType], &str); 3] = [
        (
            EXPORT_ALLOC,
            &[ValType::I32],
            &[ValType::I32],
            "(i32) -> (i32)",
        ),
        (
            EXPORT_SELECT,
            &[ValType::I32, ValType::I32],
            &[ValType::I64],
            "(i32, i32) -> (i64)",
        ),
        (EXPORT_VERSION, &[], &[ValType::I32], "() -> (i32)"),
    ];
    for (name, params, results, sig) in funcs {
        match export_ty(name) {
            Some(ty) if func_is(&ty, params, results) => {}
            Some(ty) => {
                return Err(format!(
                    "export {name:?} is a {}, the contract wants function {sig}",
                    describe(&ty)
                ));
            }
            None => return Err(format!("does not export function {name:?} {sig}")),
        }
    }
    let declaration = match export_ty(EXPORT_INPUTS) {
        None => false,
        Some(ty) if func_is(&ty, &[], &[ValType::I64]) => true,
        Some(ty) => {
            return Err(format!(
                "export {EXPORT_INPUTS:?} is a {}, the contract wants function () -> (i64)",
                describe(&ty)
            ));
        }
    };
    let index = |name: &str| {
        module
            .get_export_index(name)
            .ok_or_else(|| format!("export {name:?} has no index"))
    };
    Ok((
        [
            index(EXPORT_MEMORY)?,
            index(EXPORT_ALLOC)?,
            index(EXPORT_SELECT)?,
            index(EXPORT_VERSION)?,
        ],
        if declaration {
            Some(index(EXPORT_INPUTS)?)
        } else {
            None
        },
        imports_log,
    ))
}

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
        let text = String::from_utf8_lossy(&bytes[..cut]).into_owned();
        let allowed = self.bucket.lock().map(|mut b| b.take()).unwrap_or(false);
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
fn host_log(mut caller: Caller<'_, Host>, ptr: i32, len: i32) -> wasmtime::Result<()> {
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
    fn call_version(
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
            let text = std::str::from_utf8(bytes)
                .map_err(|e| fault(format!("{EXPORT_INPUTS} is not UTF-8: {e}")))?;
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
        let bad_output = |reason: String| PolicyError::BadOutput {
            policy: policy.to_string(),
            reason,
        };
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
        let wasm = |store: &mut Store<Host>, e: wasmtime::Error| {
            classify(&policy, &e, &self.context(store, fuel))
        };
        let instance = match compiled.pre.instantiate(&mut store) {
            Ok(i) => i,
            Err(e) => return Err(wasm(&mut store, e)),
        };
        let memory = match instance.get_module_export(&mut store, &compiled.memory) {
            Some(wasmtime::Extern::Memory(m)) => m,
            _ => return Err(bad_output(format!("{EXPORT_MEMORY:?} is missing"))),
        };
        let alloc: TypedFunc<i32, i32> = match typed(&instance, &mut store, &compiled.alloc) {
            Ok(f) => f,
            Err(e) => return Err(wasm(&mut store, e)),
        };
        let select: TypedFunc<(i32, i32), i64> =
            match typed(&instance, &mut store, &compiled.select) {
                Ok(f) => f,
                Err(e) => return Err(wasm(&mut store, e)),
            };
        let ptr = match alloc.call(&mut store, len) {
            Ok(p) => p as u32 as usize,
            Err(e) => return Err(wasm(&mut store, e)),
        };
        if ptr == 0 {
            return Err(bad_output(format!(
                "{EXPORT_ALLOC}({len}) returned 0 (no memory for the input)"
            )));
        }
        let written = memory
            .write(&mut store, ptr, &input.records)
            .and_then(|()| memory.write(&mut store, ptr + input.records.len(), &input.strings));
        if written.is_err() {
            return Err(bad_output(format!(
                "{EXPORT_ALLOC}({len}) returned {ptr}, but {len} bytes from there are outside the memory of {} bytes",
                memory.data_size(&store)
            )));
        }
        let packed = match select.call(&mut store, (ptr as i32, len)) {
            Ok(p) => p as u64,
            Err(e) => return Err(wasm(&mut store, e)),
        };
        let (out_ptr, out_len) = ((packed >> 32) as usize, (packed & 0xffff_ffff) as usize);
        if out_len > limits.max_output_bytes {
            return Err(bad_output(format!(
                "output of {out_len} bytes is over the limit of {} bytes",
                limits.max_output_bytes
            )));
        }
        let data = memory.data(&store);
        let Some(bytes) = out_ptr
            .checked_add(out_len)
            .and_then(|e| data.get(out_ptr..e))
        else {
            return Err(bad_output(format!(
                "output at {out_ptr} of {out_len} bytes is outside the memory of {} bytes",
                data.len()
            )));
        };
        let decision = abi::decode_output(bytes, candidates).map_err(bad_output)?;
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

/// Advances the engine's epoch every [`TICK`] while calls run, so a call past its deadline
/// is interrupted; sleeps when no call has run for [`IDLE_PARK`].
struct Ticker {
    active: AtomicUsize,
    parked: AtomicBool,
    shutdown: AtomicBool,
    lock: Mutex<()>,
    wake: Condvar,
}

/// Marks a call as running for the ticker.
struct Active<'t>(&'t Ticker);

impl Drop for Active<'_> {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Ticker {
    fn start(engine: EngineWeak) -> std::io::Result<Arc<Ticker>> {
        let ticker = Arc::new(Ticker {
            active: AtomicUsize::new(0),
            parked: AtomicBool::new(false),
            shutdown: AtomicBool::new(false),
            lock: Mutex::new(()),
            wake: Condvar::new(),
        });
        let t = ticker.clone();
        std::thread::Builder::new()
            .name("kubedev-policy-epoch".into())
            .stack_size(64 << 10)
            .spawn(move || t.run(engine))?;
        Ok(ticker)
    }

    fn enter(&self) -> Active<'_> {
        self.active.fetch_add(1, Ordering::SeqCst);
        if self.parked.load(Ordering::SeqCst) {
            // The ticker holds the lock until it waits, so this wakes it for sure.
            let _g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
            self.wake.notify_one();
        }
        Active(self)
    }

    fn shut_down(&self) {
        self.shutdown.store(true, Ordering::SeqCst);
        let _g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        self.wake.notify_one();
    }

    fn run(&self, engine: EngineWeak) {
        let mut idle_since: Option<Instant> = None;
        loop {
            if self.shutdown.load(Ordering::SeqCst) {
                return;
            }
            if self.active.load(Ordering::SeqCst) == 0 {
                let now = Instant::now();
                if now.duration_since(*idle_since.get_or_insert(now)) >= IDLE_PARK {
                    let mut g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
                    self.parked.store(true, Ordering::SeqCst);
                    while self.active.load(Ordering::SeqCst) == 0
                        && !self.shutdown.load(Ordering::SeqCst)
                    {
                        g = self.wake.wait(g).unwrap_or_else(|p| p.into_inner());
                    }
                    self.parked.store(false, Ordering::SeqCst);
                    idle_since = None;
                    continue;
                }
            } else {
                idle_since = None;
            }
            std::thread::sleep(TICK);
            match engine.upgrade() {
                Some(e) => e.increment_epoch(),
                None => return,
            }
        }
    }
}
