//! [`PciKernelSim`]: the kernel's part in driver binding (`unbind`, `bind`, `drivers_probe`,
//! `driver_override`), played on a background thread over a fake root.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use super::{VFIO_PCI, rel_from};

/// Plays the kernel's part for driver binding in a fake root, on a background thread that
/// polls every millisecond:
///
/// - an address written to `/sys/bus/pci/drivers/<d>/unbind` unbinds the function from `d`
///   (and removes `/dev/vfio/<group>` when the last `vfio-pci` function of the group leaves);
/// - an address written to `/sys/bus/pci/drivers_probe` binds an unbound function to the driver
///   named in its `driver_override`, or to the driver it had when the simulator started (unless
///   that was `vfio-pci`);
/// - an address written to `/sys/bus/pci/drivers/<d>/bind` binds an unbound function to `d`,
///   unless its `driver_override` names another driver;
/// - writing a newline to `driver_override` clears it (reads back `(null)`).
///
/// Binding to `vfio-pci` creates `/dev/vfio/<group>`. Within one poll unbinds run before probes
/// and binds, so a writer that waits for each effect before its next write of the same file
/// sees what the kernel would do. Stops when dropped.
#[derive(Debug)]
pub struct PciKernelSim {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl PciKernelSim {
    /// Starts simulating on the root at `root` (the path of a
    /// [`HostRoot`](crate::hostroot::HostRoot)).
    pub fn start(root: &Path) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let root = root.to_path_buf();
        let native = current_drivers(&root);
        let thread = std::thread::spawn({
            let stop = stop.clone();
            move || {
                while !stop.load(Ordering::Relaxed) {
                    sim_step(&root, &native);
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        });
        PciKernelSim {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for PciKernelSim {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn under(root: &Path, host: &str) -> PathBuf {
    root.join(host.trim_start_matches('/'))
}

pub(super) fn link_name(p: &Path) -> Option<String> {
    std::fs::read_link(p)
        .ok()
        .and_then(|t| t.file_name().map(|n| n.to_string_lossy().into_owned()))
}

/// Address → driver of every function now bound to something other than vfio-pci.
fn current_drivers(root: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let Ok(rd) = std::fs::read_dir(under(root, "/sys/bus/pci/devices")) else {
        return out;
    };
    for e in rd.filter_map(Result::ok) {
        let addr = e.file_name().to_string_lossy().into_owned();
        if let Some(d) = link_name(&e.path().join("driver"))
            && d != VFIO_PCI
        {
            out.insert(addr, d);
        }
    }
    out
}

/// Takes a request out of a control file: its trimmed content, leaving the file empty.
fn take_request(p: &Path) -> Option<String> {
    let s = std::fs::read_to_string(p).ok()?;
    let s = s.trim().to_owned();
    if s.is_empty() {
        return None;
    }
    std::fs::write(p, "").ok()?;
    Some(s)
}

/// The function's sysfs directory (the target of its `/sys/bus/pci/devices` link).
fn device_dir(root: &Path, addr: &str) -> Option<PathBuf> {
    let link = under(root, &format!("/sys/bus/pci/devices/{addr}"));
    let target = std::fs::read_link(&link).ok()?;
    let dir = link.parent()?.join(target);
    dir.exists().then_some(dir)
}

fn group_of(dev_dir: &Path) -> Option<String> {
    link_name(&dev_dir.join("iommu_group"))
}

fn sim_unbind(root: &Path, driver: &str, addr: &str) {
    let Some(dir) = device_dir(root, addr) else {
        return;
    };
    if link_name(&dir.join("driver")).as_deref() != Some(driver) {
        return;
    }
    // The group node goes first: once the driver link is gone, so is the node.
    if driver == VFIO_PCI
        && let Some(g) = group_of(&dir)
    {
        let members = under(root, &format!("/sys/kernel/iommu_groups/{g}/devices"));
        let still_vfio = std::fs::read_dir(members)
            .map(|rd| {
                rd.filter_map(Result::ok)
                    .filter(|e| e.file_name().to_string_lossy() != addr)
                    .any(|e| link_name(&e.path().join("driver")).as_deref() == Some(VFIO_PCI))
            })
            .unwrap_or(false);
        if !still_vfio {
            let _ = std::fs::remove_file(under(root, &format!("/dev/vfio/{g}")));
        }
    }
    let _ = std::fs::remove_file(under(
        root,
        &format!("/sys/bus/pci/drivers/{driver}/{addr}"),
    ));
    let _ = std::fs::remove_file(dir.join("driver"));
}

fn sim_bind(root: &Path, driver: &str, addr: &str) {
    let Some(dir) = device_dir(root, addr) else {
        return;
    };
    if dir.join("driver").symlink_metadata().is_ok() {
        return;
    }
    let override_ = std::fs::read_to_string(dir.join("driver_override")).unwrap_or_default();
    let override_ = override_.trim();
    if !override_.is_empty() && override_ != "(null)" && override_ != driver {
        return;
    }
    let drv_dir = under(root, &format!("/sys/bus/pci/drivers/{driver}"));
    if !drv_dir.is_dir() {
        return;
    }
    let host_dir = format!(
        "/{}",
        dir.strip_prefix(root)
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_default()
    );
    let rel_dir = host_dir.trim_start_matches("/sys/").to_owned();
    // The group node first: once the driver link shows, the node is there.
    if driver == VFIO_PCI
        && let Some(g) = group_of(&dir)
    {
        let _ = std::fs::create_dir_all(under(root, "/dev/vfio"));
        let _ = std::fs::write(under(root, &format!("/dev/vfio/{g}")), "");
    }
    let _ = std::os::unix::fs::symlink(
        rel_from(&format!("/sys/bus/pci/drivers/{driver}"), &rel_dir),
        drv_dir.join(addr),
    );
    let _ = std::os::unix::fs::symlink(
        rel_from(&host_dir, &format!("bus/pci/drivers/{driver}")),
        dir.join("driver"),
    );
}

fn sim_step(root: &Path, native: &BTreeMap<String, String>) {
    let drivers_dir = under(root, "/sys/bus/pci/drivers");
    let mut drivers: Vec<String> = std::fs::read_dir(&drivers_dir)
        .map(|rd| {
            rd.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    drivers.sort();
    // driver_override: writing a lone newline clears it. (An empty file is a write in
    // progress: left alone.)
    if let Ok(rd) = std::fs::read_dir(under(root, "/sys/bus/pci/devices")) {
        for e in rd.filter_map(Result::ok) {
            let p = e.path().join("driver_override");
            if let Ok(s) = std::fs::read_to_string(&p)
                && s == "\n"
            {
                let _ = std::fs::write(&p, "(null)\n");
            }
        }
    }
    for d in &drivers {
        if let Some(addr) = take_request(&drivers_dir.join(d).join("unbind")) {
            sim_unbind(root, d, &addr);
        }
    }
    if let Some(addr) = take_request(&under(root, "/sys/bus/pci/drivers_probe"))
        && let Some(dir) = device_dir(root, &addr)
    {
        let override_ = std::fs::read_to_string(dir.join("driver_override")).unwrap_or_default();
        let override_ = override_.trim();
        let target = if !override_.is_empty() && override_ != "(null)" {
            Some(override_.to_owned())
        } else {
            native.get(&addr).cloned()
        };
        if let Some(t) = target {
            sim_bind(root, &t, &addr);
        }
    }
    for d in &drivers {
        if let Some(addr) = take_request(&drivers_dir.join(d).join("bind")) {
            sim_bind(root, d, &addr);
        }
    }
}
