//! Errors of the kubelet servers.

use std::path::PathBuf;

/// A kubelet server or client could not do its work.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Creating, binding or removing a Unix socket failed.
    #[error("{op} socket {path}: {error}")]
    Socket {
        /// What was being done.
        op: &'static str,
        /// The socket path.
        path: PathBuf,
        /// The I/O error.
        error: std::io::Error,
    },
    /// Something kubedev must not replace is where one of its sockets belongs: a file that is
    /// not a socket, or a socket a running server still listens on.
    #[error("{}: {found} is in the way of the socket kubedev serves there; {advice}", path.display())]
    SocketPathTaken {
        /// The socket path.
        path: PathBuf,
        /// What is there.
        found: String,
        /// What to do about it.
        advice: &'static str,
    },
    /// Connecting to a peer's socket failed.
    #[error("connecting to {path}: {message}")]
    Dial {
        /// The socket path.
        path: PathBuf,
        /// Why.
        message: String,
    },
    /// The kubelet refused or failed a registration.
    #[error("registering {resource} with the kubelet at {path}: {message}")]
    Register {
        /// The resource or driver name.
        resource: String,
        /// The kubelet's socket.
        path: PathBuf,
        /// The kubelet's answer.
        message: String,
    },
    /// Watching a directory for kubelet restarts failed.
    #[error("watching {path}: {error}")]
    Watch {
        /// The directory.
        path: PathBuf,
        /// The I/O error.
        error: std::io::Error,
    },
    /// A socket path does not fit in a Unix socket address, even shortened.
    #[error(
        "socket path {} is {len} bytes, longer than the {limit} bytes a Unix socket path can \
         hold; choose a shorter directory",
        path.display()
    )]
    SocketPathTooLong {
        /// The shortest path kubedev could make.
        path: PathBuf,
        /// Its length in bytes.
        len: usize,
        /// The longest path a socket can have.
        limit: usize,
    },
    /// A configuration value is invalid.
    #[error("invalid configuration: {0}")]
    Config(String),
}
