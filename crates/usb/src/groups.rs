//! Forming resource instances from USB devices, and the attributes they are published with.
//!
//! # How groups are formed
//!
//! Devices are sorted by bus number, then by port chain (numerically: `1-2` before `1-10`).
//! Resources are served in configuration order. For each resource, an instance is formed by
//! taking, for each selector in order, the first device in that order that matches it and is
//! still free; when every selector found a device, those devices form one instance and leave the
//! pool, and the next instance is tried. When a selector finds no free device the resource is
//! done. So two YubiKeys give two instances of `["1050:0407"]`, one of
//! `["1050:0407", "1050:0407"]`, and none of `["1050:0407", "0403:6001"]` without an FTDI
//! adapter. The same devices in the same ports always form the same groups.
//!
//! An instance is named `<prefix>-<port>`: the resource's device prefix
//! ([`UsbResource::device_prefix`](crate::config::UsbResource::device_prefix)) and the port path of its
//! first device (`yubikey-1-1` for a YubiKey in port `1-1`), so a name survives re-plugging into
//! the same port even though the device number changes.

use kubedev_core::{AttributeValue, Device, DeviceName, QualifiedName};

use crate::config::UsbResource;
use crate::discover::UsbDevice;

/// The attribute domain of USB devices.
pub const ATTRIBUTE_DOMAIN: &str = "usb.kubedev.io";

/// One resource instance: the devices one allocation gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Instance {
    /// Index of the resource in the configuration.
    pub(crate) resource: usize,
    /// The device name in the pool.
    pub(crate) name: DeviceName,
    /// The member devices, in selector order.
    pub(crate) members: Vec<UsbDevice>,
}

/// Forms the instances of every resource from `devices` (sorted as [`UsbDevice`]'s `Ord`).
pub(crate) fn form_instances(resources: &[UsbResource], devices: &[UsbDevice]) -> Vec<Instance> {
    let mut taken = vec![false; devices.len()];
    let mut out = Vec::new();
    for (ri, resource) in resources.iter().enumerate() {
        if resource.selectors.is_empty() {
            continue;
        }
        let prefix = resource.device_prefix();
        loop {
            let mut picked: Vec<usize> = Vec::with_capacity(resource.selectors.len());
            for sel in &resource.selectors {
                let found = devices.iter().enumerate().position(|(i, d)| {
                    !taken[i] && !picked.contains(&i) && sel.matches(d.vendor, d.product)
                });
                match found {
                    Some(i) => picked.push(i),
                    None => break,
                }
            }
            if picked.len() < resource.selectors.len() {
                break;
            }
            for &i in &picked {
                taken[i] = true;
            }
            let members: Vec<UsbDevice> = picked.iter().map(|&i| devices[i].clone()).collect();
            let first = members[0].port_label();
            match DeviceName::new(format!("{prefix}-{first}")) {
                Ok(name) => out.push(Instance {
                    resource: ri,
                    name,
                    members,
                }),
                Err(error) => {
                    tracing::warn!(resource = %resource.name, %error, "skipping USB instance");
                }
            }
        }
    }
    out
}

fn attr_name(id: &str) -> QualifiedName {
    QualifiedName::new(format!("{ATTRIBUTE_DOMAIN}/{id}"))
        .unwrap_or_else(|e| unreachable!("attribute names are constants: {e}"))
}

/// Joins the members' values with ','; `None` when no member has a value, when a value contains
/// ',' (the list would be ambiguous) or when the result exceeds the attribute length limit.
fn joined(values: impl Iterator<Item = Option<String>>) -> Option<String> {
    let values: Vec<Option<String>> = values.collect();
    if values.iter().all(Option::is_none) {
        return None;
    }
    if values.iter().flatten().any(|v| v.contains(',')) {
        return None;
    }
    let s = values
        .into_iter()
        .map(Option::unwrap_or_default)
        .collect::<Vec<_>>()
        .join(",");
    (s.len() <= AttributeValue::MAX_LENGTH).then_some(s)
}

/// The published device of an instance, with its attributes (see the crate docs for the table).
pub(crate) fn device_of(instance: &Instance, resource: &UsbResource) -> Device {
    let mut dev = Device::new(instance.name.clone());
    let m = &instance.members;
    let mut put = |id: &str, value: Option<String>| {
        if let Some(v) = value {
            match AttributeValue::string(v) {
                Ok(v) => {
                    dev.attributes.insert(attr_name(id), v);
                }
                Err(error) => {
                    tracing::debug!(device = %instance.name, id, %error, "attribute left out")
                }
            }
        }
    };
    put("resource", Some(resource.name.to_string()));
    put(
        "vendorId",
        joined(m.iter().map(|d| Some(format!("{:04x}", d.vendor)))),
    );
    put(
        "productId",
        joined(m.iter().map(|d| Some(format!("{:04x}", d.product)))),
    );
    put(
        "bcdDevice",
        joined(m.iter().map(|d| Some(format!("{:04x}", d.bcd_device)))),
    );
    put("busDev", joined(m.iter().map(|d| Some(d.bus_dev()))));
    put(
        "portPath",
        joined(m.iter().map(|d| Some(d.sysfs_name.clone()))),
    );
    put("serial", joined(m.iter().map(|d| d.serial.clone())));
    put(
        "manufacturer",
        joined(m.iter().map(|d| d.manufacturer.clone())),
    );
    put("product", joined(m.iter().map(|d| d.product_name.clone())));
    let count = i64::try_from(m.len()).unwrap_or(i64::MAX);
    dev.attributes
        .insert(attr_name("deviceCount"), AttributeValue::Int(count));
    dev.attributes.insert(
        attr_name("busnum"),
        AttributeValue::Int(i64::from(m[0].busnum)),
    );
    // Placement, where every member agrees: the NUMA node (published as the standard
    // `resource.kubernetes.io/numaNode`) and the standard PCIe root.
    dev.numa_node = agreed(m.iter().map(|d| d.numa_node));
    if let Some(root) = agreed(m.iter().map(|d| d.pcie_root.clone()))
        && let Ok(v) = AttributeValue::string(root)
        && let Ok(name) = kubedev_core::QualifiedName::new(PCIE_ROOT_ATTRIBUTE)
    {
        dev.attributes.insert(name, v);
    }
    dev
}

/// The value every member has; `None` when one has none or two differ.
fn agreed<T: PartialEq>(mut values: impl Iterator<Item = Option<T>>) -> Option<T> {
    let first = values.next()??;
    values.all(|v| v.as_ref() == Some(&first)).then_some(first)
}

/// The standard attribute naming the PCIe root complex a device hangs off.
const PCIE_ROOT_ATTRIBUTE: &str = "resource.kubernetes.io/pcieRoot";
