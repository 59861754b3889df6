//! Binding PCI functions to `vfio-pci` on prepare and giving them back on unprepare.
//!
//! Before anything on the host changes, the functions' drivers (and `driver_override`) are
//! recorded in `<state_dir>/bind/<device>.json` (written atomically and durably). Binding then
//! sets `driver_override` to `vfio-pci`, unbinds the current driver and asks the kernel to
//! probe (`/sys/bus/pci/drivers_probe`). Restoring puts the recorded `driver_override` back,
//! unbinds `vfio-pci` and binds the recorded driver (`/sys/bus/pci/drivers/<d>/bind`), then
//! removes the record. Because the record is written first, a restore after a crash at any
//! point finds what to undo; with no record there is nothing to undo.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use kubedev_core::HostFs;

use crate::error::VfioError;
use crate::naming::PciAddress;
use crate::pci::{PCI_DEVICES, VFIO_PCI, link_name_opt};
use crate::settle::wait_until;

/// The record of one device's functions before they were rebound.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BindRecord {
    /// The device name.
    pub device: String,
    /// Each function's original state.
    pub functions: Vec<OriginalBinding>,
}

/// One function's driver before it was bound to `vfio-pci`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OriginalBinding {
    /// The PCI address.
    pub address: String,
    /// The driver it was bound to (`None`: no driver).
    pub original_driver: Option<String>,
    /// Its `driver_override` (`None`: unset).
    #[serde(default)]
    pub original_override: Option<String>,
}

/// Where bind records live.
pub(crate) fn record_path(state_dir: &Path, device: &str) -> PathBuf {
    state_dir.join("bind").join(format!("{device}.json"))
}

/// A driver name safe to put in a sysfs path.
fn check_driver(name: &str) -> Result<&str, VfioError> {
    let ok = !name.is_empty()
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
    if ok {
        Ok(name)
    } else {
        Err(VfioError::Unsupported(format!(
            "{name:?} is not a driver name"
        )))
    }
}

fn driver_of(host: &HostFs, addr: &str) -> Result<Option<String>, VfioError> {
    Ok(link_name_opt(
        host,
        Path::new(&format!("{PCI_DEVICES}/{addr}/driver")),
    )?)
}

fn override_of(host: &HostFs, addr: &str) -> Result<Option<String>, VfioError> {
    let v = host.read_attr_opt(format!("{PCI_DEVICES}/{addr}/driver_override"))?;
    Ok(v.filter(|s| !s.is_empty() && s != "(null)"))
}

/// Binds every function of `addrs` to `vfio-pci`, recording the original drivers first (unless
/// a record from an earlier, unfinished prepare exists: that one holds the true originals).
/// Waits for `group_node` to appear. Blocking.
pub(crate) fn bind_to_vfio(
    host: &HostFs,
    state_dir: &Path,
    device: &str,
    addrs: &[PciAddress],
    group_node: &str,
    timeout: Duration,
) -> Result<(), VfioError> {
    if !host.exists(format!("/sys/bus/pci/drivers/{VFIO_PCI}")) {
        return Err(VfioError::Unsupported(format!(
            "the {VFIO_PCI} driver is not loaded (/sys/bus/pci/drivers/{VFIO_PCI} is missing)"
        )));
    }
    let rec = record_path(state_dir, device);
    if !rec.exists() {
        let mut functions = Vec::new();
        for a in addrs {
            let a = a.to_string();
            functions.push(OriginalBinding {
                original_driver: driver_of(host, &a)?,
                original_override: override_of(host, &a)?,
                address: a,
            });
        }
        if functions
            .iter()
            .all(|f| f.original_driver.as_deref() == Some(VFIO_PCI))
        {
            return Ok(());
        }
        let record = BindRecord {
            device: device.to_owned(),
            functions,
        };
        write_record(&rec, &record)?;
    }
    for a in addrs {
        let a = a.to_string();
        let current = driver_of(host, &a)?;
        if current.as_deref() == Some(VFIO_PCI) {
            continue;
        }
        host.write_attr(format!("{PCI_DEVICES}/{a}/driver_override"), VFIO_PCI)?;
        if let Some(d) = current {
            let d = check_driver(&d)?;
            host.write_attr(format!("/sys/bus/pci/drivers/{d}/unbind"), &a)?;
            wait_until(timeout, &format!("{a} unbound from {d}"), || {
                matches!(driver_of(host, &a), Ok(None))
            })?;
        }
        host.write_attr("/sys/bus/pci/drivers_probe", &a)?;
        wait_until(
            timeout,
            &format!("{a} bound to {VFIO_PCI}"),
            || matches!(driver_of(host, &a), Ok(Some(d)) if d == VFIO_PCI),
        )?;
        tracing::info!(address = %a, "bound to {VFIO_PCI}");
    }
    wait_until(timeout, &format!("{group_node} to appear"), || {
        host.exists(group_node)
    })
}

/// Gives the functions recorded for `device` back to their original drivers and removes the
/// record. Without a record there is nothing to do. Blocking.
pub(crate) fn restore(
    host: &HostFs,
    state_dir: &Path,
    device: &str,
    timeout: Duration,
) -> Result<bool, VfioError> {
    let rec = record_path(state_dir, device);
    // Never blocks on a FIFO or follows a link planted in the state directory.
    let text = match kubedev_core::safefs::read_regular(&rec, 1 << 20) {
        Ok(Some(t)) => t,
        Ok(None) => return Ok(false),
        Err(e) => {
            return Err(VfioError::State {
                path: rec,
                error: kubedev_core::echo::chain(&e),
            });
        }
    };
    let record: BindRecord = serde_json::from_slice(&text).map_err(|e| VfioError::State {
        path: rec.clone(),
        error: kubedev_core::echo::chain(&e),
    })?;
    for f in &record.functions {
        let a = PciAddress::parse(&f.address)
            .ok_or_else(|| VfioError::State {
                path: rec.clone(),
                error: format!("{:?} is not a PCI address", f.address),
            })?
            .to_string();
        if !host.exists(format!("{PCI_DEVICES}/{a}")) {
            tracing::warn!(address = %a, "recorded PCI function is gone; nothing to restore");
            continue;
        }
        let original = f.original_driver.as_deref().map(check_driver).transpose()?;
        let current = driver_of(host, &a)?;
        let wanted_override = match &f.original_override {
            Some(o) => check_driver(o)?.to_owned(),
            None => "\n".to_owned(),
        };
        host.write_attr(
            format!("{PCI_DEVICES}/{a}/driver_override"),
            &wanted_override,
        )?;
        if current.as_deref() == original {
            continue;
        }
        if let Some(c) = &current {
            let c = check_driver(c)?;
            host.write_attr(format!("/sys/bus/pci/drivers/{c}/unbind"), &a)?;
            wait_until(timeout, &format!("{a} unbound from {c}"), || {
                matches!(driver_of(host, &a), Ok(None))
            })?;
        }
        if let Some(o) = original {
            host.write_attr(format!("/sys/bus/pci/drivers/{o}/bind"), &a)?;
            wait_until(
                timeout,
                &format!("{a} bound back to {o}"),
                || matches!(driver_of(host, &a), Ok(Some(d)) if d == o),
            )?;
        }
        tracing::info!(address = %a, driver = ?original, "restored original driver");
    }
    kubedev_core::durable::remove(&rec).map_err(|e| VfioError::State {
        path: rec.clone(),
        error: kubedev_core::echo::chain(&e),
    })?;
    Ok(true)
}

fn write_record(path: &Path, record: &BindRecord) -> Result<(), VfioError> {
    let err = |e: String| VfioError::State {
        path: path.to_path_buf(),
        error: e,
    };
    if let Some(dir) = path.parent() {
        kubedev_core::safefs::create_private_dir_all(dir)
            .map_err(|e| err(kubedev_core::echo::chain(&e)))?;
    }
    let json = serde_json::to_vec_pretty(record).map_err(|e| err(kubedev_core::echo::chain(&e)))?;
    kubedev_core::durable::write(path, &json).map_err(|e| err(kubedev_core::echo::chain(&e)))
}
