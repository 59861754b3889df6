//! Finding the built library and the bundled machine files, and private copies of the library
//! for tests that run in parallel with different machines.

use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// File name of the built library on Linux.
pub const LIBRARY_FILE: &str = "libnvml_mock.so";

/// Suffix of the sidecar file that binds a copy of the library to a machine.
const SIDECAR_SUFFIX: &str = ".machine.json";

/// What a sidecar file next to a library copy says.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Sidecar {
    machine: PathBuf,
    #[serde(default)]
    control: Option<PathBuf>,
}

/// Path of the built mock library: env `KUBEDEV_NVML_MOCK` first, else `libnvml_mock.so` in the
/// target directory of the running executable: `target/<profile>/deps/` (where cargo puts it when
/// a test's crate has `kubedev-nvml-mock` as a dev-dependency, so `cargo test -p <that crate>`
/// builds it), then `target/<profile>/` (after `cargo build -p kubedev-nvml-mock`). `None` when
/// it does not exist.
pub fn library_path() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("KUBEDEV_NVML_MOCK") {
        let path = PathBuf::from(path);
        return path.is_file().then_some(path);
    }
    let dir = target_dir()?;
    [dir.join("deps").join(LIBRARY_FILE), dir.join(LIBRARY_FILE)]
        .into_iter()
        .find(|p| p.is_file())
}

/// `target/<profile>/` of the running executable (a test in `deps/` or an example).
pub(crate) fn target_dir() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let mut dir = exe.parent()?;
    if dir
        .file_name()
        .is_some_and(|n| n == "deps" || n == "examples")
    {
        dir = dir.parent()?;
    }
    Some(dir.to_path_buf())
}

/// Path of a bundled machine file: `machines/<name>.yaml` of this crate (`"dgx-a100"`,
/// `"h100-mig"`, `"workstation"`).
pub fn machine_path(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("machines")
        .join(format!("{name}.yaml"))
}

/// Copies the mock library into `dir` and binds the copy to `machine` (and `control`, if given)
/// with a sidecar file, returning the copy's path for `Nvml::builder().lib_path(..)`.
///
/// Each copy is loaded as a separate library with its own state, so tests in one process can use
/// different machines at the same time without touching environment variables. Use one `dir`
/// per copy (a temporary directory).
pub fn isolated_library(dir: &Path, machine: &Path, control: Option<&Path>) -> io::Result<PathBuf> {
    let source = library_path().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::NotFound,
            "libnvml_mock.so not found: run `cargo build -p kubedev-nvml-mock` or set KUBEDEV_NVML_MOCK",
        )
    })?;
    let target = dir.join(LIBRARY_FILE);
    std::fs::copy(&source, &target)?;
    let sidecar = Sidecar {
        machine: std::path::absolute(machine)?,
        control: control.map(std::path::absolute).transpose()?,
    };
    let text = serde_json::to_vec_pretty(&sidecar).map_err(io::Error::other)?;
    std::fs::write(sidecar_path(&target), text)?;
    Ok(target)
}

fn sidecar_path(library: &Path) -> PathBuf {
    let mut name = library.as_os_str().to_os_string();
    name.push(SIDECAR_SUFFIX);
    PathBuf::from(name)
}

/// The machine and control paths from the sidecar next to this loaded copy of the library.
pub(crate) fn own_sidecar() -> Option<(PathBuf, Option<PathBuf>)> {
    let library = own_path()?;
    let text = std::fs::read(sidecar_path(&library)).ok()?;
    match serde_json::from_slice::<Sidecar>(&text) {
        Ok(s) => Some((s.machine, s.control)),
        Err(e) => {
            eprintln!("nvml-mock: ignoring sidecar of {}: {e}", library.display());
            None
        }
    }
}

/// The file this code was loaded from, found in `/proc/self/maps`.
fn own_path() -> Option<PathBuf> {
    let here = own_path as fn() -> Option<PathBuf> as usize;
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    maps.lines().find_map(|line| {
        let mut fields = line.splitn(6, ' ');
        let range = fields.next()?;
        let (lo, hi) = range.split_once('-')?;
        let (lo, hi) = (
            usize::from_str_radix(lo, 16).ok()?,
            usize::from_str_radix(hi, 16).ok()?,
        );
        if !(lo..hi).contains(&here) {
            return None;
        }
        let path = fields.nth(4)?.trim();
        path.starts_with('/')
            .then(|| PathBuf::from(path.trim_end_matches(" (deleted)")))
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn bundled_machines_exist() {
        for name in ["dgx-a100", "h100-mig", "workstation"] {
            assert!(machine_path(name).is_file(), "{name}");
        }
    }

    #[test]
    fn own_path_is_the_test_binary() {
        let own = own_path().unwrap();
        assert_eq!(
            own.canonicalize().unwrap(),
            std::env::current_exe().unwrap().canonicalize().unwrap()
        );
    }
}
