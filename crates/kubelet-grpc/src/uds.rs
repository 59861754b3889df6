//! Unix-socket plumbing shared by the kubelet servers: private sockets, removal guards, dialing.

use std::os::unix::fs::MetadataExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::net::UnixListener;
use tonic::transport::{Channel, Endpoint};

use crate::error::Error;

/// A socket file this process created; removed on drop unless someone replaced it.
#[derive(Debug)]
pub(crate) struct SocketGuard {
    path: PathBuf,
    ino: u64,
}

impl SocketGuard {
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// True while the socket file on disk is still the one this guard created.
    pub(crate) fn still_ours(&self) -> bool {
        std::fs::symlink_metadata(&self.path).is_ok_and(|m| m.ino() == self.ino)
    }
}

impl Drop for SocketGuard {
    fn drop(&mut self) {
        if self.still_ours() {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// The longest path a Unix socket can be bound at or dialed: `sun_path` holds 108 bytes, the
/// last of which is the terminating NUL.
pub const MAX_SOCKET_PATH_LEN: usize = 107;

/// The shortest piece of an instance ID kept in a shortened socket name.
const MIN_INSTANCE_LEN: usize = 8;

/// The path of a socket in `dir` named `<label>[-<instance>]<suffix>`, shortened when it does not
/// fit in [`MAX_SOCKET_PATH_LEN`]: first the instance ID is cut (to no fewer than 8 characters),
/// then the label is cut and followed by a hash of the whole label, so names stay distinct per
/// label and per instance. Fails, naming the shortest path it could make, when even that is too
/// long.
pub(crate) fn fit_socket_path(
    dir: &Path,
    label: &str,
    instance: Option<&str>,
    suffix: &str,
) -> Result<PathBuf, Error> {
    let instance = instance.filter(|i| !i.is_empty());
    // The directory, and the '/' before the name.
    let room = MAX_SOCKET_PATH_LEN.saturating_sub(dir.as_os_str().len() + 1);
    let with_instance = |label: &str, instance: Option<&str>| match instance {
        Some(i) => format!("{label}-{i}{suffix}"),
        None => format!("{label}{suffix}"),
    };
    let full = with_instance(label, instance);
    if full.len() <= room {
        return Ok(dir.join(full));
    }
    if let Some(i) = instance {
        let fixed = label.len() + 1 + suffix.len();
        if let Some(keep) = room.checked_sub(fixed)
            && keep >= MIN_INSTANCE_LEN
            && keep < i.len()
        {
            let cut = prefix(i, keep).trim_end_matches('-');
            return Ok(dir.join(with_instance(label, Some(cut))));
        }
    }
    let short_instance = instance.map(|i| prefix(i, MIN_INSTANCE_LEN).trim_end_matches('-'));
    let tail = with_instance(&format!("-{:08x}", name_hash(label)), short_instance);
    let keep = room.saturating_sub(tail.len()).min(label.len()).max(1);
    let name = format!("{}{tail}", prefix(label, keep));
    let path = dir.join(name);
    let len = path.as_os_str().len();
    if len <= MAX_SOCKET_PATH_LEN {
        Ok(path)
    } else {
        Err(Error::SocketPathTooLong {
            path,
            len,
            limit: MAX_SOCKET_PATH_LEN,
        })
    }
}

/// The first `n` bytes of `s`, or fewer to end on a character boundary.
fn prefix(s: &str, n: usize) -> &str {
    let mut n = n.min(s.len());
    while !s.is_char_boundary(n) {
        n -= 1;
    }
    &s[..n]
}

/// A stable 32-bit FNV-1a hash of a name, which keeps shortened socket names of different
/// labels apart.
fn name_hash(name: &str) -> u32 {
    name.bytes().fold(0x811c_9dc5u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

/// Fails naming the path when it does not fit in a Unix socket address.
pub(crate) fn check_socket_path(path: &Path) -> Result<(), Error> {
    let len = path.as_os_str().len();
    if len > MAX_SOCKET_PATH_LEN {
        return Err(Error::SocketPathTooLong {
            path: path.to_path_buf(),
            len,
            limit: MAX_SOCKET_PATH_LEN,
        });
    }
    Ok(())
}

/// Binds a Unix socket at `path` readable and writable by the owner only (0600).
///
/// The socket is bound, restricted, and only then listened on, so no one can connect to it
/// before its mode is set (a connection to a bound socket that is not yet listening is
/// refused). No temporary name is used, so a path that fits is all it needs. A stale socket at
/// `path` (one nothing listens on any more: a crashed process's) is replaced; anything else
/// there is refused, see [`clear_stale_socket`].
pub(crate) fn bind_private(path: &Path) -> Result<(UnixListener, SocketGuard), Error> {
    use rustix::net::{AddressFamily, SocketAddrUnix, SocketFlags, SocketType};
    check_socket_path(path)?;
    let io_err = |op: &'static str| {
        let path = path.to_path_buf();
        move |error| Error::Socket {
            op,
            path: path.clone(),
            error,
        }
    };
    clear_stale_socket(path)?;
    let fd = rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::STREAM,
        SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
        None,
    )
    .map_err(|e| io_err("creating")(e.into()))?;
    let address = SocketAddrUnix::new(path).map_err(|e| io_err("naming")(e.into()))?;
    rustix::net::bind(&fd, &address).map_err(|e| io_err("binding")(e.into()))?;
    let restricted = (|| {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
        rustix::net::listen(&fd, 128)?;
        let meta = std::fs::symlink_metadata(path)?;
        let listener = UnixListener::from_std(std::os::unix::net::UnixListener::from(fd))?;
        Ok::<_, std::io::Error>((listener, meta.ino()))
    })();
    match restricted {
        Ok((listener, ino)) => Ok((
            listener,
            SocketGuard {
                path: path.to_path_buf(),
                ino,
            },
        )),
        Err(e) => {
            let _ = std::fs::remove_file(path);
            Err(io_err("listening on")(e))
        }
    }
}

/// Removes a stale socket at `path`: one nothing accepts connections on (its server is gone).
/// A regular file, directory, link or device there is refused, and so is a socket a running
/// server listens on (two daemons for one driver, or a path shared by mistake), each naming
/// what was found.
pub(crate) fn clear_stale_socket(path: &Path) -> Result<(), Error> {
    use kubedev_core::safefs::FoundKind;
    let meta = match std::fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(error) => {
            return Err(Error::Socket {
                op: "examining",
                path: path.to_path_buf(),
                error,
            });
        }
    };
    match FoundKind::of_metadata(&meta) {
        Some(FoundKind::Socket) => {}
        Some(kind) => {
            return Err(Error::SocketPathTaken {
                path: path.to_path_buf(),
                found: kind.to_string(),
                advice: "kubedev does not remove it; remove it or choose another directory",
            });
        }
        None => {
            return Err(Error::SocketPathTaken {
                path: path.to_path_buf(),
                found: format!("a regular file of {} bytes", meta.len()),
                advice: "kubedev does not remove it; remove it or choose another directory",
            });
        }
    }
    match std::os::unix::net::UnixStream::connect(path) {
        Ok(_) => {
            return Err(Error::SocketPathTaken {
                path: path.to_path_buf(),
                found: "a socket a running server listens on".into(),
                advice: "is another kubedev running for the same driver or resource? stop it first",
            });
        }
        // Nothing listens: the socket of a process that is gone.
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {}
        Err(error) => {
            return Err(Error::Socket {
                op: "probing the existing",
                path: path.to_path_buf(),
                error,
            });
        }
    }
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(error) => Err(Error::Socket {
            op: "replacing the stale",
            path: path.to_path_buf(),
            error,
        }),
    }
}

/// Opens a gRPC channel to the Unix socket at `path`, failing after `timeout`.
pub(crate) async fn dial(path: &Path, timeout: Duration) -> Result<Channel, Error> {
    let uri = format!("unix://{}", path.display());
    let endpoint = Endpoint::from_shared(uri).map_err(|e| Error::Dial {
        path: path.to_path_buf(),
        message: kubedev_core::echo::chain(&e),
    })?;
    // A peer's gRPC server may check `:authority`; name the host the way grpc-go's own `unix:`
    // targets do, instead of tonic's placeholder.
    endpoint
        .origin(http::Uri::from_static("http://localhost"))
        .connect_timeout(timeout)
        .timeout(timeout)
        .connect()
        .await
        .map_err(|e| Error::Dial {
            path: path.to_path_buf(),
            message: kubedev_core::echo::chain(&e),
        })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// A file at a socket path used to be removed silently. Only a socket nothing listens on is
    /// replaced now; everything else is refused, named, and left as it was.
    #[tokio::test]
    async fn only_a_stale_socket_is_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("file.sock");
        std::fs::write(&file, "keep me").unwrap();
        let err = bind_private(&file).unwrap_err().to_string();
        assert!(
            err.contains("a regular file of 7 bytes") && err.contains("file.sock"),
            "{err}"
        );
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "keep me");

        let sub = dir.path().join("dir.sock");
        std::fs::create_dir(&sub).unwrap();
        let err = bind_private(&sub).unwrap_err().to_string();
        assert!(err.contains("a directory"), "{err}");

        let link = dir.path().join("link.sock");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        let err = bind_private(&link).unwrap_err().to_string();
        assert!(err.contains("a symbolic link"), "{err}");
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "keep me");

        let live = dir.path().join("live.sock");
        let _server = std::os::unix::net::UnixListener::bind(&live).unwrap();
        let err = bind_private(&live).unwrap_err().to_string();
        assert!(err.contains("a running server listens"), "{err}");
        assert!(
            std::os::unix::net::UnixStream::connect(&live).is_ok(),
            "the live socket was removed"
        );
    }

    #[tokio::test]
    async fn private_socket_is_0600_and_removed_by_its_guard() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.sock");
        // The socket of a server that is gone.
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
        let (_l, guard) = bind_private(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert!(guard.still_ours());
        drop(guard);
        assert!(!path.exists());
        let leftovers: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert!(leftovers.is_empty());
    }

    /// A directory whose path is exactly `len` bytes long, under a temporary directory.
    fn dir_of_len(base: &Path, len: usize) -> PathBuf {
        let pad = len - base.as_os_str().len() - 1;
        let dir = base.join("d".repeat(pad));
        std::fs::create_dir_all(&dir).unwrap();
        assert_eq!(dir.as_os_str().len(), len);
        dir
    }

    #[tokio::test]
    async fn a_socket_path_of_exactly_the_limit_binds_and_one_more_byte_is_refused() {
        let base = tempfile::tempdir().unwrap();
        let dir = dir_of_len(base.path(), 60);
        let exact = dir.join("s".repeat(MAX_SOCKET_PATH_LEN - 61));
        assert_eq!(exact.as_os_str().len(), MAX_SOCKET_PATH_LEN);
        let (_l, guard) = bind_private(&exact).unwrap();
        // A client can reach it.
        std::os::unix::net::UnixStream::connect(&exact).unwrap();
        drop(guard);
        let over = dir.join("s".repeat(MAX_SOCKET_PATH_LEN - 60));
        let e = bind_private(&over).unwrap_err().to_string();
        assert!(e.contains(&over.display().to_string()), "{e}");
        assert!(e.contains("108 bytes") && e.contains("107 bytes"), "{e}");
    }

    #[test]
    fn fitted_names_keep_what_fits_and_stay_distinct() {
        let dir = Path::new("/var/lib/kubelet/plugins_registry");
        let uid = "0b4c6a8e-8c4f-4d7e-9d1e-3f6b2a1c9e77";
        // Everything fits: nothing is cut.
        let p = fit_socket_path(dir, "gpu.example.com", Some(uid), "-reg.sock").unwrap();
        assert_eq!(p, dir.join(format!("gpu.example.com-{uid}-reg.sock")));
        // A 63-character driver: the UID cannot keep 8 characters beside the whole name, so the
        // name is cut and a hash of it keeps it apart from others with the same beginning.
        let long_a = format!("{}.example.com", "a".repeat(51));
        let long_b = format!("{}.example.org", "a".repeat(51));
        assert_eq!(long_a.len(), 63);
        let a = fit_socket_path(dir, &long_a, Some(uid), "-reg.sock").unwrap();
        let b = fit_socket_path(dir, &long_b, Some(uid), "-reg.sock").unwrap();
        let other_pod = fit_socket_path(dir, &long_a, Some("ffff0000-aaaa"), "-reg.sock").unwrap();
        for p in [&a, &b, &other_pod] {
            assert!(
                p.as_os_str().len() <= MAX_SOCKET_PATH_LEN,
                "{}",
                p.display()
            );
            assert!(p.to_str().unwrap().ends_with("-reg.sock"));
        }
        assert_ne!(a, b);
        assert_ne!(a, other_pod);
        assert!(
            a.to_str().unwrap().contains("-0b4c6a8e-reg.sock"),
            "{}",
            a.display()
        );
        // No instance: the plain name when it fits.
        assert_eq!(
            fit_socket_path(dir, &long_a, None, "-reg.sock").unwrap(),
            dir.join(format!("{long_a}-reg.sock"))
        );
        // The UID is cut before anything else.
        let mid = fit_socket_path(dir, &"b".repeat(40), Some(uid), "-reg.sock").unwrap();
        assert_eq!(mid.as_os_str().len(), MAX_SOCKET_PATH_LEN);
        assert!(
            mid.to_str()
                .unwrap()
                .contains(&format!("{}-0b4c6a8e", "b".repeat(40)))
        );
        // A directory that leaves no room at all is an error naming the path and the limit.
        let deep = PathBuf::from(format!("/{}", "x".repeat(100)));
        let e = fit_socket_path(&deep, "gpu.example.com", Some(uid), "-reg.sock").unwrap_err();
        assert!(
            matches!(e, Error::SocketPathTooLong { limit: 107, .. }),
            "{e}"
        );
    }

    #[tokio::test]
    async fn guard_leaves_a_replaced_socket_alone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.sock");
        let (_l, guard) = bind_private(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        std::fs::write(&path, "someone else").unwrap();
        assert!(!guard.still_ours());
        drop(guard);
        assert!(path.exists());
    }
}
