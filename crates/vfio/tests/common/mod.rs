//! Helpers shared by the integration tests.
#![allow(dead_code, unreachable_pub)]

use std::collections::BTreeMap;

use kubedev_core::{
    AllocatedDevice, AttributeValue, BackendContext, ClaimRef, Device, DeviceName, DeviceRef, Pool,
    PoolName,
};
use kubedev_testkit::hostroot::HostRoot;
use kubedev_vfio::{VfioBackend, VfioConfig};

/// A backend on `root` with state in `state`.
pub fn backend(root: &HostRoot, state: &std::path::Path, config: serde_json::Value) -> VfioBackend {
    let config: VfioConfig = serde_json::from_value(config).expect("config parses");
    VfioBackend::new(
        config,
        &BackendContext::new(kubedev_core::HostFs::new(root.path()), state, "node-a"),
    )
    .expect("backend")
}

/// The attributes of a device as plain strings (`s:` string, `i:` int), by name.
pub fn attrs(d: &Device) -> BTreeMap<String, String> {
    d.attributes
        .iter()
        .map(|(k, v)| {
            let v = match v {
                AttributeValue::String(s) => format!("s:{s}"),
                AttributeValue::Int(i) => format!("i:{i}"),
                AttributeValue::Bool(b) => format!("b:{b}"),
                other => format!("{other:?}"),
            };
            (k.to_string(), v)
        })
        .collect()
}

/// A table from `(name, value)` pairs.
pub fn table(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// The device names of a pool.
pub fn names(pool: &Pool) -> Vec<String> {
    pool.devices.iter().map(|d| d.name.to_string()).collect()
}

/// An allocation of `device` in pool `node-a-vfio`.
pub fn alloc(device: &str) -> AllocatedDevice {
    AllocatedDevice::new(DeviceRef::new(
        PoolName::new("node-a-vfio").expect("pool"),
        DeviceName::new(device).expect("device name"),
    ))
    .with_request("req")
}

/// A claim.
pub fn claim() -> ClaimRef {
    ClaimRef::parse("uid-1", "default", "vm-claim").unwrap()
}

thread_local! {
    /// The log lines of the current thread, while `with_logs` runs.
    static CAPTURE: std::cell::RefCell<Option<Vec<u8>>> = const { std::cell::RefCell::new(None) };
}

/// Writes log lines into the current thread's capture buffer, if one is open.
struct ThreadWriter;

impl std::io::Write for ThreadWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        CAPTURE.with(|c| {
            if let Some(v) = c.borrow_mut().as_mut() {
                v.extend_from_slice(buf);
            }
        });
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Runs `f` with the current thread's debug logs captured; returns its result and the logs.
///
/// One global subscriber (set once per test binary) writes to per-thread buffers, so tests
/// running in parallel neither miss events nor see each other's.
pub fn with_logs<T>(f: impl FnOnce() -> T) -> (T, String) {
    static INIT: std::sync::Once = std::sync::Once::new();
    INIT.call_once(|| {
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::DEBUG)
            .with_ansi(false)
            .with_writer(|| ThreadWriter)
            .finish();
        tracing::subscriber::set_global_default(subscriber).expect("one global subscriber");
    });
    CAPTURE.with(|c| *c.borrow_mut() = Some(Vec::new()));
    let out = f();
    let logs = CAPTURE.with(|c| c.borrow_mut().take()).unwrap_or_default();
    (out, String::from_utf8_lossy(&logs).into_owned())
}
