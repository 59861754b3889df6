//! Opening files kubedev owns without trusting what sits at their paths.
//!
//! Anything can be put where the checkpoint, a lock or a CDI spec belongs: a FIFO (an `open` for
//! reading would wait for a writer forever), a symbolic link to another file, a directory, a
//! device node. Every such file is opened here with `O_NONBLOCK | O_NOFOLLOW`, its type checked
//! with `fstat`, and anything but a regular file refused with an error naming the path and what
//! was found. Directories kubedev creates for itself are private (0700).

use std::fs::File;
use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use rustix::fs::{FileType, Mode, OFlags};

/// What a path held instead of a regular file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum FoundKind {
    /// A directory.
    Directory,
    /// A symbolic link (never followed).
    Symlink,
    /// A FIFO (named pipe).
    Fifo,
    /// A Unix socket.
    Socket,
    /// A character device node.
    CharDevice,
    /// A block device node.
    BlockDevice,
    /// Something else.
    Unknown,
}

impl FoundKind {
    /// The kind of a file of type `t`; `None` for a regular file.
    fn of(t: FileType) -> Option<FoundKind> {
        Some(match t {
            FileType::RegularFile => return None,
            FileType::Directory => FoundKind::Directory,
            FileType::Symlink => FoundKind::Symlink,
            FileType::Fifo => FoundKind::Fifo,
            FileType::Socket => FoundKind::Socket,
            FileType::CharacterDevice => FoundKind::CharDevice,
            FileType::BlockDevice => FoundKind::BlockDevice,
            _ => FoundKind::Unknown,
        })
    }

    /// The kind of the file `meta` describes (not following links); `None` for a regular file.
    pub fn of_metadata(meta: &std::fs::Metadata) -> Option<FoundKind> {
        FoundKind::of(FileType::from_raw_mode(
            std::os::unix::fs::MetadataExt::mode(meta),
        ))
    }
}

impl std::fmt::Display for FoundKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            FoundKind::Directory => "a directory",
            FoundKind::Symlink => "a symbolic link",
            FoundKind::Fifo => "a FIFO (named pipe)",
            FoundKind::Socket => "a socket",
            FoundKind::CharDevice => "a character device",
            FoundKind::BlockDevice => "a block device",
            FoundKind::Unknown => "a special file",
        })
    }
}

/// Opening a file kubedev owns failed: something else is at the path, or the system refused.
/// (Exhaustive: callers match both cases.)
#[derive(Debug, thiserror::Error)]
pub enum SafeOpenError {
    /// Something other than a regular file is at the path.
    #[error("{} is {found}, not a regular file; kubedev does not open it (remove it if it is not needed)", path.display())]
    NotAFile {
        /// The path.
        path: PathBuf,
        /// What is there.
        found: FoundKind,
    },
    /// The file could not be opened or examined.
    #[error("cannot open {}: {source}", path.display())]
    Io {
        /// The path.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
}

impl SafeOpenError {
    /// The path the error is about.
    pub fn path(&self) -> &Path {
        match self {
            SafeOpenError::NotAFile { path, .. } | SafeOpenError::Io { path, .. } => path,
        }
    }
}

impl From<SafeOpenError> for io::Error {
    fn from(e: SafeOpenError) -> io::Error {
        match e {
            SafeOpenError::Io { source, .. } => source,
            e @ SafeOpenError::NotAFile { .. } => io::Error::new(io::ErrorKind::InvalidData, e),
        }
    }
}

/// How [`open_regular`] opens a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Read only; a missing file is `Ok(None)`.
    Read,
    /// Read and write, created with `mode` when missing.
    ReadWriteCreate {
        /// The mode of a new file.
        mode: u32,
    },
}

/// Opens the regular file at `path` without blocking and without following a symbolic link;
/// anything else at the path is [`SafeOpenError::NotAFile`]. `Ok(None)` when nothing is there
/// and `access` does not create.
pub fn open_regular(path: &Path, access: Access) -> Result<Option<File>, SafeOpenError> {
    let io_err = |source: io::Error| SafeOpenError::Io {
        path: path.to_path_buf(),
        source,
    };
    let (flags, mode) = match access {
        Access::Read => (OFlags::RDONLY, Mode::empty()),
        Access::ReadWriteCreate { mode } => {
            (OFlags::RDWR | OFlags::CREATE, Mode::from_raw_mode(mode))
        }
    };
    let flags = flags | OFlags::NONBLOCK | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NOCTTY;
    let fd = match rustix::fs::open(path, flags, mode) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::NOENT) if access == Access::Read => return Ok(None),
        // O_NOFOLLOW on a link: ELOOP. Say what is there rather than "too many links".
        Err(rustix::io::Errno::LOOP) => {
            return Err(SafeOpenError::NotAFile {
                path: path.to_path_buf(),
                found: FoundKind::Symlink,
            });
        }
        // A directory opened for writing.
        Err(rustix::io::Errno::ISDIR) => {
            return Err(SafeOpenError::NotAFile {
                path: path.to_path_buf(),
                found: FoundKind::Directory,
            });
        }
        // A socket cannot be opened at all.
        Err(rustix::io::Errno::NXIO) => {
            let found = std::fs::symlink_metadata(path)
                .ok()
                .and_then(|m| FoundKind::of_metadata(&m))
                .unwrap_or(FoundKind::Unknown);
            return Err(SafeOpenError::NotAFile {
                path: path.to_path_buf(),
                found,
            });
        }
        Err(e) => return Err(io_err(e.into())),
    };
    let stat = rustix::fs::fstat(&fd).map_err(|e| io_err(e.into()))?;
    if let Some(found) = FoundKind::of(FileType::from_raw_mode(stat.st_mode)) {
        return Err(SafeOpenError::NotAFile {
            path: path.to_path_buf(),
            found,
        });
    }
    // Reads of a regular file never block; clear the flag so the file behaves as usual.
    rustix::fs::fcntl_setfl(
        &fd,
        rustix::fs::fcntl_getfl(&fd).map_err(|e| io_err(e.into()))? & !OFlags::NONBLOCK,
    )
    .map_err(|e| io_err(e.into()))?;
    Ok(Some(File::from(fd)))
}

/// Reads the regular file at `path`, at most `limit` bytes plus one (so a caller can tell the
/// file is too large). `Ok(None)` when nothing is there; anything but a regular file is refused.
pub fn read_regular(path: &Path, limit: u64) -> Result<Option<Vec<u8>>, SafeOpenError> {
    use std::io::Read as _;
    let Some(file) = open_regular(path, Access::Read)? else {
        return Ok(None);
    };
    let mut bytes = Vec::new();
    file.take(limit.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|source| SafeOpenError::Io {
            path: path.to_path_buf(),
            source,
        })?;
    Ok(Some(bytes))
}

/// Creates `dir` and its missing parents, each new one private to the daemon (0700). Existing
/// directories keep their mode.
pub fn create_private_dir_all(dir: &Path) -> io::Result<()> {
    create_dir_all_mode(dir, 0o700)
}

/// Creates `dir` and its missing parents with `mode` (less the umask). Existing directories
/// keep their mode.
pub fn create_dir_all_mode(dir: &Path, mode: u32) -> io::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(mode)
        .create(dir)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;
    use crate::atomic_file::test_support::TestDir;

    fn mkfifo(path: &Path) {
        rustix::fs::mknodat(
            rustix::fs::CWD,
            path,
            FileType::Fifo,
            Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
    }

    #[test]
    fn a_fifo_is_refused_at_once_instead_of_waiting_for_a_writer() {
        let d = TestDir::new("safefs-fifo");
        let path = d.path().join("checkpoint.json");
        mkfifo(&path);
        let err = read_regular(&path, 1024).unwrap_err();
        assert!(matches!(
            err,
            SafeOpenError::NotAFile {
                found: FoundKind::Fifo,
                ..
            }
        ));
        let text = crate::echo::chain(&err);
        assert!(
            text.contains("checkpoint.json") && text.contains("FIFO"),
            "{text}"
        );
        let err = open_regular(&path, Access::ReadWriteCreate { mode: 0o600 }).unwrap_err();
        assert!(matches!(
            err,
            SafeOpenError::NotAFile {
                found: FoundKind::Fifo,
                ..
            }
        ));
    }

    #[test]
    fn links_directories_and_sockets_are_named_and_never_followed() {
        let d = TestDir::new("safefs-kinds");
        let target = d.path().join("target");
        std::fs::write(&target, "secret").unwrap();
        let link = d.path().join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let dir = d.path().join("dir");
        std::fs::create_dir(&dir).unwrap();
        let sock = d.path().join("sock");
        let _l = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        for (path, kind) in [
            (&link, FoundKind::Symlink),
            (&dir, FoundKind::Directory),
            (&sock, FoundKind::Socket),
        ] {
            for access in [Access::Read, Access::ReadWriteCreate { mode: 0o600 }] {
                match open_regular(path, access) {
                    Err(SafeOpenError::NotAFile { found, .. }) => {
                        assert_eq!(found, kind, "{path:?}")
                    }
                    other => panic!("{path:?} {access:?}: {other:?}"),
                }
            }
        }
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "secret");
    }

    #[test]
    fn regular_files_read_and_missing_ones_are_none_or_created() {
        let d = TestDir::new("safefs-regular");
        let path = d.path().join("f");
        assert!(read_regular(&path, 10).unwrap().is_none());
        let f = open_regular(&path, Access::ReadWriteCreate { mode: 0o600 })
            .unwrap()
            .unwrap();
        drop(f);
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        std::fs::write(&path, "0123456789abc").unwrap();
        assert_eq!(read_regular(&path, 4).unwrap().unwrap(), b"01234");
    }

    #[test]
    fn created_directories_are_private() {
        let d = TestDir::new("safefs-dirs");
        let deep = d.path().join("a/b/c");
        create_private_dir_all(&deep).unwrap();
        for p in ["a", "a/b", "a/b/c"] {
            let mode = std::fs::metadata(d.path().join(p))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o700, "{p}");
        }
    }
}
