//! Stand-ins for the NVIDIA driver's command-line tools that kubedev's GPU sharing runs, so the
//! whole path is tested without a GPU:
//!
//! - `mock-nvidia-smi`: the subset kubedev uses, `nvidia-smi -i <uuid> -c <mode>` (compute mode)
//!   and `nvidia-smi compute-policy -i <uuid> --set-timeslice <n>`, plus `-q -i <uuid>` printing
//!   what is set. The GPUs' settings live in a JSON file (env `NVML_MOCK_SETTINGS`), so every
//!   process sees the same GPUs; with `NVML_MOCK_MACHINE` set, unknown UUIDs are refused as the
//!   real tool refuses them.
//! - `mock-nvidia-cuda-mps-control`: the MPS control daemon (`-d`) and its client (commands on
//!   standard input), speaking over a Unix socket `control` in `CUDA_MPS_PIPE_DIRECTORY`,
//!   logging to `control.log` in `CUDA_MPS_LOG_DIRECTORY`, with the pid file
//!   `nvidia-cuda-mps-control.pid` in the pipe directory.
//!
//! [`tool_path`] finds the built executables.

pub mod mps;
pub mod smi;

use std::path::{Path, PathBuf};

/// Path of a built stand-in tool (`"mock-nvidia-smi"`, `"mock-nvidia-cuda-mps-control"`) in the
/// target directory of the running executable (`target/<profile>/`, after
/// `cargo build -p kubedev-nvml-mock`); `None` when it is not built.
pub fn tool_path(name: &str) -> Option<PathBuf> {
    let path = crate::locate::target_dir()?.join(name);
    path.is_file().then_some(path)
}

/// Writes an executable `nvidia-smi` wrapper at `path` that runs the built stand-in with the
/// settings file `settings` and the machine `machine`, as a node's driver installation would
/// provide the tool; `None` when the stand-in is not built.
pub fn smi_wrapper(path: &Path, settings: &Path, machine: &Path) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let smi = tool_path("mock-nvidia-smi")?;
    let script = format!(
        "#!/bin/sh\nNVML_MOCK_SETTINGS='{}' NVML_MOCK_MACHINE='{}' exec '{}' \"$@\"\n",
        settings.display(),
        machine.display(),
        smi.display()
    );
    std::fs::write(path, script).ok()?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).ok()?;
    Some(path.to_path_buf())
}
