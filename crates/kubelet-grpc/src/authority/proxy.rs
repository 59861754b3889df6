//! The two directions of one proxied connection: requests from the client, parsed frame by
//! frame with their header blocks decoded and re-encoded, and responses from the server, passed
//! through with the frames the layer answers with itself put in between whole frames.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

use super::frame::{self, Head, code};
use super::headers::{self, Verdict};
use super::{Policy, SocketContext};

/// The largest header block (all fragments of one HEADERS and its CONTINUATIONs) accepted; far
/// above anything a kubelet sends, and bounding what one request can make the layer buffer.
const MAX_HEADER_BLOCK: usize = 256 * 1024;

/// How many refused streams are remembered, to drop the frames a client sends on them before it
/// sees the refusal.
const MAX_REFUSED_REMEMBERED: usize = 256;

/// The initial HPACK dynamic table size (RFC 7541 §4.2, `SETTINGS_HEADER_TABLE_SIZE` default).
const DEFAULT_TABLE_SIZE: usize = 4096;

/// A reason to end the whole connection: the client broke HTTP/2 framing or HPACK, after which
/// no later header block can be read.
#[derive(Debug)]
struct Fatal {
    code: u32,
    message: String,
}

fn fatal(code: u32, message: impl Into<String>) -> Fatal {
    Fatal {
        code,
        message: message.into(),
    }
}

/// What the request direction stopped on.
enum Stop {
    /// The client closed its side (or sent something that is not HTTP/2, copied through).
    Closed,
    Fatal(Fatal),
    Io(std::io::Error),
}

impl From<std::io::Error> for Stop {
    fn from(e: std::io::Error) -> Self {
        Stop::Io(e)
    }
}

impl From<Fatal> for Stop {
    fn from(f: Fatal) -> Self {
        Stop::Fatal(f)
    }
}

/// Runs one connection between `client` (the peer that sends requests) and `server` until both
/// sides are done.
pub(super) async fn run<C, S>(client: C, server: S, policy: Policy, socket: Arc<SocketContext>)
where
    C: AsyncRead + AsyncWrite + Send + 'static,
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let (client_rd, client_wr) = tokio::io::split(client);
    let (server_rd, server_wr) = tokio::io::split(server);
    // Frames the layer answers with; bounded, so a client that floods bad requests while not
    // reading its answers is slowed down instead of growing this queue.
    let (inject, injected) = mpsc::channel::<Vec<u8>>(32);
    let table_limit = Arc::new(AtomicUsize::new(DEFAULT_TABLE_SIZE));
    let requests = Requests {
        reader: client_rd,
        writer: server_wr,
        decoder: loona_hpack::Decoder::new(),
        policy,
        socket: socket.clone(),
        inject,
        table_limit: table_limit.clone(),
        last_request: 0,
        refused: BTreeSet::new(),
        logged_authority: None,
    };
    let responses = responses(server_rd, client_wr, injected, table_limit);
    tokio::pin!(responses);
    let requests = requests.run();
    tokio::pin!(requests);
    tokio::select! {
        () = &mut requests => {
            // The server sees the end of the requests and finishes its answers.
            if let Err(e) = (&mut responses).await {
                tracing::debug!(socket = %socket.path, error = %kubedev_core::echo::Chain(&e), "connection ended");
            }
        }
        r = &mut responses => {
            if let Err(e) = r {
                tracing::debug!(socket = %socket.path, error = %kubedev_core::echo::Chain(&e), "connection ended");
            }
        }
    }
}

struct Requests<R, W> {
    reader: R,
    writer: W,
    decoder: loona_hpack::Decoder<'static>,
    policy: Policy,
    socket: Arc<SocketContext>,
    inject: mpsc::Sender<Vec<u8>>,
    table_limit: Arc<AtomicUsize>,
    /// The highest client-initiated stream a request was seen on.
    last_request: u32,
    /// Streams answered by the layer itself; the server never heard of them.
    refused: BTreeSet<u32>,
    logged_authority: Option<Vec<u8>>,
}

impl<R, W> Requests<R, W>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    async fn run(mut self) {
        match self.frames().await {
            Ok(()) | Err(Stop::Closed) => {}
            Err(Stop::Io(e)) => {
                tracing::debug!(socket = %self.socket.path, error = %kubedev_core::echo::Chain(&e), "reading a request failed");
            }
            Err(Stop::Fatal(f)) => {
                self.socket.warn_limited(|suppressed| {
                    tracing::warn!(
                        socket = %self.socket.path,
                        reason = %f.message,
                        suppressed,
                        "closed a gRPC connection that broke HTTP/2"
                    );
                });
                if matches!(self.policy, Policy::Accept) {
                    let mut out = Vec::new();
                    frame::write_goaway(self.last_request, f.code, &f.message, &mut out);
                    let _ = self.inject.send(out).await;
                }
            }
        }
        let _ = self.writer.shutdown().await;
    }

    /// Checks the connection preface; a client that does not send one is not speaking HTTP/2
    /// with prior knowledge, and its bytes are copied through for the server to answer.
    async fn preface(&mut self) -> Result<bool, Stop> {
        let mut got = Vec::with_capacity(frame::PREFACE.len());
        while got.len() < frame::PREFACE.len() {
            let mut byte = [0u8; 1];
            let n = self.reader.read(&mut byte).await?;
            if n == 0 {
                self.writer.write_all(&got).await?;
                return Err(Stop::Closed);
            }
            got.push(byte[0]);
            if !frame::PREFACE.starts_with(&got) {
                self.writer.write_all(&got).await?;
                tokio::io::copy(&mut self.reader, &mut self.writer).await?;
                return Ok(false);
            }
        }
        self.writer.write_all(&got).await?;
        Ok(true)
    }

    async fn frames(&mut self) -> Result<(), Stop> {
        if !self.preface().await? {
            return Ok(());
        }
        loop {
            let head = match self.read_head().await {
                Ok(h) => h,
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
                Err(e) => return Err(e.into()),
            };
            match head.kind {
                frame::HEADERS => self.header_block(head).await?,
                frame::CONTINUATION => {
                    return Err(fatal(
                        code::PROTOCOL_ERROR,
                        format!(
                            "CONTINUATION frame on stream {} without a HEADERS frame before it",
                            head.stream
                        ),
                    )
                    .into());
                }
                frame::DATA if self.refused.contains(&head.stream) => {
                    self.discard(head.len).await?;
                    if head.has(frame::FLAG_END_STREAM) {
                        self.refused.remove(&head.stream);
                    }
                    if head.len > 0 {
                        // The server never sees these bytes, so it would never give the
                        // connection's flow-control window back for them.
                        let mut out = Vec::new();
                        frame::write_window_update(0, head.len as u32, &mut out);
                        self.send_to_client(out).await?;
                    }
                }
                frame::RST_STREAM | frame::WINDOW_UPDATE | frame::PRIORITY
                    if self.refused.contains(&head.stream) =>
                {
                    self.discard(head.len).await?;
                    if head.kind == frame::RST_STREAM {
                        self.refused.remove(&head.stream);
                    }
                }
                _ => {
                    let mut h = Vec::with_capacity(frame::HEAD_LEN);
                    head.write(&mut h);
                    self.writer.write_all(&h).await?;
                    let mut payload = (&mut self.reader).take(head.len as u64);
                    let copied = tokio::io::copy(&mut payload, &mut self.writer).await?;
                    if copied < head.len as u64 {
                        return Err(Stop::Closed);
                    }
                }
            }
        }
    }

    async fn read_head(&mut self) -> std::io::Result<Head> {
        let mut b = [0u8; frame::HEAD_LEN];
        self.reader.read_exact(&mut b).await?;
        Ok(Head::parse(&b))
    }

    async fn read_payload(&mut self, len: usize, into: &mut Vec<u8>) -> std::io::Result<()> {
        let start = into.len();
        into.resize(start + len, 0);
        self.reader.read_exact(&mut into[start..]).await?;
        Ok(())
    }

    async fn discard(&mut self, len: usize) -> std::io::Result<()> {
        let mut payload = (&mut self.reader).take(len as u64);
        tokio::io::copy(&mut payload, &mut tokio::io::sink()).await?;
        Ok(())
    }

    async fn send_to_client(&mut self, frames: Vec<u8>) -> Result<(), Stop> {
        match self.policy {
            Policy::Accept => self.inject.send(frames).await.map_err(|_| Stop::Closed),
            // A dialing client never answers for the server.
            Policy::Send(_) => Ok(()),
        }
    }

    /// Reads one header block (HEADERS and its CONTINUATIONs), decodes it, and passes it on
    /// re-encoded, or answers it.
    async fn header_block(&mut self, head: Head) -> Result<(), Stop> {
        if head.len > MAX_HEADER_BLOCK {
            return Err(too_large().into());
        }
        let mut payload = Vec::new();
        self.read_payload(head.len, &mut payload).await?;
        let (priority, fragment) = frame::split_headers_payload(&head, &payload)
            .map_err(|m| fatal(code::PROTOCOL_ERROR, m))?;
        let mut block = payload[fragment].to_vec();
        let mut end_headers = head.has(frame::FLAG_END_HEADERS);
        while !end_headers {
            let next = self.read_head().await?;
            if next.kind != frame::CONTINUATION || next.stream != head.stream {
                return Err(fatal(
                    code::PROTOCOL_ERROR,
                    format!(
                        "expected a CONTINUATION frame on stream {}, got a frame of type {} on stream {}",
                        head.stream, next.kind, next.stream
                    ),
                )
                .into());
            }
            if block.len() + next.len > MAX_HEADER_BLOCK {
                return Err(too_large().into());
            }
            self.read_payload(next.len, &mut block).await?;
            end_headers = next.has(frame::FLAG_END_HEADERS);
        }
        if matches!(self.policy, Policy::Accept) {
            self.decoder
                .set_max_allowed_table_size(self.table_limit.load(Ordering::Relaxed));
        }
        let mut list = self.decoder.decode(&block).map_err(|e| {
            fatal(
                code::COMPRESSION_ERROR,
                format!(
                    "a header block on stream {} does not decode: {e}",
                    head.stream
                ),
            )
        })?;
        let stream = head.stream;
        let end_stream = head.has(frame::FLAG_END_STREAM);
        if self.refused.contains(&stream) {
            // Trailers of a request already answered: read for the HPACK state, then dropped.
            if end_stream {
                self.refused.remove(&stream);
            }
            return Ok(());
        }
        let is_request = stream % 2 == 1 && stream > self.last_request;
        if is_request {
            self.last_request = stream;
            match &self.policy {
                Policy::Send(value) => headers::set_authority(&mut list, value),
                Policy::Accept => match headers::accept_request(list) {
                    Verdict::Forward {
                        headers,
                        authority,
                        replaced,
                    } => {
                        self.note_authority(authority, replaced);
                        list = headers;
                    }
                    Verdict::Refuse(reason) => {
                        return self.refuse(stream, end_stream, reason).await;
                    }
                },
            }
        }
        let mut out = Vec::with_capacity(block.len() + 64);
        frame::write_header_block(
            stream,
            end_stream,
            priority,
            &headers::encode(&list),
            &mut out,
        );
        self.writer.write_all(&out).await?;
        Ok(())
    }

    /// Logs, at debug level, each new `:authority` a connection's client sends.
    fn note_authority(&mut self, authority: Option<Vec<u8>>, replaced: bool) {
        let sent = authority.unwrap_or_default();
        if self.logged_authority.as_ref() == Some(&sent) {
            return;
        }
        tracing::debug!(
            socket = %self.socket.path,
            authority = %sent.escape_ascii(),
            replaced_with = if replaced {
                std::str::from_utf8(headers::REPLACEMENT_AUTHORITY).unwrap_or_default()
            } else {
                ""
            },
            "client :authority"
        );
        self.logged_authority = Some(sent);
    }

    /// Answers a request the server would reset with a gRPC error, and asks the client to stop
    /// sending on that stream.
    async fn refuse(&mut self, stream: u32, end_stream: bool, reason: String) -> Result<(), Stop> {
        self.socket.warn_limited(|suppressed| {
            tracing::warn!(
                socket = %self.socket.path,
                stream,
                reason = %reason,
                suppressed,
                "refused a gRPC request with malformed headers"
            );
        });
        let message = format!("malformed request headers: {reason}");
        let mut out = Vec::new();
        frame::write_header_block(
            stream,
            true,
            None,
            &headers::encode(&headers::grpc_error(&message)),
            &mut out,
        );
        if !end_stream {
            frame::write_rst_stream(stream, code::NO_ERROR, &mut out);
            self.refused.insert(stream);
            while self.refused.len() > MAX_REFUSED_REMEMBERED {
                self.refused.pop_first();
            }
        }
        self.send_to_client(out).await
    }
}

fn too_large() -> Fatal {
    fatal(
        code::ENHANCE_YOUR_CALM,
        format!("a header block is larger than {MAX_HEADER_BLOCK} bytes"),
    )
}

/// The response direction: copies the server's bytes to the client, keeping track of frame
/// boundaries so the layer's own frames go in between whole frames (never inside a header
/// block), and noting the server's `SETTINGS_HEADER_TABLE_SIZE` for the request decoder.
async fn responses<R, W>(
    mut server: R,
    mut client: W,
    mut injected: mpsc::Receiver<Vec<u8>>,
    table_limit: Arc<AtomicUsize>,
) -> std::io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = BytesMut::with_capacity(32 * 1024);
    // Payload bytes of the current frame not yet passed on.
    let mut remaining = 0usize;
    // Inside a header block that continues in CONTINUATION frames.
    let mut in_block = false;
    // The server's connection preface (its first SETTINGS) must reach the client first.
    let mut started = false;
    // The payload of a SETTINGS frame being read, to find the header table size.
    let mut settings: Option<Vec<u8>> = None;
    let mut out = Vec::with_capacity(32 * 1024);
    let mut open = true;
    loop {
        out.clear();
        loop {
            if remaining > 0 {
                if buf.is_empty() {
                    break;
                }
                let n = remaining.min(buf.len());
                if let Some(s) = settings.as_mut() {
                    s.extend_from_slice(&buf[..n]);
                }
                out.extend_from_slice(&buf[..n]);
                buf.advance(n);
                remaining -= n;
                if remaining == 0
                    && let Some(s) = settings.take()
                {
                    for size in frame::header_table_sizes(&s) {
                        table_limit.fetch_max(size, Ordering::Relaxed);
                    }
                }
                continue;
            }
            if buf.len() < frame::HEAD_LEN {
                break;
            }
            let mut hb = [0u8; frame::HEAD_LEN];
            hb.copy_from_slice(&buf[..frame::HEAD_LEN]);
            let head = Head::parse(&hb);
            match head.kind {
                frame::HEADERS | frame::PUSH_PROMISE | frame::CONTINUATION => {
                    in_block = !head.has(frame::FLAG_END_HEADERS);
                }
                frame::SETTINGS if !head.has(frame::FLAG_ACK) && head.len <= 6 * 64 => {
                    settings = Some(Vec::with_capacity(head.len));
                }
                _ => {}
            }
            started = true;
            out.extend_from_slice(&buf[..frame::HEAD_LEN]);
            buf.advance(frame::HEAD_LEN);
            remaining = head.len;
        }
        let at_boundary = started && remaining == 0 && !in_block;
        if at_boundary {
            while let Ok(frames) = injected.try_recv() {
                out.extend_from_slice(&frames);
            }
        }
        if !out.is_empty() {
            client.write_all(&out).await?;
            client.flush().await?;
        }
        if !open {
            break;
        }
        tokio::select! {
            read = server.read_buf(&mut buf) => {
                if read? == 0 {
                    open = false;
                }
            }
            Some(frames) = injected.recv(), if at_boundary => {
                client.write_all(&frames).await?;
                client.flush().await?;
            }
        }
    }
    client.shutdown().await
}
