//! `Allocate` and `GetPreferredAllocation` as arbitrary protobuf bytes from the kubelet's side of
//! the socket, decoded and handed to the device-plugin service of four devices (one unhealthy)
//! whose policy answers nonsense: never panics; an allocation answers every container; a
//! preferred allocation only names offered devices, once each, including those it must.
#![no_main]

use std::collections::BTreeSet;
use std::sync::Arc;

use async_trait::async_trait;
use kubedev_core::{DeviceName, DeviceRef, Health, PoolName, PrepareError};
use kubedev_kubelet_grpc::device_plugin::{
    Allocation, DevicePluginHandler, PluginDevice, PreferenceRequest,
};
use kubedev_kubelet_grpc::pb::deviceplugin::v1beta1 as api;
use libfuzzer_sys::fuzz_target;
use prost::Message;
use tonic::Request;

struct Handler;

#[async_trait]
impl DevicePluginHandler for Handler {
    async fn allocate(&self, devices: &[PluginDevice]) -> Result<Allocation, PrepareError> {
        let mut a = Allocation::default();
        for d in devices {
            a.edits
                .env
                .insert(format!("DEV_{}", d.id.len()), d.id.clone());
        }
        Ok(a)
    }

    /// Breaks the rules on purpose: unknown IDs, repeats, the wrong size.
    fn preferred_allocation(&self, request: &PreferenceRequest<'_>) -> Option<Vec<String>> {
        let mut answer: Vec<String> = request.available.iter().rev().cloned().collect();
        answer.push("no-such-device".into());
        if let Some(first) = request.available.first() {
            answer.push(first.clone());
        }
        answer.truncate(request.size.saturating_add(1));
        Some(answer)
    }
}

fn devices() -> Vec<PluginDevice> {
    (0..4)
        .map(|i| {
            let device = DeviceRef::new(
                PoolName::new("node-a").expect("pool"),
                DeviceName::new(format!("gpu-{i}")).expect("device"),
            );
            let d = PluginDevice::new(format!("gpu-{i}"), device).with_numa_node(Some(i / 2));
            if i == 3 {
                d.with_health(Health::unhealthy("fuzz"))
            } else {
                d
            }
        })
        .collect()
}

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&selector, bytes)) = data.split_first() else {
        return;
    };
    let service = kubedev_kubelet_grpc::fuzzing::device_plugin_service(
        "example.com/gpu",
        devices(),
        Arc::new(Handler),
    );
    runtime().block_on(async {
        if selector % 2 == 0 {
            let Ok(req) = api::AllocateRequest::decode(bytes) else {
                return;
            };
            let n = req.container_requests.len();
            if let Ok(resp) =
                api::device_plugin_server::DevicePlugin::allocate(&service, Request::new(req)).await
            {
                assert_eq!(resp.into_inner().container_responses.len(), n);
            }
        } else {
            let Ok(req) = api::PreferredAllocationRequest::decode(bytes) else {
                return;
            };
            let asked = req.container_requests.clone();
            if let Ok(resp) = api::device_plugin_server::DevicePlugin::get_preferred_allocation(
                &service,
                Request::new(req),
            )
            .await
            {
                let resp = resp.into_inner();
                assert_eq!(resp.container_responses.len(), asked.len());
                for (r, a) in resp.container_responses.iter().zip(&asked) {
                    let offered: BTreeSet<&String> = a.available_device_i_ds.iter().collect();
                    let chosen: BTreeSet<&String> = r.device_i_ds.iter().collect();
                    assert_eq!(chosen.len(), r.device_i_ds.len(), "a repeated ID: {r:?}");
                    assert!(chosen.is_subset(&offered), "{r:?} not within {a:?}");
                    for must in &a.must_include_device_i_ds {
                        assert!(chosen.contains(must), "{must} missing from {r:?}");
                    }
                }
            }
        }
    });
});
