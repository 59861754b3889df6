//! Giving a socket and its directory to the user a container runs as, and the SELinux label
//! containers may use — without ever following a symbolic link at the socket or its directory.
//!
//! The directory's parent is resolved inside the host root (so `/var/run` → `/run` works), then
//! the directory and the socket are reached with `openat`/`fstatat`/`fchownat` relative to an
//! open directory, with `O_NOFOLLOW` / `AT_SYMLINK_NOFOLLOW`. If either is a symbolic link the
//! call fails before anything is changed: a link planted where the socket should be cannot make
//! the daemon (root) hand another file to the container's user.
//!
//! SELinux: when the host has selinuxfs mounted (`/sys/fs/selinux/enforce` exists under the host
//! root, enforcing or permissive), the `security.selinux` extended attribute of the directory
//! and the socket is set to the configured context (NUL-terminated, as libselinux writes it),
//! using `fsetxattr` on the open directory and `lsetxattr` on the socket. Without SELinux
//! nothing is labelled.

use kubedev_core::factory::InvalidValue;
use std::ffi::OsStr;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use kubedev_core::HostFs;
use rustix::fs::{AtFlags, FileType, Gid, Mode, OFlags, Uid, XattrFlags};
use rustix::io::Errno;

use crate::config::Owner;
use crate::error::HostError;

/// The file whose presence means SELinux is enabled on the host.
pub const SELINUX_ENFORCE: &str = "/sys/fs/selinux/enforce";

/// The extended attribute holding a file's SELinux context.
pub const SELINUX_XATTR: &str = "security.selinux";

/// Whether SELinux is enabled on the host (selinuxfs mounted under the host root).
pub fn selinux_enabled(host: &HostFs) -> bool {
    host.exists(SELINUX_ENFORCE)
}

fn io(operation: &'static str, path: &Path, e: Errno) -> HostError {
    HostError::Io {
        operation,
        path: path.to_path_buf(),
        error: std::io::Error::from(e),
    }
}

const DIR_FLAGS: OFlags = OFlags::DIRECTORY
    .union(OFlags::RDONLY)
    .union(OFlags::CLOEXEC)
    .union(OFlags::NOFOLLOW);

/// An open directory: its descriptor, host path and path on this machine.
struct OpenDir {
    fd: OwnedFd,
    host_path: PathBuf,
    real: PathBuf,
}

/// Fails with [`HostError::Symlink`] when `name` in `dir` is a symbolic link; returns its type,
/// or `None` when it does not exist.
fn entry_type(
    dir: &OwnedFd,
    name: &OsStr,
    host_path: &Path,
) -> Result<Option<FileType>, HostError> {
    match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => {
            let t = FileType::from_raw_mode(st.st_mode);
            if t == FileType::Symlink {
                Err(HostError::Symlink {
                    path: host_path.to_path_buf(),
                })
            } else {
                Ok(Some(t))
            }
        }
        Err(Errno::NOENT) => Ok(None),
        Err(e) => Err(io("examining", host_path, e)),
    }
}

/// Opens the directory `dir` (a host path): its parent resolved inside the root, the directory
/// itself not followed if it is a symbolic link.
fn open_dir(host: &HostFs, dir: &Path) -> Result<OpenDir, HostError> {
    let (Some(parent), Some(name)) = (dir.parent(), dir.file_name()) else {
        let real = host.resolve(dir)?;
        let fd =
            rustix::fs::open(&real, DIR_FLAGS, Mode::empty()).map_err(|e| io("opening", dir, e))?;
        return Ok(OpenDir {
            fd,
            host_path: dir.to_path_buf(),
            real,
        });
    };
    let parent_real = host.resolve(parent)?;
    let pfd = rustix::fs::open(&parent_real, DIR_FLAGS, Mode::empty())
        .map_err(|e| io("opening", parent, e))?;
    match entry_type(&pfd, name, dir)? {
        Some(FileType::Directory) => {}
        Some(_) => return Err(io("opening", dir, Errno::NOTDIR)),
        None => return Err(io("opening", dir, Errno::NOENT)),
    }
    let fd = rustix::fs::openat(&pfd, name, DIR_FLAGS, Mode::empty()).map_err(|e| match e {
        Errno::LOOP => HostError::Symlink {
            path: dir.to_path_buf(),
        },
        e => io("opening", dir, e),
    })?;
    Ok(OpenDir {
        fd,
        host_path: dir.to_path_buf(),
        real: parent_real.join(name),
    })
}

/// Sets the owner (when given) and the SELinux context (when given) of the socket at `socket`
/// (a host path) and of its directory, following no symbolic link at either. Returns whether the
/// socket exists (its directory is handled either way; a missing directory is an error).
/// Nothing is changed when the socket or the directory is a symbolic link.
pub fn set_socket_access(
    host: &HostFs,
    socket: &Path,
    owner: Option<Owner>,
    selinux_context: Option<&str>,
) -> Result<bool, HostError> {
    let (Some(dir), Some(name)) = (socket.parent(), socket.file_name()) else {
        return Err(HostError::Config(InvalidValue {
            field: "path".into(),
            value: socket.display().to_string(),
            reason: "must name a socket inside a directory".into(),
        }));
    };
    let d = open_dir(host, dir)?;
    let present = entry_type(&d.fd, name, socket)?.is_some();
    let ids = owner.map(|o| (Uid::from_raw(o.uid), Gid::from_raw(o.gid)));
    if let Some((uid, gid)) = ids {
        rustix::fs::fchown(&d.fd, Some(uid), Some(gid))
            .map_err(|e| io("changing the owner of", &d.host_path, e))?;
        if present {
            rustix::fs::chownat(&d.fd, name, Some(uid), Some(gid), AtFlags::SYMLINK_NOFOLLOW)
                .map_err(|e| io("changing the owner of", socket, e))?;
        }
    }
    if let Some(ctx) = selinux_context {
        let mut value = ctx.as_bytes().to_vec();
        value.push(0);
        rustix::fs::fsetxattr(&d.fd, SELINUX_XATTR, &value, XattrFlags::empty())
            .map_err(|e| io("setting the SELinux context of", &d.host_path, e))?;
        if present {
            rustix::fs::lsetxattr(
                d.real.join(name),
                SELINUX_XATTR,
                &value,
                XattrFlags::empty(),
            )
            .map_err(|e| io("setting the SELinux context of", socket, e))?;
        }
    }
    Ok(present)
}
