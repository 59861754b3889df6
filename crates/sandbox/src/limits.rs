//! [`Limits`]: what one policy call may use.

use std::time::Duration;

/// What one policy call may use, and the sandbox's capacity. Fuel is the deterministic
/// meter that decides; the wall clock is only a backstop.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Limits {
    /// Fuel per call (about one unit per WebAssembly instruction). Default 10 000 000:
    /// tens of milliseconds at most, several hundred times what the example policies
    /// use for 64 candidates.
    pub fuel: u64,
    /// Largest linear memory, bytes. Default 64 MiB.
    pub memory_bytes: usize,
    /// Wall-clock limit per call. Default 100 ms.
    pub timeout: Duration,
    /// Largest output message, bytes. Default 1 MiB.
    pub max_output_bytes: usize,
    /// Largest module file, bytes. Default 16 MiB.
    pub max_module_bytes: usize,
    /// Calls that can run at the same time (instance slots of the pooling allocator).
    /// Default 32.
    pub max_concurrent_calls: u32,
    /// Log lines a call may write through `kubedev.log`; more are dropped. Default 16.
    pub log_lines_per_call: u32,
    /// Longest log line kept, bytes; longer lines are cut. Default 512.
    pub log_line_bytes: usize,
    /// Most functions a module may define. Default 10 000.
    pub max_functions: u32,
    /// Deepest nesting of blocks, loops and ifs in a function. Default 1 000: compilers nest a
    /// few dozen deep; compile time grows faster than linearly with the depth.
    pub max_nesting: u32,
    /// Wall-clock limit on compiling one module; a module that takes longer is refused (the
    /// compilation finishes in the background and is thrown away). Default 10 s.
    pub compile_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            fuel: 10_000_000,
            memory_bytes: 64 << 20,
            timeout: Duration::from_millis(100),
            max_output_bytes: 1 << 20,
            max_module_bytes: 16 << 20,
            max_concurrent_calls: 32,
            log_lines_per_call: 16,
            log_line_bytes: 512,
            max_functions: 10_000,
            max_nesting: 1_000,
            compile_timeout: Duration::from_secs(10),
        }
    }
}

impl Limits {
    /// With a fuel budget per call.
    pub fn with_fuel(mut self, fuel: u64) -> Self {
        self.fuel = fuel;
        self
    }

    /// With a memory limit, bytes (rounded down to whole 64 KiB pages).
    pub fn with_memory_bytes(mut self, bytes: usize) -> Self {
        self.memory_bytes = bytes;
        self
    }

    /// With a wall-clock limit per call.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// With a limit on the output message size, bytes.
    pub fn with_max_output_bytes(mut self, bytes: usize) -> Self {
        self.max_output_bytes = bytes;
        self
    }

    /// With a number of calls that can run at the same time.
    pub fn with_max_concurrent_calls(mut self, calls: u32) -> Self {
        self.max_concurrent_calls = calls;
        self
    }

    /// With a limit on how deeply blocks may nest in a function.
    pub fn with_max_nesting(mut self, depth: u32) -> Self {
        self.max_nesting = depth;
        self
    }

    /// With a wall-clock limit on compiling one module.
    pub fn with_compile_timeout(mut self, timeout: Duration) -> Self {
        self.compile_timeout = timeout;
        self
    }

    /// Checks the limits make sense.
    pub(crate) fn check(&self) -> Result<(), String> {
        if self.fuel == 0 {
            return Err("fuel must be positive".into());
        }
        if self.memory_bytes < 64 << 10 {
            return Err(format!(
                "memory limit {} bytes is below one 64 KiB page",
                self.memory_bytes
            ));
        }
        if self.memory_bytes > 1 << 32 {
            return Err(format!(
                "memory limit {} bytes is above the 4 GiB of a 32-bit memory",
                self.memory_bytes
            ));
        }
        if self.timeout.is_zero() {
            return Err("timeout must be positive".into());
        }
        if self.compile_timeout.is_zero() {
            return Err("compile_timeout must be positive".into());
        }
        if self.max_concurrent_calls == 0 {
            return Err("max_concurrent_calls must be positive".into());
        }
        Ok(())
    }
}
