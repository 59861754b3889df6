//! Unix-socket plumbing shared by the kubelet servers: private sockets, removal guards, dialing.

use std::os::unix::fs::MetadataExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::net::UnixListener;
use tonic::transport::{Channel, Endpoint};

use crate::Error;

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

/// Binds a Unix socket at `path` readable and writable by the owner only (0600).
///
/// The socket is bound under a temporary name, restricted, then renamed into place, so no one
/// can connect to it before its mode is set. A stale file at `path` is replaced.
pub(crate) fn bind_private(path: &Path) -> Result<(UnixListener, SocketGuard), Error> {
    let io_err = |op: &'static str| {
        let path = path.to_path_buf();
        move |error| Error::Socket {
            op,
            path: path.clone(),
            error,
        }
    };
    let dir = path.parent().unwrap_or(Path::new("."));
    let file = path
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{file}.{}.tmp", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let listener = UnixListener::bind(&tmp).map_err(io_err("binding"))?;
    let result = (|| {
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))?;
        std::fs::rename(&tmp, path)?;
        std::fs::symlink_metadata(path)
    })();
    match result {
        Ok(meta) => Ok((
            listener,
            SocketGuard {
                path: path.to_path_buf(),
                ino: meta.ino(),
            },
        )),
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(io_err("creating")(e))
        }
    }
}

/// Opens a gRPC channel to the Unix socket at `path`, failing after `timeout`.
pub(crate) async fn dial(path: &Path, timeout: Duration) -> Result<Channel, Error> {
    let uri = format!("unix://{}", path.display());
    let endpoint = Endpoint::from_shared(uri).map_err(|e| Error::Dial {
        path: path.to_path_buf(),
        message: e.to_string(),
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
            message: error_chain(&e),
        })
}

/// Renders an error with its sources, for messages that travel to logs.
pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(src) = cur {
        let m = src.to_string();
        if !s.contains(&m) {
            s.push_str(": ");
            s.push_str(&m);
        }
        cur = src.source();
    }
    s
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn private_socket_is_0600_and_removed_by_its_guard() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.sock");
        std::fs::write(&path, "stale").unwrap();
        let (_l, guard) = bind_private(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert!(guard.still_ours());
        drop(guard);
        assert!(!path.exists());
        let leftovers: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert!(leftovers.is_empty());
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
