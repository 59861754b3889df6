//! Crash-safe file replacement, for the daemon's checkpoint and CDI specs and for backends' records.
//!
//! A file is replaced by writing a temporary file in the same directory, fsyncing it, renaming
//! it over the target and fsyncing the directory. A reader therefore sees the old content or the
//! new content, never a mix, and after the call returns the new content survives a power loss.
//! A crash between creating the temporary file and the rename leaves a hidden temporary file
//! (`.<name>.tmp-<suffix>`) that [`remove_stale_temps`] cleans up.

use std::fs::{self, File, OpenOptions, Permissions};
use std::io;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// What separates the target's name from the unique suffix in a temporary file's name.
const TEMP_MARKER: &str = ".tmp-";

/// How often a temporary name is retried when it already exists.
const TEMP_NAME_ATTEMPTS: u32 = 16;

/// A step of [`replace`] that failed, with the path it failed on.
#[derive(Debug)]
#[non_exhaustive]
pub struct WriteFailure {
    /// What was being done, e.g. "creating temporary file".
    pub step: &'static str,
    /// The file or directory the step failed on.
    pub path: PathBuf,
    /// The I/O error.
    pub source: io::Error,
}

impl WriteFailure {
    fn new(step: &'static str, path: &Path, source: io::Error) -> Self {
        WriteFailure {
            step,
            path: path.to_owned(),
            source,
        }
    }
}

/// The prefix shared by every temporary file made for a target named `file_name`
/// (or, for a family of targets, for every name starting with `file_name`).
pub fn temp_prefix(file_name: &str) -> String {
    format!(".{file_name}")
}

/// Replaces `path` atomically with what `write` writes into a fresh file with permissions `mode`.
///
/// The permissions are set with `fchmod`, so the umask does not change them. On any failure the
/// temporary file is removed and the old content of `path` is untouched (a failure while
/// fsyncing the directory is reported after the rename, when the new content is already in
/// place but may not be durable yet).
pub fn replace(
    path: &Path,
    mode: u32,
    write: impl FnOnce(&mut File) -> io::Result<()>,
) -> Result<(), WriteFailure> {
    let invalid = |what: &str| {
        WriteFailure::new(
            "checking target path",
            path,
            io::Error::new(io::ErrorKind::InvalidInput, what.to_string()),
        )
    };
    let dir = path
        .parent()
        .ok_or_else(|| invalid("path has no parent directory"))?;
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| invalid("path has no UTF-8 file name"))?;
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };

    let (temp_path, mut file) = create_temp(dir, name)?;
    let result = (|| {
        file.set_permissions(Permissions::from_mode(mode))
            .map_err(|e| WriteFailure::new("setting permissions of", &temp_path, e))?;
        write(&mut file).map_err(|e| WriteFailure::new("writing", &temp_path, e))?;
        file.sync_all()
            .map_err(|e| WriteFailure::new("fsyncing", &temp_path, e))?;
        drop(file);
        fs::rename(&temp_path, path)
            .map_err(|e| WriteFailure::new("renaming temporary file over", path, e))
    })();
    if let Err(e) = result {
        // Best effort: the temporary file is garbage now; a failure to remove it is cleaned up
        // later by `remove_stale_temps`, and the original error is what the caller needs.
        let _ = fs::remove_file(&temp_path);
        return Err(e);
    }
    sync_dir(dir).map_err(|e| WriteFailure::new("fsyncing directory", dir, e))
}

/// Creates a new, empty temporary file next to `name` in `dir` with a name nobody else uses.
fn create_temp(dir: &Path, name: &str) -> Result<(PathBuf, File), WriteFailure> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut last_err = None;
    for _ in 0..TEMP_NAME_ATTEMPTS {
        // Two daemon instances in different PID namespaces can share a PID, so the suffix also
        // carries a per-process counter and the time; `create_new` settles any remaining tie.
        // The file starts readable by its owner only; `replace` sets the final mode.
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let count = COUNTER.fetch_add(1, Ordering::Relaxed);
        let temp_name = format!(
            "{}{TEMP_MARKER}{}-{count}-{nanos}",
            temp_prefix(name),
            std::process::id()
        );
        let temp_path = dir.join(temp_name);
        match OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&temp_path)
        {
            Ok(f) => return Ok((temp_path, f)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last_err = Some(e),
            Err(e) => return Err(WriteFailure::new("creating temporary file", &temp_path, e)),
        }
    }
    Err(WriteFailure::new(
        "creating temporary file",
        &dir.join(temp_prefix(name)),
        last_err.unwrap_or_else(|| io::Error::other("no free temporary name")),
    ))
}

/// Fsyncs a directory, making renames and removals in it durable.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// True when `file_name` is a temporary file made by [`replace`] for a target whose name starts
/// with `target_prefix`.
pub fn is_temp_name(file_name: &str, target_prefix: &str) -> bool {
    file_name
        .strip_prefix(&temp_prefix(target_prefix))
        .is_some_and(|rest| rest.contains(TEMP_MARKER))
}

/// Removes temporary files left in `dir` by interrupted [`replace`] calls for targets whose names
/// start with `target_prefix`, if they were last modified at least `older_than` ago. Returns the
/// paths removed. A missing directory has nothing to remove.
pub fn remove_stale_temps(
    dir: &Path,
    target_prefix: &str,
    older_than: Duration,
) -> io::Result<Vec<PathBuf>> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let now = SystemTime::now();
    let mut removed = Vec::new();
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if !is_temp_name(name, target_prefix) {
            continue;
        }
        let path = entry.path();
        let meta = match fs::symlink_metadata(&path) {
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        if !meta.is_file() {
            continue;
        }
        // A modification time in the future counts as fresh.
        let age = meta
            .modified()
            .ok()
            .and_then(|m| now.duration_since(m).ok())
            .unwrap_or(Duration::ZERO);
        if age < older_than {
            continue;
        }
        match fs::remove_file(&path) {
            Ok(()) => removed.push(path),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    if !removed.is_empty() {
        sync_dir(dir)?;
    }
    removed.sort();
    Ok(removed)
}

/// A scratch directory for tests, removed when dropped.
#[cfg(test)]
pub(crate) mod test_support {
    use std::path::{Path, PathBuf};
    use std::sync::atomic::{AtomicU64, Ordering};

    #[derive(Debug)]
    pub(crate) struct TestDir(PathBuf);

    impl TestDir {
        pub(crate) fn new(tag: &str) -> Self {
            static COUNTER: AtomicU64 = AtomicU64::new(0);
            let n = COUNTER.fetch_add(1, Ordering::Relaxed);
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0);
            let path = std::env::temp_dir().join(format!(
                "kubedev-core-{tag}-{}-{n}-{nanos}",
                std::process::id()
            ));
            std::fs::create_dir_all(&path).expect("create test dir");
            TestDir(path)
        }

        pub(crate) fn path(&self) -> &Path {
            &self.0
        }

        /// File names in the directory, sorted.
        pub(crate) fn names(&self) -> Vec<String> {
            let mut names: Vec<String> = std::fs::read_dir(&self.0)
                .expect("read test dir")
                .map(|e| {
                    e.expect("dir entry")
                        .file_name()
                        .into_string()
                        .expect("utf-8 name")
                })
                .collect();
            names.sort();
            names
        }
    }

    impl Drop for TestDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::test_support::TestDir;
    use super::*;

    #[test]
    fn replace_writes_content_and_mode_and_leaves_no_temp() {
        let dir = TestDir::new("atomic");
        let target = dir.path().join("spec.json");
        replace(&target, 0o644, |f| f.write_all(b"one")).expect("first write");
        replace(&target, 0o644, |f| f.write_all(b"two")).expect("second write");
        assert_eq!(fs::read(&target).expect("read"), b"two");
        let mode = fs::metadata(&target).expect("meta").permissions().mode() & 0o7777;
        assert_eq!(mode, 0o644);
        replace(&target, 0o600, |f| f.write_all(b"three")).expect("third write");
        let mode = fs::metadata(&target).expect("meta").permissions().mode() & 0o7777;
        assert_eq!(mode, 0o600);
        assert_eq!(dir.names(), ["spec.json"]);
    }

    #[test]
    fn failed_write_keeps_old_content_and_removes_temp() {
        let dir = TestDir::new("atomic");
        let target = dir.path().join("state.json");
        replace(&target, 0o644, |f| f.write_all(b"old")).expect("write");
        let err = replace(&target, 0o644, |f| {
            f.write_all(b"half of the new")?;
            Err(io::Error::other("disk full"))
        })
        .expect_err("write must fail");
        assert_eq!(err.step, "writing");
        assert!(err.path.to_string_lossy().contains(".state.json.tmp-"));
        assert_eq!(fs::read(&target).expect("read"), b"old");
        assert_eq!(dir.names(), ["state.json"]);
    }

    #[test]
    fn failed_rename_removes_temp() {
        let dir = TestDir::new("atomic");
        // A non-empty directory cannot be replaced by a file.
        let target = dir.path().join("busy");
        fs::create_dir(&target).expect("mkdir");
        fs::write(target.join("inside"), b"x").expect("write inside");
        let err = replace(&target, 0o644, |f| f.write_all(b"new")).expect_err("must fail");
        assert_eq!(err.step, "renaming temporary file over");
        assert_eq!(err.path, target);
        assert_eq!(dir.names(), ["busy"]);
        assert_eq!(fs::read(target.join("inside")).expect("read"), b"x");
    }

    #[test]
    fn missing_directory_is_an_error_naming_the_temp_file() {
        let dir = TestDir::new("atomic");
        let target = dir.path().join("no-such-dir").join("f.json");
        let err = replace(&target, 0o644, |f| f.write_all(b"x")).expect_err("must fail");
        assert_eq!(err.step, "creating temporary file");
        assert!(err.path.starts_with(dir.path().join("no-such-dir")));
    }

    #[test]
    fn stale_temps_are_recognised_and_removed() {
        let dir = TestDir::new("atomic");
        fs::write(dir.path().join(".k8s.a-claim_u1.json.tmp-1-2-3"), b"x").expect("w");
        fs::write(dir.path().join(".k8s.b-claim_u1.json.tmp-1-2-3"), b"x").expect("w");
        fs::write(dir.path().join("k8s.a-claim_u1.json"), b"x").expect("w");
        fs::write(dir.path().join(".k8s.a-claim_u2.json"), b"x").expect("w");
        assert!(is_temp_name(
            ".k8s.a-claim_u1.json.tmp-1-2-3",
            "k8s.a-claim_"
        ));
        assert!(!is_temp_name("k8s.a-claim_u1.json", "k8s.a-claim_"));
        // Too young to be stale.
        let none = remove_stale_temps(dir.path(), "k8s.a-claim_", Duration::from_secs(3600))
            .expect("scan");
        assert!(none.is_empty());
        let removed =
            remove_stale_temps(dir.path(), "k8s.a-claim_", Duration::ZERO).expect("remove");
        assert_eq!(removed, [dir.path().join(".k8s.a-claim_u1.json.tmp-1-2-3")]);
        assert_eq!(
            dir.names(),
            [
                ".k8s.a-claim_u2.json",
                ".k8s.b-claim_u1.json.tmp-1-2-3",
                "k8s.a-claim_u1.json"
            ]
        );
        let missing = remove_stale_temps(&dir.path().join("nope"), "x", Duration::ZERO)
            .expect("missing dir is empty");
        assert!(missing.is_empty());
    }
}
