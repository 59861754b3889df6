//! Small crash-safe file operations for backends' own records (e.g. the original driver of a
//! rebound PCI function): a record is either wholly there or not at all after a crash.

use std::io;
use std::path::Path;

/// Replaces `path` with `contents` atomically and durably (temporary file, fsync, rename, fsync
/// of the directory), with permissions 0600. The directory must exist.
pub fn write(path: &Path, contents: &[u8]) -> io::Result<()> {
    crate::atomic_file::replace(path, 0o600, |f| io::Write::write_all(f, contents)).map_err(|e| {
        io::Error::new(
            e.source.kind(),
            format!("{} {}: {}", e.step, e.path.display(), e.source),
        )
    })
}

/// Removes `path` durably (the directory is fsynced); a missing file is not an error.
pub fn remove(path: &Path) -> io::Result<()> {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    }
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => crate::atomic_file::sync_dir(dir),
        _ => crate::atomic_file::sync_dir(Path::new(".")),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn write_replace_remove() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("rec.json");
        write(&p, b"one").unwrap();
        write(&p, b"two").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"two");
        // Only the record is left: no temporary files.
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 1);
        remove(&p).unwrap();
        assert!(!p.exists());
        remove(&p).unwrap();
        let e = write(&d.path().join("missing/rec"), b"x").unwrap_err();
        assert!(e.to_string().contains("missing"), "{e}");
    }
}
