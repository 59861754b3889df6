//! Message bytes of the Device Plugin API (v1beta1), plugin registration, the DRA plugin API
//! (v1, v1beta1) and DRA resource health (v1, v1alpha1), written out by hand from the
//! kubelet's API.

use std::collections::BTreeMap;

use prost::Message;

use super::{assert_wire, strings};
use crate::pb::deviceplugin::v1beta1 as dp;
use crate::pb::dra::v1 as dra_v1;
use crate::pb::dra::v1beta1 as dra_v1beta1;
use crate::pb::drahealth::v1 as health_v1;
use crate::pb::drahealth::v1alpha1 as health_v1alpha1;
use crate::pb::pluginregistration as reg;

// ---------------------------------------------------------------------------
// Device Plugin API v1beta1 messages
// ---------------------------------------------------------------------------

#[test]
fn register_request_bytes() {
    let msg = dp::RegisterRequest {
        version: "v1beta1".into(),
        endpoint: "kubedev.sock".into(),
        resource_name: "example.com/gpu".into(),
        options: Some(dp::DevicePluginOptions {
            pre_start_required: true,
            get_preferred_allocation_available: true,
        }),
    };
    let expected = [
        &[0x0a, 7][..], // 1: version, 7 bytes
        b"v1beta1",
        &[0x12, 12], // 2: endpoint, 12 bytes
        b"kubedev.sock",
        &[0x1a, 15], // 3: resource_name, 15 bytes
        b"example.com/gpu",
        &[0x22, 4], // 4: options, 4 bytes:
        &[0x08, 1], //   1: pre_start_required = true
        &[0x10, 1], //   2: get_preferred_allocation_available = true
    ]
    .concat();
    assert_wire(&msg, &expected);

    // Options left at their defaults still send an (empty) options message.
    let bare = dp::RegisterRequest {
        options: Some(dp::DevicePluginOptions::default()),
        ..Default::default()
    };
    assert_wire(&bare, &[0x22, 0]);
}

#[test]
fn list_and_watch_response_bytes() {
    let msg = dp::ListAndWatchResponse {
        devices: vec![
            dp::Device {
                id: "gpu-0".into(),
                health: "Healthy".into(),
                topology: Some(dp::TopologyInfo {
                    nodes: vec![dp::NumaNode { id: 0 }, dp::NumaNode { id: 1 }],
                }),
            },
            dp::Device {
                id: "gpu-1".into(),
                health: "Unhealthy".into(),
                topology: None,
            },
        ],
    };
    let expected = [
        &[0x0a, 24][..], // 1: devices[0], 24 bytes:
        &[0x0a, 5],      //   1: ID
        b"gpu-0",
        &[0x12, 7], //   2: health
        b"Healthy",
        &[0x1a, 6],          //   3: topology, 6 bytes:
        &[0x0a, 0],          //     1: nodes[0], empty: NUMA node 0 is the default
        &[0x0a, 2, 0x08, 1], //     1: nodes[1] { 1: ID = 1 }
        &[0x0a, 18],         // 1: devices[1], 18 bytes:
        &[0x0a, 5],          //   1: ID
        b"gpu-1",
        &[0x12, 9], //   2: health
        b"Unhealthy",
    ]
    .concat();
    assert_wire(&msg, &expected);
}

#[test]
fn preferred_allocation_and_pre_start_bytes() {
    let msg = dp::PreferredAllocationRequest {
        container_requests: vec![dp::ContainerPreferredAllocationRequest {
            available_device_i_ds: strings(&["a", "b"]),
            must_include_device_i_ds: strings(&["a"]),
            allocation_size: 2,
        }],
    };
    let expected = [
        &[0x0a, 11][..],  // 1: container_requests[0], 11 bytes:
        &[0x0a, 1, b'a'], //   1: available_deviceIDs[0]
        &[0x0a, 1, b'b'], //   1: available_deviceIDs[1]
        &[0x12, 1, b'a'], //   2: must_include_deviceIDs[0]
        &[0x18, 2],       //   3: allocation_size = 2
    ]
    .concat();
    assert_wire(&msg, &expected);

    let msg = dp::PreferredAllocationResponse {
        container_responses: vec![dp::ContainerPreferredAllocationResponse {
            device_i_ds: strings(&["b"]),
        }],
    };
    assert_wire(&msg, &[0x0a, 3, 0x0a, 1, b'b']);

    let msg = dp::PreStartContainerRequest {
        devices_ids: strings(&["d0"]),
    };
    assert_wire(&msg, &[0x0a, 2, b'd', b'0']);

    let msg = dp::AllocateRequest {
        container_requests: vec![dp::ContainerAllocateRequest {
            devices_ids: strings(&["d0"]),
        }],
    };
    assert_wire(&msg, &[0x0a, 4, 0x0a, 2, b'd', b'0']);
}

#[test]
fn allocate_response_bytes() {
    let msg = dp::AllocateResponse {
        container_responses: vec![dp::ContainerAllocateResponse {
            envs: BTreeMap::from([("A".into(), "1".into()), ("B".into(), "2".into())]),
            mounts: vec![dp::Mount {
                container_path: "/c".into(),
                host_path: "/h".into(),
                read_only: true,
            }],
            devices: vec![dp::DeviceSpec {
                container_path: "/dev/x".into(),
                host_path: "/dev/y".into(),
                permissions: "rw".into(),
            }],
            annotations: BTreeMap::from([("a".into(), "b".into())]),
            cdi_devices: vec![dp::CdiDevice {
                name: "v.com/c=d".into(),
            }],
        }],
    };
    let expected = [
        &[0x0a, 71][..], // 1: container_responses[0], 71 bytes:
        // 1: envs, one map entry each, in key order: { 1: key, 2: value }
        &[0x0a, 6, 0x0a, 1, b'A', 0x12, 1, b'1'],
        &[0x0a, 6, 0x0a, 1, b'B', 0x12, 1, b'2'],
        // 2: mounts[0], 10 bytes: container_path, host_path, read_only = true
        &[0x12, 10, 0x0a, 2],
        b"/c",
        &[0x12, 2],
        b"/h",
        &[0x18, 1],
        // 3: devices[0], 20 bytes: container_path, host_path, permissions
        &[0x1a, 20, 0x0a, 6],
        b"/dev/x",
        &[0x12, 6],
        b"/dev/y",
        &[0x1a, 2],
        b"rw",
        // 4: annotations, one map entry
        &[0x22, 6, 0x0a, 1, b'a', 0x12, 1, b'b'],
        // 5: cdi_devices[0], 11 bytes: { 1: name }
        &[0x2a, 11, 0x0a, 9],
        b"v.com/c=d",
    ]
    .concat();
    assert_wire(&msg, &expected);
}

// ---------------------------------------------------------------------------
// Plugin registration API
// ---------------------------------------------------------------------------

#[test]
fn plugin_registration_bytes() {
    let msg = reg::PluginInfo {
        r#type: "DRAPlugin".into(),
        name: "d.io".into(),
        endpoint: "/s".into(),
        supported_versions: strings(&["v1.DRAPlugin", "v1beta1.DRAPlugin"]),
    };
    let expected = [
        &[0x0a, 9][..], // 1: type
        b"DRAPlugin",
        &[0x12, 4], // 2: name
        b"d.io",
        &[0x1a, 2], // 3: endpoint
        b"/s",
        &[0x22, 12], // 4: supported_versions[0]
        b"v1.DRAPlugin",
        &[0x22, 17], // 4: supported_versions[1]
        b"v1beta1.DRAPlugin",
    ]
    .concat();
    assert_wire(&msg, &expected);

    let ok = reg::RegistrationStatus {
        plugin_registered: true,
        error: String::new(),
    };
    assert_wire(&ok, &[0x08, 1]);

    let refused = reg::RegistrationStatus {
        plugin_registered: false,
        error: "version not supported".into(),
    };
    assert_wire(
        &refused,
        &[&[0x12, 21][..], b"version not supported"].concat(),
    );
}

// ---------------------------------------------------------------------------
// DRA plugin API
// ---------------------------------------------------------------------------

#[test]
fn dra_v1_prepare_response_bytes() {
    let device = dra_v1::Device {
        request_names: strings(&["r"]),
        pool_name: "p".into(),
        device_name: "d".into(),
        cdi_device_ids: strings(&["v.com/c=d"]),
        share_id: Some("s".into()),
    };
    let msg = dra_v1::NodePrepareResourcesResponse {
        claims: BTreeMap::from([
            (
                "uid-1".into(),
                dra_v1::NodePrepareResourceResponse {
                    devices: vec![device],
                    error: String::new(),
                },
            ),
            (
                "uid-2".into(),
                dra_v1::NodePrepareResourceResponse {
                    devices: vec![],
                    error: "boom".into(),
                },
            ),
        ]),
    };
    let expected = [
        &[0x0a, 34][..], // 1: claims entry, 34 bytes:
        &[0x0a, 5],      //   1: key
        b"uid-1",
        &[0x12, 25],      //   2: value, 25 bytes:
        &[0x0a, 23],      //     1: devices[0], 23 bytes:
        &[0x0a, 1, b'r'], //       1: request_names[0]
        &[0x12, 1, b'p'], //       2: pool_name
        &[0x1a, 1, b'd'], //       3: device_name
        &[0x22, 9],       //       4: cdi_device_ids[0]
        b"v.com/c=d",
        &[0x2a, 1, b's'], //       5: share_id
        &[0x0a, 15],      // 1: claims entry, 15 bytes:
        &[0x0a, 5],       //   1: key
        b"uid-2",
        &[0x12, 6, 0x12, 4], //   2: value { 2: error }
        b"boom",
    ]
    .concat();
    assert_wire(&msg, &expected);
}

#[test]
fn dra_v1_share_id_has_presence() {
    let unshared = dra_v1::Device {
        pool_name: "p".into(),
        device_name: "d".into(),
        ..Default::default()
    };
    assert_wire(&unshared, &[0x12, 1, b'p', 0x1a, 1, b'd']);

    // An empty share ID is still sent, because the field is `optional`.
    let empty_share = dra_v1::Device {
        share_id: Some(String::new()),
        ..unshared.clone()
    };
    assert_wire(&empty_share, &[0x12, 1, b'p', 0x1a, 1, b'd', 0x2a, 0]);
}

#[test]
fn dra_v1beta1_ignores_the_v1_share_id() {
    // What a v1 driver sends for one shared device.
    let v1_bytes = [
        &[0x12, 1, b'p', 0x1a, 1, b'd', 0x22, 9][..],
        b"v.com/c=d",
        &[0x2a, 1, b's'],
    ]
    .concat();
    let decoded = dra_v1beta1::Device::decode(&v1_bytes[..]).unwrap();
    assert_eq!(
        decoded,
        dra_v1beta1::Device {
            request_names: vec![],
            pool_name: "p".into(),
            device_name: "d".into(),
            cdi_device_ids: strings(&["v.com/c=d"]),
        }
    );
}

#[test]
fn dra_claims_and_unprepare_bytes() {
    let claim_bytes = [&[0x0a, 2][..], b"ns", &[0x12, 1, b'u', 0x1a, 1, b'c']].concat();
    let request = dra_v1::NodePrepareResourcesRequest {
        claims: vec![dra_v1::Claim {
            namespace: "ns".into(),
            uid: "u".into(),
            name: "c".into(),
        }],
    };
    assert_wire(&request, &[&[0x0a, 10][..], &claim_bytes].concat());
    let request = dra_v1beta1::NodeUnprepareResourcesRequest {
        claims: vec![dra_v1beta1::Claim {
            namespace: "ns".into(),
            uid: "u".into(),
            name: "c".into(),
        }],
    };
    assert_wire(&request, &[&[0x0a, 10][..], &claim_bytes].concat());

    let response = dra_v1::NodeUnprepareResourcesResponse {
        claims: BTreeMap::from([("u".into(), dra_v1::NodeUnprepareResourceResponse::default())]),
    };
    // We leave an empty value out of the map entry ...
    assert_eq!(response.encode_to_vec(), [0x0a, 3, 0x0a, 1, b'u']);
    // ... while the kubelet's Go encoder writes it as an empty message; both
    // mean the same entry.
    let from_go = [0x0a, 5, 0x0a, 1, b'u', 0x12, 0];
    assert_eq!(
        dra_v1::NodeUnprepareResourcesResponse::decode(&from_go[..]).unwrap(),
        response
    );
}

// ---------------------------------------------------------------------------
// DRA resource health API
// ---------------------------------------------------------------------------

#[test]
fn health_v1_response_bytes() {
    let msg = health_v1::NodeWatchResourcesResponse {
        devices: vec![health_v1::DeviceHealth {
            device: Some(health_v1::DeviceIdentifier {
                pool_name: "p".into(),
                device_name: "d".into(),
            }),
            health: health_v1::HealthStatus::Unhealthy as i32,
            last_updated_time: 300,
            health_check_timeout_seconds: 30,
            message: "x".into(),
        }],
    };
    let expected = [
        0x0a, 18, // 1: devices[0], 18 bytes:
        0x0a, 6, 0x0a, 1, b'p', 0x12, 1, b'd', // 1: device { 1: pool_name, 2: device_name }
        0x10, 2, // 2: health = UNHEALTHY
        0x18, 0xac, 0x02, // 3: last_updated_time = 300 (varint)
        0x20, 30, // 4: health_check_timeout_seconds = 30
        0x2a, 1, b'x', // 5: message
    ];
    assert_wire(&msg, &expected);

    // v1alpha1 is the same message, field for field.
    let alpha = health_v1alpha1::NodeWatchResourcesResponse::decode(&expected[..]).unwrap();
    let [device] = alpha.devices.as_slice() else {
        panic!("expected one device, got {alpha:?}");
    };
    assert_eq!(device.health(), health_v1alpha1::HealthStatus::Unhealthy);
    assert_eq!(device.last_updated_time, 300);
    assert_eq!(device.health_check_timeout_seconds, 30);
    assert_eq!(device.message, "x");
    let id = device.device.as_ref().unwrap();
    assert_eq!((id.pool_name.as_str(), id.device_name.as_str()), ("p", "d"));
    assert_eq!(alpha.encode_to_vec(), expected);

    // The enum values are the kubelet's.
    assert_eq!(health_v1::HealthStatus::Unknown as i32, 0);
    assert_eq!(health_v1::HealthStatus::Healthy as i32, 1);
    assert_eq!(health_v1::HealthStatus::Unhealthy as i32, 2);
}
