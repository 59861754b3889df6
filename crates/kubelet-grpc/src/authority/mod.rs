//! Every `:authority` a real gRPC client sends over a Unix socket, accepted.
//!
//! A gRPC client dialing a Unix socket has no host name to put in the HTTP/2 `:authority`
//! pseudo-header, and each stack fills it differently: the kubelet's plugin watcher (grpc-go,
//! dialing a socket path) sends the path percent-encoded (`%2Fvar%2Flib%2Fkubelet%2F…`), older
//! grpc-go and grpc-java send the raw path, Python's grpcio sends the percent-encoded path for
//! `unix:` targets, and clients that know better send `localhost`. The HTTP/2 server under tonic
//! parses `:authority` as a URI authority and resets the stream with `PROTOCOL_ERROR` when that
//! fails, so without help the kubelet could not even register a DRA driver.
//!
//! The fix is a property of each socket kubedev serves, not of a service: every accepted
//! connection goes through a small layer between the socket and the HTTP/2 server, applied as
//! the server reads and writes (no task or copy of its own in between). It reads the client's
//! frames, decodes each header block with an HPACK decoder that follows the client's dynamic
//! table, and passes the block on re-encoded with literals that never touch the
//! server's dynamic table, so both HPACK contexts stay consistent whatever the table sizes. An
//! `:authority` that parses as a URI authority passes unchanged; any other (a path, raw or
//! percent-encoded, or an empty value) becomes `localhost`. All other frames pass through as
//! they are. A request the server would reset for its headers (no `:path`, a connection-specific
//! header, …) is answered by the layer itself with a gRPC `INTERNAL` error that names the
//! problem (put in between whole frames of the server's), and logged at WARN, rate-limited. A client that breaks HTTP/2 framing or HPACK gets
//! a GOAWAY whose debug data says why.
//!
//! [`incoming`] puts the layer in front of a listener for tonic's `serve_with_incoming`. The
//! same machinery runs the other way, as a task between two streams, for tests: [`dial`] opens a tonic channel whose requests
//! carry exactly the `:authority` a given client stack sends ([`ClientAuthority`]), which tonic
//! itself cannot express.

mod connection;
mod frame;
mod headers;
mod hpack;
mod proxy;

use parking_lot::Mutex;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::Stream;
use hyper_util::rt::TokioIo;
use tokio::net::{UnixListener, UnixStream};
use tonic::transport::{Channel, Endpoint};

use crate::error::Error;
pub use connection::Connection;

/// Bytes buffered in each direction between a dialed socket and the HTTP/2 client.
const PIPE_BUFFER: usize = 64 * 1024;

/// The shortest time between two WARN lines about refused requests on one socket.
const WARN_INTERVAL: Duration = Duration::from_secs(10);

/// What the layer does to the `:authority` of each request.
#[derive(Debug, Clone)]
enum Policy {
    /// Serving: accept whatever clients send (see the module documentation).
    Accept,
    /// Dialing: send exactly these bytes.
    Send(Vec<u8>),
}

/// The socket a connection came in on, its WARN rate limit, and who hears of each request.
#[derive(Debug)]
struct SocketContext {
    path: String,
    warned: Mutex<WarnState>,
    observer: Option<RequestObserver>,
}

/// One request a client sent on a served socket, as it arrived: the method it called and the
/// `:authority` it sent (before any replacement).
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct RequestSeen<'a> {
    /// The socket it came in on.
    pub socket: &'a str,
    /// The gRPC method, as `:path` (`/v1.DRAPlugin/NodePrepareResources`).
    pub method: &'a str,
    /// The `:authority` as sent; `None` when the request had none.
    pub authority: Option<&'a [u8]>,
}

impl RequestSeen<'_> {
    /// Which client stack's `:authority` this is, for a label: `localhost`, `socket-path`,
    /// `escaped-socket-path`, `empty`, `none` (not sent) or `other`.
    pub fn authority_kind(&self) -> &'static str {
        let Some(sent) = self.authority else {
            return "none";
        };
        let socket = Path::new(self.socket);
        [
            ClientAuthority::Localhost,
            ClientAuthority::SocketPath,
            ClientAuthority::EscapedSocketPath,
            ClientAuthority::Empty,
        ]
        .iter()
        .find(|kind| kind.value_for(socket) == sent)
        .map_or("other", ClientAuthority::label)
    }
}

/// Called for every request a served socket passes on to its server (refused ones excluded).
#[derive(Clone)]
pub struct RequestObserver(Arc<dyn Fn(&RequestSeen<'_>) + Send + Sync>);

impl RequestObserver {
    /// An observer that calls `f` for each request.
    pub fn new(f: impl Fn(&RequestSeen<'_>) + Send + Sync + 'static) -> Self {
        RequestObserver(Arc::new(f))
    }

    fn notify(&self, seen: &RequestSeen<'_>) {
        (self.0)(seen)
    }
}

impl std::fmt::Debug for RequestObserver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RequestObserver")
    }
}

#[derive(Debug, Default)]
struct WarnState {
    last: Option<Instant>,
    suppressed: u64,
}

impl SocketContext {
    fn new(path: &Path, observer: Option<RequestObserver>) -> Arc<Self> {
        Arc::new(SocketContext {
            path: path.display().to_string(),
            warned: Mutex::default(),
            observer,
        })
    }

    /// Calls `log` with the number of warnings suppressed since the last one, unless one was
    /// logged for this socket less than [`WARN_INTERVAL`] ago.
    fn warn_limited(&self, log: impl FnOnce(u64)) {
        let mut state = self.warned.lock();
        let now = Instant::now();
        if state
            .last
            .is_some_and(|last| now.duration_since(last) < WARN_INTERVAL)
        {
            state.suppressed += 1;
            return;
        }
        let suppressed = std::mem::take(&mut state.suppressed);
        state.last = Some(now);
        drop(state);
        log(suppressed);
    }
}

/// The connections accepted on `listener` (bound at `socket`), each behind its own layer that
/// accepts any `:authority`, for tonic's `serve_with_incoming`. Every kubedev server uses it; so
/// do the testkit's emulators of servers that accept any authority (the kubelet's grpc-go).
pub fn incoming(
    listener: UnixListener,
    socket: &Path,
) -> impl Stream<Item = std::io::Result<Connection>> + Send + 'static {
    incoming_observed(listener, socket, None)
}

/// [`incoming`], telling `observer` (when there is one) of every request passed on.
pub fn incoming_observed(
    listener: UnixListener,
    socket: &Path,
    observer: Option<RequestObserver>,
) -> impl Stream<Item = std::io::Result<Connection>> + Send + 'static {
    let context = SocketContext::new(socket, observer);
    futures::stream::unfold(listener, move |listener| {
        let context = context.clone();
        async move {
            let accepted = listener
                .accept()
                .await
                .map(|(stream, _)| Connection::new(stream, context));
            Some((accepted, listener))
        }
    })
}

/// The `:authority` a client stack sends when it dials a Unix socket.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ClientAuthority {
    /// `localhost`: grpc-go's `unix:` targets and `WithAuthority("localhost")`.
    Localhost,
    /// The socket path as it is: grpc-go before 1.52 and grpc-java, dialing a path.
    SocketPath,
    /// The socket path percent-encoded as a URI authority (`/` as `%2F`): grpc-go from 1.52 on
    /// dialing a path, and Python's grpcio for `unix:` targets.
    EscapedSocketPath,
    /// An empty `:authority`.
    Empty,
    /// Exactly this value.
    Value(String),
}

impl ClientAuthority {
    /// A short name for the kind: `localhost`, `socket-path`, `escaped-socket-path`, `empty`,
    /// or `other` for a fixed value ([`RequestSeen::authority_kind`] uses the same names).
    pub fn label(&self) -> &'static str {
        match self {
            ClientAuthority::Localhost => "localhost",
            ClientAuthority::SocketPath => "socket-path",
            ClientAuthority::EscapedSocketPath => "escaped-socket-path",
            ClientAuthority::Empty => "empty",
            ClientAuthority::Value(_) => "other",
        }
    }

    /// The bytes this client puts in `:authority` when it dials `socket`.
    pub fn value_for(&self, socket: &Path) -> Vec<u8> {
        use std::os::unix::ffi::OsStrExt;
        let path = socket.as_os_str().as_bytes();
        match self {
            ClientAuthority::Localhost => b"localhost".to_vec(),
            ClientAuthority::SocketPath => path.to_vec(),
            ClientAuthority::EscapedSocketPath => escape_authority(path),
            ClientAuthority::Empty => Vec::new(),
            ClientAuthority::Value(v) => v.as_bytes().to_vec(),
        }
    }
}

/// Percent-encodes every byte a URI authority cannot hold as it is (RFC 3986 §3.2: unreserved
/// characters, sub-delimiters and `:`, `[`, `]`, `@` stay).
fn escape_authority(raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(raw.len() * 2);
    for &b in raw {
        if b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=:[]@".contains(&b) {
            out.push(b);
        } else {
            out.extend_from_slice(format!("%{b:02X}").as_bytes());
        }
    }
    out
}

/// Opens a gRPC channel to the Unix socket at `socket` whose requests carry exactly the
/// `:authority` that `authority` names, as that client stack would send it; fails after
/// `timeout` when nothing answers.
pub async fn dial(
    socket: &Path,
    authority: ClientAuthority,
    timeout: Duration,
) -> Result<Channel, Error> {
    let value = authority.value_for(socket);
    let path: PathBuf = socket.to_path_buf();
    let dial_error = |message: String| Error::Dial {
        path: socket.to_path_buf(),
        message,
    };
    // The URI only names the channel; the connector below decides where it goes.
    let endpoint = Endpoint::from_static("http://localhost")
        .connect_timeout(timeout)
        .timeout(timeout);
    let context = SocketContext::new(socket, None);
    endpoint
        .connect_with_connector(tower::service_fn(move |_: http::Uri| {
            let path = path.clone();
            let value = value.clone();
            let context = context.clone();
            async move {
                let stream = UnixStream::connect(&path).await?;
                let (client_end, proxy_end) = tokio::io::duplex(PIPE_BUFFER);
                tokio::spawn(proxy::dialing(
                    proxy_end,
                    stream,
                    Policy::Send(value),
                    context,
                ));
                Ok::<_, std::io::Error>(TokioIo::new(client_end))
            }
        }))
        .await
        .map_err(|e| dial_error(kubedev_core::echo::chain(&e)))
}

#[cfg(test)]
mod tests;
