//! Tests of reading and checking GPU sharing configurations.

use super::tools::device_key;
use super::*;
use kubedev_core::{ConfigSource, DeviceConfig, DeviceName, DeviceRef, PoolName};
use serde_json::json;

fn device(configs: Vec<serde_json::Value>) -> AllocatedDevice {
    AllocatedDevice::new(DeviceRef::new(
        PoolName::new("node-a-nvidia").unwrap(),
        DeviceName::new("gpu-0").unwrap(),
    ))
    .with_config(
        configs
            .into_iter()
            .enumerate()
            .map(|(i, v)| DeviceConfig::new(ConfigSource::Claim, i, v))
            .collect(),
    )
}

fn gpu_config(sharing: serde_json::Value) -> serde_json::Value {
    json!({"apiVersion": CONFIG_API_VERSION, "kind": "GpuConfig", "sharing": sharing})
}

#[test]
fn configurations_are_read_and_checked_field_by_field() {
    let s = device_sharing(&device(vec![
        gpu_config(json!({"strategy": "TimeSlicing"})),
        gpu_config(json!({"strategy": "MPS", "mpsConfig": {
            "defaultActiveThreadPercentage": 40, "defaultPinnedDeviceMemoryLimit": "2Gi"}})),
    ]))
    .unwrap()
    .unwrap();
    assert_eq!(s.strategy, Strategy::Mps, "the last entry applies");
    let m = s.mps_config.unwrap();
    assert_eq!(m.default_active_thread_percentage, Some(40));
    assert_eq!(
        mib(m.default_pinned_device_memory_limit.as_ref().unwrap()).unwrap(),
        "2048M"
    );

    let err = |v| device_sharing(&device(vec![v])).unwrap_err().to_string();
    assert_eq!(
        err(gpu_config(
            json!({"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 150}})
        )),
        "config[0] (from the claim): sharing.mpsConfig.defaultActiveThreadPercentage: must be from 0 to 100, got 150"
    );
    assert!(
        err(gpu_config(json!({"strategy": "Sometimes"}))).starts_with(
            "config[0] (from the claim): sharing.strategy: unknown variant `Sometimes`"
        ),
    );
    assert!(
        err(gpu_config(
            json!({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Forever"}})
        ))
        .contains("sharing.timeSlicingConfig.interval: unknown variant `Forever`"),
    );
    assert_eq!(
        err(gpu_config(
            json!({"strategy": "TimeSlicing", "mpsConfig": {}})
        )),
        "config[0] (from the claim): sharing.mpsConfig: not allowed with strategy TimeSlicing"
    );
    assert!(
        err(gpu_config(
            json!({"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "1Ki"}})
        ))
        .ends_with("must be at least 1Mi, got 1Ki")
    );
    assert!(err(json!({"apiVersion": "v1", "kind": "NicConfig"})).contains("kind: \"NicConfig\""));
    assert!(
        err(json!({"apiVersion": "other/v1", "kind": "GpuConfig"}))
            .contains("apiVersion: \"other/v1\" is not supported")
    );
    assert!(
        err(gpu_config(json!({"strategy": "MPS", "mspConfig": {}})))
            .contains("unknown field `mspConfig`")
    );
}

#[test]
fn per_device_keys_name_a_device_of_the_claim() {
    let uuids = vec!["GPU-a".to_string(), "GPU-b".to_string()];
    assert_eq!(device_key("GPU-b", &uuids), Ok(1));
    assert_eq!(device_key("0", &uuids), Ok(0));
    assert!(
        device_key("2", &uuids)
            .unwrap_err()
            .contains("out of range")
    );
    assert!(device_key("GPU-z", &uuids).unwrap_err().contains("neither"));
}
