//! Xid events and lost GPUs through the control file.

use std::time::{Duration, Instant};

use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError;

use crate::{control, load, load_file};

#[test]
fn xid_from_the_control_file_reaches_registered_sets() {
    let l = load("dgx-a100");
    let nvml = &l.nvml;
    let d3 = nvml.device_by_index(3).unwrap();
    assert!(
        d3.supported_event_types()
            .unwrap()
            .contains(EventTypes::CRITICAL_XID_ERROR)
    );
    let set = d3
        .register_events(
            EventTypes::CRITICAL_XID_ERROR,
            nvml.create_event_set().unwrap(),
        )
        .unwrap();
    // Nothing yet: the wait honours its timeout.
    let start = Instant::now();
    assert!(matches!(set.wait(100), Err(NvmlError::Timeout)));
    assert!(start.elapsed() >= Duration::from_millis(100));
    // An event for an unregistered GPU stays queued; the one for GPU 3 is delivered.
    control(
        &l.control,
        &[r#"{"xid": 31, "gpu": 5}"#, r#"{"xid": 79, "gpu": 3}"#],
    );
    let ev = set.wait(1000).unwrap();
    assert_eq!(ev.device.index().unwrap(), 3);
    assert!(ev.event_type.contains(EventTypes::CRITICAL_XID_ERROR));
    assert_eq!(ev.event_data, Some(XidError::Value(79)));
    assert!(matches!(set.wait(50), Err(NvmlError::Timeout)));
    // Registering GPU 5 later delivers its queued Xid.
    let d5 = nvml.device_by_index(5).unwrap();
    let set = d5
        .register_events(EventTypes::CRITICAL_XID_ERROR, set)
        .unwrap();
    let ev = set.wait(1000).unwrap();
    assert_eq!(
        (ev.device.index().unwrap(), ev.event_data),
        (5, Some(XidError::Value(31)))
    );
}

#[test]
fn event_written_while_waiting_arrives_before_the_timeout() {
    let l = load("workstation");
    let d0 = l.nvml.device_by_index(0).unwrap();
    let set = d0
        .register_events(
            EventTypes::CRITICAL_XID_ERROR,
            l.nvml.create_event_set().unwrap(),
        )
        .unwrap();
    let path = l.control.clone();
    let writer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        control(&path, &[r#"{"xid": 48, "gpu": 0}"#]);
    });
    let start = Instant::now();
    let ev = set.wait(10_000).unwrap();
    assert!(start.elapsed() < Duration::from_secs(5));
    assert_eq!(ev.event_data, Some(XidError::Value(48)));
    writer.join().unwrap();
}

#[test]
fn machine_file_events_come_first() {
    let dir = tempfile::tempdir().unwrap();
    let machine = dir.path().join("m.yaml");
    let mut text = std::fs::read_to_string(nvml_mock::machine_path("workstation")).unwrap();
    text.push_str("events:\n  - { xid: 13, gpu: 1 }\n  - { xid: 94, gpu: 1, gi: 3, ci: 0 }\n");
    std::fs::write(&machine, text).unwrap();
    let l = load_file(&machine);
    control(&l.control, &[r#"{"xid": 79, "gpu": 1}"#]);
    let d1 = l.nvml.device_by_index(1).unwrap();
    // The GeForce card has no ECC events.
    assert!(
        !d1.supported_event_types()
            .unwrap()
            .contains(EventTypes::SINGLE_BIT_ECC_ERROR)
    );
    assert!(
        d1.register_events(
            EventTypes::SINGLE_BIT_ECC_ERROR,
            l.nvml.create_event_set().unwrap()
        )
        .is_err()
    );
    let set = d1
        .register_events(
            EventTypes::CRITICAL_XID_ERROR,
            l.nvml.create_event_set().unwrap(),
        )
        .unwrap();
    let xids: Vec<_> = (0..3).map(|_| set.wait(1000).unwrap().event_data).collect();
    assert_eq!(
        xids,
        vec![
            Some(XidError::Value(13)),
            Some(XidError::Value(94)),
            Some(XidError::Value(79))
        ]
    );
}

#[test]
fn lost_and_restored_gpu() {
    let l = load("dgx-a100");
    let nvml = &l.nvml;
    let d2 = nvml.device_by_index(2).unwrap();
    let set = d2
        .register_events(
            EventTypes::CRITICAL_XID_ERROR,
            nvml.create_event_set().unwrap(),
        )
        .unwrap();
    control(&l.control, &[r#"{"lost": 2}"#]);
    assert!(matches!(d2.uuid(), Err(NvmlError::GpuLost)));
    assert!(matches!(d2.memory_info(), Err(NvmlError::GpuLost)));
    assert_eq!(d2.index().unwrap(), 2);
    assert_eq!(nvml.device_count().unwrap(), 8);
    assert!(nvml.device_by_index(3).unwrap().uuid().is_ok());
    // The event set reports the loss once, then waits again.
    assert!(matches!(set.wait(1000), Err(NvmlError::GpuLost)));
    assert!(matches!(set.wait(20), Err(NvmlError::Timeout)));
    control(
        &l.control,
        &[r#"{"restore": 2}"#, "not json", r#"{"lost": 99}"#],
    );
    assert_eq!(
        d2.uuid().unwrap(),
        "GPU-1e5a7c93-2d4b-4f68-83a1-5c7e9b0d1f23"
    );
}

#[test]
fn gpu_lost_from_the_machine_file() {
    let dir = tempfile::tempdir().unwrap();
    let machine = dir.path().join("m.yaml");
    let text = std::fs::read_to_string(nvml_mock::machine_path("workstation"))
        .unwrap()
        .replace(
            "    supportedEventTypes: 28\n",
            "    supportedEventTypes: 28\n    lost: true\n",
        );
    std::fs::write(&machine, text).unwrap();
    let l = load_file(&machine);
    let d1 = l.nvml.device_by_index(1).unwrap();
    assert!(matches!(d1.name(), Err(NvmlError::GpuLost)));
    assert!(
        d1.register_events(
            EventTypes::CRITICAL_XID_ERROR,
            l.nvml.create_event_set().unwrap()
        )
        .is_err()
    );
    control(&l.control, &[r#"{"restore": 1}"#]);
    assert_eq!(d1.name().unwrap(), "NVIDIA GeForce RTX 4090");
}
