//! kubedev's kubelet-facing servers with fixed answers, for clients written with other gRPC
//! stacks (`cargo xtask interop` drives Python's grpcio, and grpc-go with the kubelet's own stubs
//! from `k8s.io/kubelet`, against it).
//!
//! `interop_target --dir D --driver NAME --resource NAME [--pod-uid UID]` serves, under `D`
//! laid out like `/var/lib/kubelet`: the DRA driver (registration, DRA v1 and v1beta1, health v1
//! and v1alpha1) and a device plugin for the resource, which registers with whatever serves
//! `D/device-plugins/kubelet.sock`. It prints one JSON line with the socket paths, runs until
//! its standard input closes, then prints one JSON line of what the clients did. Logs, with
//! each `:authority` clients sent, go to standard error as JSON.
#![allow(clippy::unwrap_used)]

use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use async_trait::async_trait;
use kubedev_core::{
    ClaimRef, ContainerEdits, DeviceNode, DriverName, ExtendedResourceName, Health, PrepareError,
};
use kubedev_kubelet_grpc::device_plugin::{
    Allocation, DevicePlugin, DevicePluginConfig, DevicePluginHandler, PluginDevice,
    PreferenceRequest,
};
use kubedev_kubelet_grpc::dra::{
    ClaimError, DeviceHealthReport, DraHandler, DraPlugin, DraPluginConfig, PreparedClaimDevice,
};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

#[derive(Default)]
struct Dra {
    driver: String,
    prepared: Mutex<BTreeMap<String, String>>,
    unprepared: Mutex<Vec<String>>,
}

#[async_trait]
impl DraHandler for Dra {
    async fn prepare(&self, claim: &ClaimRef) -> Result<Vec<PreparedClaimDevice>, ClaimError> {
        if claim.name.as_str().starts_with("unallocated") {
            return Err(ClaimError::permanent(
                "not_allocated",
                format!("claim {} is not allocated to this node", claim.name),
            ));
        }
        self.prepared
            .lock()
            .insert(claim.uid.to_string(), claim.name.to_string());
        Ok(vec![PreparedClaimDevice {
            request_names: vec!["gpu".into()],
            pool: "node-a".into(),
            device: "gpu-0".into(),
            cdi_device_ids: vec![format!("k8s.{}/claim={}-gpu-0", self.driver, claim.uid)],
            share_id: None,
        }])
    }

    async fn unprepare(&self, claim: &ClaimRef) -> Result<(), ClaimError> {
        self.unprepared.lock().push(claim.uid.to_string());
        Ok(())
    }
}

#[derive(Default)]
struct Plugin {
    allocations: AtomicUsize,
    pre_starts: AtomicUsize,
    preferred: AtomicUsize,
}

#[async_trait]
impl DevicePluginHandler for Plugin {
    async fn allocate(&self, devices: &[PluginDevice]) -> Result<Allocation, PrepareError> {
        self.allocations.fetch_add(1, Ordering::SeqCst);
        let mut edits = ContainerEdits::default();
        let ids: Vec<_> = devices.iter().map(|d| d.id.as_str()).collect();
        edits.env.insert("KUBEDEV_DEVICES".into(), ids.join(","));
        for d in devices {
            edits
                .device_nodes
                .push(DeviceNode::new(format!("/dev/{}", d.id), "rw"));
        }
        Ok(Allocation {
            edits,
            cdi_devices: Vec::new(),
        })
    }

    async fn pre_start(&self, _devices: &[PluginDevice]) -> Result<(), PrepareError> {
        self.pre_starts.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    fn needs_pre_start(&self) -> bool {
        true
    }

    fn preferred_allocation(&self, _request: &PreferenceRequest<'_>) -> Option<Vec<String>> {
        self.preferred.fetch_add(1, Ordering::SeqCst);
        None
    }
}

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .json()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "kubedev_kubelet_grpc=debug".into()),
        )
        .init();
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: interop_target --dir D --driver NAME --resource NAME [--pod-uid UID]";
    let dir = PathBuf::from(arg(&args, "--dir").ok_or(usage)?);
    let driver = DriverName::new(arg(&args, "--driver").ok_or(usage)?)?;
    let resource = ExtendedResourceName::new(arg(&args, "--resource").ok_or(usage)?)?;
    let pod_uid = arg(&args, "--pod-uid").unwrap_or_default();
    let cancel = CancellationToken::new();

    let dra = Arc::new(Dra {
        driver: driver.to_string(),
        ..Dra::default()
    });
    let (_health_tx, health) = watch::channel(vec![DeviceHealthReport {
        pool: "node-a".into(),
        device: "gpu-0".into(),
        health: Health::healthy(),
        last_updated: 1_700_000_000,
        timeout_seconds: 3,
    }]);
    let config = DraPluginConfig::new(driver.clone())
        .plugin_dir(dir.join("plugins").join(driver.as_str()))
        .registry_dir(dir.join("plugins_registry"))
        .pod_uid(pod_uid)
        .health(true);
    let dra_handle = DraPlugin::start(config, dra.clone(), health, cancel.clone())?;

    let plugin_dir = dir.join("device-plugins");
    std::fs::create_dir_all(&plugin_dir)?;
    let plugin = Arc::new(Plugin::default());
    let device = |name: &str| {
        kubedev_core::DeviceRef::new(
            kubedev_core::PoolName::new("node-a").unwrap(),
            kubedev_core::DeviceName::new(name).unwrap(),
        )
    };
    let (_devices_tx, devices) = watch::channel(vec![
        PluginDevice::new("dev-0", device("dev-0")).with_numa_node(Some(0)),
        PluginDevice::new("dev-1", device("dev-1")).with_numa_node(Some(1)),
    ]);
    let dp_config = DevicePluginConfig::new(resource.clone())
        .plugin_dir(&plugin_dir)
        .register_backoff(vec![std::time::Duration::from_millis(200)]);
    let dp_handle = DevicePlugin::start(dp_config, plugin.clone(), devices, cancel.clone())?;

    println!(
        "{}",
        serde_json::json!({
            "driver": driver.as_str(),
            "resource": resource.as_str(),
            "registration_socket": dra_handle.registration_socket(),
            "dra_socket": dra_handle.dra_socket(),
            "device_plugin_dir": plugin_dir,
            "device_plugin_socket": dp_handle.socket_path(),
        })
    );

    // Until the driver of this process closes standard input.
    tokio::task::spawn_blocking(|| {
        let mut sink = Vec::new();
        let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut sink);
    })
    .await?;

    let dra_status = dra_handle.status();
    let dp_status = dp_handle.status();
    println!(
        "{}",
        serde_json::json!({
            "dra_registrations": dra_status.registrations,
            "dra_last_error": dra_status.last_error,
            "prepared": *dra.prepared.lock(),
            "unprepared": *dra.unprepared.lock(),
            "device_plugin_registrations": dp_status.registrations,
            "allocations": plugin.allocations.load(Ordering::SeqCst),
            "pre_starts": plugin.pre_starts.load(Ordering::SeqCst),
            "preferred": plugin.preferred.load(Ordering::SeqCst),
        })
    );
    dp_handle.stop().await;
    dra_handle.stop().await;
    Ok(())
}
