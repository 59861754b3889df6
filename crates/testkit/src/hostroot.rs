//! Fake host roots: temporary directory trees laid out like a machine's `/sys` and `/dev`.

use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

/// A temporary host root; everything under it is removed when the value is dropped.
#[derive(Debug)]
pub struct HostRoot {
    dir: tempfile::TempDir,
}

impl HostRoot {
    /// An empty host root in a new temporary directory.
    pub fn new() -> std::io::Result<Self> {
        Ok(HostRoot {
            dir: tempfile::Builder::new()
                .prefix("kubedev-hostroot")
                .tempdir()?,
        })
    }

    /// The root directory (what the backend is given as its host root).
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// The absolute path of `rel` (a path written as on the host, e.g. `/sys/bus/pci`).
    pub fn join(&self, rel: impl AsRef<Path>) -> PathBuf {
        let rel = rel.as_ref();
        self.path().join(rel.strip_prefix("/").unwrap_or(rel))
    }

    /// Writes a file (creating parent directories), e.g. a sysfs attribute.
    pub fn file(
        &self,
        rel: impl AsRef<Path>,
        contents: impl AsRef<[u8]>,
    ) -> std::io::Result<PathBuf> {
        let p = self.join(rel);
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&p, contents)?;
        Ok(p)
    }

    /// Creates a directory and its parents.
    pub fn dir(&self, rel: impl AsRef<Path>) -> std::io::Result<PathBuf> {
        let p = self.join(rel);
        std::fs::create_dir_all(&p)?;
        Ok(p)
    }

    /// Creates a symbolic link at `rel` pointing to `target` (written as-is, relative or
    /// absolute), as sysfs does for `driver`, `iommu_group` and `physfn`.
    pub fn link(
        &self,
        rel: impl AsRef<Path>,
        target: impl AsRef<Path>,
    ) -> std::io::Result<PathBuf> {
        let p = self.join(rel);
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent)?;
        }
        let _ = std::fs::remove_file(&p);
        symlink(target, &p)?;
        Ok(p)
    }

    /// Creates a stand-in for a device node (a regular file) at `rel`, e.g. `/dev/kvm`.
    pub fn device_node(&self, rel: impl AsRef<Path>) -> std::io::Result<PathBuf> {
        self.file(rel, b"")
    }

    /// Creates a real character device node `major:minor` at `rel` (mode 0600), replacing what
    /// is there, e.g. the stand-in of [`HostRoot::device_node`]: for tests that hand the node to
    /// a container runtime (see `podman::FakeNode::from_host_root`). Needs root (`CAP_MKNOD`).
    pub fn char_device(
        &self,
        rel: impl AsRef<Path>,
        major: u32,
        minor: u32,
    ) -> std::io::Result<PathBuf> {
        use rustix::fs::{CWD, FileType, Mode, makedev, mknodat};
        let p = self.join(rel);
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent)?;
        }
        match std::fs::remove_file(&p) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        mknodat(
            CWD,
            &p,
            FileType::CharacterDevice,
            Mode::from_raw_mode(0o600),
            makedev(major, minor),
        )?;
        Ok(p)
    }

    /// Removes a file or a whole directory under the root (a hot-unplug).
    pub fn remove(&self, rel: impl AsRef<Path>) -> std::io::Result<()> {
        let p = self.join(rel);
        match std::fs::symlink_metadata(&p) {
            Ok(m) if m.is_dir() => std::fs::remove_dir_all(p),
            Ok(_) => std::fs::remove_file(p),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn builds_files_links_and_nodes_under_the_root() {
        let root = HostRoot::new().unwrap();
        root.file("/sys/bus/pci/devices/0000:01:00.0/vendor", "0x10de\n")
            .unwrap();
        root.link(
            "/sys/bus/pci/devices/0000:01:00.0/iommu_group",
            "../../../kernel/iommu_groups/7",
        )
        .unwrap();
        root.device_node("/dev/vfio/7").unwrap();
        let vendor =
            std::fs::read_to_string(root.join("/sys/bus/pci/devices/0000:01:00.0/vendor")).unwrap();
        assert_eq!(vendor, "0x10de\n");
        let target =
            std::fs::read_link(root.join("sys/bus/pci/devices/0000:01:00.0/iommu_group")).unwrap();
        assert!(target.ends_with("iommu_groups/7"));
        root.remove("/dev/vfio/7").unwrap();
        assert!(!root.join("/dev/vfio/7").exists());
        let path = root.path().to_path_buf();
        drop(root);
        assert!(!path.exists());
    }
}
