//! `kubedev who-uses`: which pod and container hold each device, in both kubelet APIs, from the
//! kubelet's pod resources API.

use kubedev_kubelet_grpc::pod_resources::{DeviceUse, Holding};

use crate::config::Config;

/// Keeps the rows that belong to this daemon: its device-plugin resources and its DRA driver
/// (every row when `config` is `None`), and, when `devices` is not empty, only those devices.
pub(crate) fn filter(
    rows: Vec<DeviceUse>,
    config: Option<&Config>,
    devices: &[String],
) -> Vec<DeviceUse> {
    rows.into_iter()
        .filter(|r| match (&r.holding, config) {
            (_, None) => true,
            (Holding::DevicePlugin { resource, .. }, Some(c)) => c
                .device_plugin
                .resources
                .iter()
                .any(|res| &res.name == resource),
            (Holding::Dra { driver, .. }, Some(c)) => {
                c.dra.driver_name.as_deref() == Some(driver.as_str())
            }
        })
        .filter(|r| {
            devices.is_empty()
                || devices.iter().any(|d| match &r.holding {
                    Holding::DevicePlugin { device, .. } => device == d,
                    Holding::Dra { pool, device, .. } => {
                        device == d || format!("{pool}/{device}") == *d
                    }
                })
        })
        .collect()
}

/// A table with one row per device held; a plain sentence when nothing is held.
pub(crate) fn table(rows: &[DeviceUse]) -> String {
    if rows.is_empty() {
        return "No pod holds any of these devices.\n".to_string();
    }
    let mut cells = vec![[
        "NAMESPACE".to_string(),
        "POD".to_string(),
        "CONTAINER".to_string(),
        "API".to_string(),
        "RESOURCE / CLAIM".to_string(),
        "DEVICE".to_string(),
    ]];
    for r in rows {
        let (api, via, device) = match &r.holding {
            Holding::DevicePlugin { resource, device } => {
                ("device-plugin", resource.clone(), device.clone())
            }
            Holding::Dra {
                claim_namespace,
                claim_name,
                driver,
                pool,
                device,
                share_id,
            } => (
                "dra",
                format!("{claim_namespace}/{claim_name} ({driver})"),
                match share_id {
                    Some(s) => format!("{pool}/{device} share {s}"),
                    None => format!("{pool}/{device}"),
                },
            ),
        };
        cells.push([
            r.namespace.clone(),
            r.pod.clone(),
            r.container.clone(),
            api.to_string(),
            via,
            device,
        ]);
    }
    crate::table::columns(&cells)
}
