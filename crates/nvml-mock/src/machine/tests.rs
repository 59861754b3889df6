//! Tests of machine files: the text formats of their fields, JSON and YAML, and validation
//! messages.
#![allow(clippy::unwrap_used)]

use super::{Machine, parse_bus_id, parse_cpu_list};

#[test]
fn bus_ids_parse_in_both_domain_widths() {
    assert_eq!(parse_bus_id("00000000:07:00.0"), Some((0, 7, 0, 0)));
    assert_eq!(parse_bus_id("0000:BD:1f.7"), Some((0, 0xbd, 0x1f, 7)));
    assert_eq!(parse_bus_id("07:00.0"), Some((0, 7, 0, 0)));
    assert_eq!(parse_bus_id("0000:07:00"), None);
    assert_eq!(parse_bus_id("0000:107:00.0"), None);
}

#[test]
fn cpu_lists_parse() {
    assert_eq!(parse_cpu_list("0-2,5"), Some(vec![0, 1, 2, 5]));
    assert_eq!(parse_cpu_list("3-1"), None);
}

#[test]
fn json_machine_files_load_like_yaml() {
    let yaml = Machine::load(&crate::machine_path("dgx-a100")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dgx.json");
    std::fs::write(&path, serde_json::to_vec(&yaml).unwrap()).unwrap();
    assert_eq!(Machine::load(&path).unwrap(), yaml);
}

#[test]
fn invalid_machines_name_the_field() {
    let text = "driverVersion: '1'\ncudaDriverVersion: 12000\ngpus:\n  - uuid: nope\n    minor: 0\n    name: x\n    brand: nvidia\n    architecture: ampere\n    computeCapability: '8.0'\n    memoryMiB: 1\n    pci: { busId: '0000:01:00.0', deviceId: 1 }\n";
    let err = Machine::from_yaml(text).unwrap_err().to_string();
    assert!(err.contains("gpus[0].uuid"), "{err}");
    let text = text.replace("nope", "GPU-1").replace("8.0", "eight");
    let err = Machine::from_yaml(&text).unwrap_err().to_string();
    assert!(err.contains("computeCapability"), "{err}");
}
