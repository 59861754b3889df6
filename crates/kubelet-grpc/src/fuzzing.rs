//! The kubelet-facing services without a socket, for kubedev's fuzz targets: a decoded request
//! goes through the same handler code as one from the kubelet. Not part of the stable API.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::device_plugin::{DevicePluginHandler, PluginDevice};
use crate::dra::DraHandler;

/// The DRA service of `driver` (both `v1` and `v1beta1` traits) answering with `handler`.
pub fn dra_service(driver: &str, handler: Arc<dyn DraHandler>) -> crate::dra::service::Service {
    crate::dra::service::Service {
        driver: driver.to_string(),
        handler,
    }
}

/// The device-plugin service of `resource` offering `devices`, answering with `handler`.
pub fn device_plugin_service(
    resource: &str,
    devices: Vec<PluginDevice>,
    handler: Arc<dyn DevicePluginHandler>,
) -> crate::device_plugin::service::Service {
    // A receiver keeps the last value after its sender is gone.
    let (_, devices) = tokio::sync::watch::channel(devices);
    crate::device_plugin::service::Service {
        resource: resource.to_string(),
        devices,
        handler,
        pre_start_timeout: Duration::from_secs(1),
        shutdown: CancellationToken::new(),
    }
}
