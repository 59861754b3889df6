//! Initialisation: machine selection, failures, reference counting.

use std::io::Write;

use nvml_wrapper::Nvml;
use nvml_wrapper::error::NvmlError;

#[test]
fn no_machine_means_driver_not_loaded() {
    // A copy without a sidecar, in a process where NVML_MOCK_MACHINE is not set.
    assert!(std::env::var_os("NVML_MOCK_MACHINE").is_none());
    let dir = tempfile::tempdir().unwrap();
    let lib = dir.path().join(nvml_mock::LIBRARY_FILE);
    std::fs::copy(nvml_mock::library_path().unwrap(), &lib).unwrap();
    let err = Nvml::builder()
        .lib_path(lib.as_os_str())
        .init()
        .unwrap_err();
    assert!(matches!(err, NvmlError::DriverNotLoaded), "{err:?}");
}

#[test]
fn bad_machine_file_fails_init() {
    let dir = tempfile::tempdir().unwrap();
    let machine = dir.path().join("broken.yaml");
    std::fs::write(&machine, "driverVersion: [oops\n").unwrap();
    let lib = nvml_mock::isolated_library(dir.path(), &machine, None).unwrap();
    let err = Nvml::builder()
        .lib_path(lib.as_os_str())
        .init()
        .unwrap_err();
    assert!(matches!(err, NvmlError::Unknown), "{err:?}");
    let missing = dir.path().join("missing.yaml");
    let dir2 = tempfile::tempdir().unwrap();
    let lib = nvml_mock::isolated_library(dir2.path(), &missing, None).unwrap();
    let err = Nvml::builder()
        .lib_path(lib.as_os_str())
        .init()
        .unwrap_err();
    assert!(matches!(err, NvmlError::Unknown), "{err:?}");
}

#[test]
fn init_error_from_the_machine_file() {
    let dir = tempfile::tempdir().unwrap();
    let machine = dir.path().join("m.yaml");
    let mut text = std::fs::read_to_string(nvml_mock::machine_path("workstation")).unwrap();
    text.push_str("initError: 9\n");
    std::fs::File::create(&machine)
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let lib = nvml_mock::isolated_library(dir.path(), &machine, None).unwrap();
    let err = Nvml::builder()
        .lib_path(lib.as_os_str())
        .init()
        .unwrap_err();
    assert!(matches!(err, NvmlError::DriverNotLoaded), "{err:?}");
}

#[test]
fn shutdown_then_reinit_with_another_machine() {
    let dir = tempfile::tempdir().unwrap();
    let machine = dir.path().join("m.yaml");
    std::fs::copy(nvml_mock::machine_path("workstation"), &machine).unwrap();
    let lib = nvml_mock::isolated_library(dir.path(), &machine, None).unwrap();
    let first = Nvml::builder().lib_path(lib.as_os_str()).init().unwrap();
    let second = Nvml::builder().lib_path(lib.as_os_str()).init().unwrap();
    assert_eq!(first.device_count().unwrap(), 2);
    // The machine file is read only when the reference count goes from 0 to 1.
    std::fs::copy(nvml_mock::machine_path("h100-mig"), &machine).unwrap();
    first.shutdown().unwrap();
    assert_eq!(second.device_count().unwrap(), 2);
    second.shutdown().unwrap();
    let third = Nvml::builder().lib_path(lib.as_os_str()).init().unwrap();
    assert_eq!(third.device_count().unwrap(), 1);
}

#[test]
fn parallel_copies_keep_their_own_machines() {
    let threads: Vec<_> = ["dgx-a100", "h100-mig", "workstation", "dgx-a100"]
        .into_iter()
        .map(|name| {
            std::thread::spawn(move || {
                let l = crate::load(name);
                for _ in 0..50 {
                    let n = l.nvml.device_count().unwrap();
                    assert_eq!(
                        n,
                        match name {
                            "dgx-a100" => 8,
                            "h100-mig" => 1,
                            _ => 2,
                        }
                    );
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}
