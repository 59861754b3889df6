//! [`Sandbox`]: the shared engine, the module cache, the epoch ticker, and the one function
//! that runs a policy call under its limits.
//!
//! This module holds the engine, the module cache and compilation; `contract` checks a module's
//! imports and exports, `call` runs calls under their limits and `ticker` drives the epoch.

mod call;
mod contract;
mod ticker;

use parking_lot::Mutex;
use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

use sha2::{Digest as _, Sha256};
use wasmtime::{
    Config, Engine, InstanceAllocationStrategy, InstancePre, Linker, Module, ModuleExport,
    OptLevel, PoolingAllocationConfig,
};

use crate::abi::{ABI_VERSION, EXPORT_INPUTS, EXPORT_VERSION, IMPORT_LOG, IMPORT_MODULE};
use crate::error::PolicyError;
use crate::inputs::Inputs;
use crate::limits::Limits;
use call::host_log;
use contract::check_contract;
use ticker::Ticker;

pub(crate) use call::{CallOutput, Host, LogSink};
use call::{MemoryImage, Ready};

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
    /// The exports naming the module's mutable globals, when its instances can be restored
    /// after a call and reused (see `restore`).
    globals: Option<Vec<ModuleExport>>,
    /// Instances restored after a call, ready for the next one.
    idle: Mutex<Vec<Ready>>,
    /// The memory every instance starts with, taken from the first one (`None`: too large to
    /// restore).
    memory_image: OnceLock<Option<Arc<MemoryImage>>>,
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
            message: format!(
                "start the epoch ticker thread: {}",
                kubedev_core::echo::chain(&e)
            ),
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

    /// Number of compiled modules in the cache that a live policy still uses.
    pub fn cached_modules(&self) -> usize {
        let cache = self.inner.cache.lock();
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
            let mut cache = self.inner.cache.lock();
            if let Some(c) = cache.get(&digest).and_then(Weak::upgrade) {
                return Ok(c);
            }
            cache.retain(|_, w| w.strong_count() > 0);
        }
        crate::shape::check(wasm, limits).map_err(bad)?;
        let started = Instant::now();
        let (module, restorable) = self.compile_restorable(wasm).map_err(bad)?;
        let compile_time = started.elapsed();
        let globals = restorable.and_then(|r| {
            r.globals
                .iter()
                .map(|name| module.get_export_index(name))
                .collect::<Option<Vec<_>>>()
        });
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
            globals,
            idle: Mutex::new(Vec::new()),
            memory_image: OnceLock::new(),
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
        let mut cache = self.inner.cache.lock();
        // Another thread may have compiled the same bytes meanwhile: keep one copy.
        if let Some(c) = cache.get(&digest).and_then(Weak::upgrade) {
            return Ok(c);
        }
        cache.insert(digest, Arc::downgrade(&compiled));
        Ok(compiled)
    }
}

impl Sandbox {
    /// Compiles `wasm`, with an export added per mutable global when its instances can be
    /// restored after a call; returns the module and, in that case, how to restore them. A
    /// rewritten module that does not compile is compiled again as it was given, so the
    /// error is the one its own bytes give.
    fn compile_restorable(
        &self,
        wasm: &[u8],
    ) -> Result<(Module, Option<crate::restore::Restorable>), String> {
        let Some(plan) = crate::restore::plan(wasm) else {
            return Ok((self.compile_with_deadline(wasm)?, None));
        };
        let Some(rewritten) = &plan.rewritten else {
            return Ok((self.compile_with_deadline(wasm)?, Some(plan)));
        };
        match self.compile_with_deadline(rewritten) {
            Ok(module) => Ok((module, Some(plan))),
            Err(CompileError::Timeout(e)) => Err(e),
            Err(CompileError::Other(_)) => Ok((self.compile_with_deadline(wasm)?, None)),
        }
    }

    /// Compiles `wasm` on a thread of its own and waits at most the compile timeout; a module
    /// that takes longer is refused (its compilation finishes in the background and is
    /// dropped), so neither start-up nor a reload waits on it.
    fn compile_with_deadline(&self, wasm: &[u8]) -> Result<Module, CompileError> {
        let timeout = self.inner.limits.compile_timeout;
        let (tx, rx) = std::sync::mpsc::channel();
        let engine = self.inner.engine.clone();
        let bytes = wasm.to_vec();
        std::thread::Builder::new()
            .name("kubedev-policy-compile".into())
            .spawn(move || {
                let _ = tx.send(Module::from_binary(&engine, &bytes));
            })
            .map_err(|e| {
                CompileError::Other(format!(
                    "cannot start a compiler thread: {}",
                    kubedev_core::echo::chain(&e)
                ))
            })?;
        match rx.recv_timeout(timeout) {
            Ok(Ok(module)) => Ok(module),
            Ok(Err(e)) => Err(CompileError::Other(format!(
                "does not compile: {}",
                chain(&e)
            ))),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => Err(CompileError::Timeout(format!(
                "it did not compile within {} s, the most allowed",
                timeout.as_secs_f64()
            ))),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => Err(CompileError::Other(
                "the compiler thread stopped without an answer".into(),
            )),
        }
    }
}

/// Why a module did not compile: the message for [`PolicyError::BadModule`].
enum CompileError {
    /// It took longer than the compile timeout.
    Timeout(String),
    /// Any other reason.
    Other(String),
}

impl From<CompileError> for String {
    fn from(e: CompileError) -> String {
        match e {
            CompileError::Timeout(m) | CompileError::Other(m) => m,
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
