//! The mock library loaded through nvml-wrapper, as the NVIDIA backend loads the real one.
//!
//! `cargo test -p kubedev-nvml-mock` builds the crate's cdylib (target/<profile>/deps/ and
//! target/<profile>/libnvml_mock.so) because the crate under test is built with all its crate types; every test loads a private
//! copy of it (`isolated_library`), so tests run in parallel with different machines.
#![allow(unsafe_code, clippy::unwrap_used)]

mod abi;
mod attributes;
mod events;
mod init;
mod mig;

use std::path::{Path, PathBuf};

use nvml_wrapper::Nvml;
use tempfile::TempDir;

/// A loaded copy of the mock bound to a machine; keeps its directory alive.
pub(crate) struct Loaded {
    pub(crate) nvml: Nvml,
    pub(crate) _dir: TempDir,
    pub(crate) control: PathBuf,
}

/// Loads a private copy of the mock with a bundled machine and a control file in the temp dir.
pub(crate) fn load(machine: &str) -> Loaded {
    load_file(&nvml_mock::machine_path(machine))
}

/// Loads a private copy of the mock with a machine file.
pub(crate) fn load_file(machine: &Path) -> Loaded {
    let dir = tempfile::tempdir().unwrap();
    let control = dir.path().join("control.jsonl");
    let lib = nvml_mock::isolated_library(dir.path(), machine, Some(&control)).unwrap();
    let nvml = Nvml::builder().lib_path(lib.as_os_str()).init().unwrap();
    Loaded {
        nvml,
        _dir: dir,
        control,
    }
}

/// Appends JSON lines to a control file.
pub(crate) fn control(path: &Path, lines: &[&str]) {
    use std::io::Write;
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap();
    for line in lines {
        writeln!(file, "{line}").unwrap();
    }
}
