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
use super::hpack;
use super::{Policy, SocketContext};

/// The largest header block (all fragments of one HEADERS and its CONTINUATIONs) accepted; far
/// above anything a kubelet sends, and bounding what one request can make the layer buffer.
const MAX_HEADER_BLOCK: usize = 256 * 1024;

/// How many refused streams are remembered, to drop the frames a client sends on them before it
/// sees the refusal.
const MAX_REFUSED_REMEMBERED: usize = 256;

/// Room made in the request buffer before each read from the client.
const READ_CHUNK: usize = 16 * 1024;

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
    let table_limit = Arc::new(AtomicUsize::new(hpack::DEFAULT_TABLE_SIZE));
    let requests = Requests {
        reader: client_rd,
        writer: server_wr,
        decoder: hpack::Decoder::default(),
        policy,
        socket: socket.clone(),
        inject,
        table_limit: table_limit.clone(),
        last_request: 0,
        refused: BTreeSet::new(),
        logged_authority: None,
        buf: BytesMut::with_capacity(READ_CHUNK),
        out: Vec::with_capacity(READ_CHUNK),
        passing: 0,
        dropping: false,
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
    decoder: hpack::Decoder,
    policy: Policy,
    socket: Arc<SocketContext>,
    inject: mpsc::Sender<Vec<u8>>,
    table_limit: Arc<AtomicUsize>,
    /// The highest client-initiated stream a request was seen on.
    last_request: u32,
    /// Streams answered by the layer itself; the server never heard of them.
    refused: BTreeSet<u32>,
    logged_authority: Option<Vec<u8>>,
    /// Bytes read from the client and not handled yet.
    buf: BytesMut,
    /// Bytes for the server, written after each read's frames are handled.
    out: Vec<u8>,
    /// Payload bytes of the current frame still to come, passed on as they arrive...
    passing: usize,
    /// ... or thrown away (a frame on a stream the layer refused).
    dropping: bool,
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

    /// Reads more of the client's bytes into the buffer; `false` at the end of its stream.
    async fn fill(&mut self) -> std::io::Result<bool> {
        self.buf.reserve(READ_CHUNK);
        Ok(self.reader.read_buf(&mut self.buf).await? != 0)
    }

    /// Passes on what [`Requests::handled`] left for the server, in one write.
    async fn write_out(&mut self) -> std::io::Result<()> {
        if !self.out.is_empty() {
            self.writer.write_all(&self.out).await?;
            self.out.clear();
        }
        Ok(())
    }

    /// Checks the connection preface; a client that does not send one is not speaking HTTP/2
    /// with prior knowledge, and its bytes are copied through for the server to answer.
    async fn preface(&mut self) -> Result<bool, Stop> {
        loop {
            let n = self.buf.len().min(frame::PREFACE.len());
            if !frame::PREFACE.starts_with(&self.buf[..n]) {
                self.writer.write_all(&self.buf).await?;
                self.buf.clear();
                tokio::io::copy(&mut self.reader, &mut self.writer).await?;
                return Ok(false);
            }
            if n == frame::PREFACE.len() {
                self.out.extend_from_slice(&self.buf.split_to(n));
                return Ok(true);
            }
            if !self.fill().await? {
                self.writer.write_all(&self.buf).await?;
                return Err(Stop::Closed);
            }
        }
    }

    /// Handles the client's frames as they arrive: whatever one read brings is handled and
    /// passed on in one write, so a request's HEADERS and DATA cost the server one wake-up.
    async fn frames(&mut self) -> Result<(), Stop> {
        if !self.preface().await? {
            return Ok(());
        }
        loop {
            // What came before a frame that ends the connection still reaches the server, as
            // the GOAWAY's last stream says.
            let handled = self.handled().await;
            self.write_out().await?;
            handled?;
            if !self.fill().await? {
                // The end at a frame boundary is the client closing; inside a frame, a cut.
                return if self.buf.is_empty() && self.passing == 0 {
                    Ok(())
                } else {
                    Err(Stop::Closed)
                };
            }
        }
    }

    /// Handles every whole frame in the buffer (and the part of a passed-through payload that
    /// is there), leaving a frame head or header block that is not complete yet.
    async fn handled(&mut self) -> Result<(), Stop> {
        loop {
            if self.passing > 0 {
                if self.buf.is_empty() {
                    return Ok(());
                }
                let n = self.passing.min(self.buf.len());
                let chunk = self.buf.split_to(n);
                if !self.dropping {
                    self.out.extend_from_slice(&chunk);
                }
                self.passing -= n;
                continue;
            }
            let Some(head) = self.buffered_head(0) else {
                return Ok(());
            };
            match head.kind {
                frame::HEADERS => {
                    let Some(end) = self.buffered_block(&head)? else {
                        return Ok(());
                    };
                    let frames = self.buf.split_to(end);
                    self.header_block(head, &frames).await?;
                }
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
                    self.skip(&head, true);
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
                    self.skip(&head, true);
                    if head.kind == frame::RST_STREAM {
                        self.refused.remove(&head.stream);
                    }
                }
                _ => {
                    self.out.extend_from_slice(&self.buf[..frame::HEAD_LEN]);
                    self.skip(&head, false);
                }
            }
        }
    }

    /// The head of the frame at `at` in the buffer, when all of it is there.
    fn buffered_head(&self, at: usize) -> Option<Head> {
        let bytes = self.buf.get(at..at + frame::HEAD_LEN)?;
        let mut b = [0u8; frame::HEAD_LEN];
        b.copy_from_slice(bytes);
        Some(Head::parse(&b))
    }

    /// Takes the buffered frame `head` off the buffer, its payload passed on as it arrives
    /// (`drop`: thrown away).
    fn skip(&mut self, head: &Head, drop: bool) {
        self.buf.advance(frame::HEAD_LEN);
        self.passing = head.len;
        self.dropping = drop;
    }

    /// Where the header block starting with HEADERS frame `head` (at the start of the buffer)
    /// ends, once all its frames are buffered; refuses a block over [`MAX_HEADER_BLOCK`] as
    /// soon as a frame head shows it, and a block interrupted by another frame.
    fn buffered_block(&self, head: &Head) -> Result<Option<usize>, Fatal> {
        if head.len > MAX_HEADER_BLOCK {
            return Err(too_large());
        }
        let mut end = frame::HEAD_LEN + head.len;
        if self.buf.len() < end {
            return Ok(None);
        }
        // The fragment's length, as the limit counts it (without padding and priority).
        let (_, fragment) = frame::split_headers_payload(head, &self.buf[frame::HEAD_LEN..end])
            .map_err(|m| fatal(code::PROTOCOL_ERROR, m))?;
        let mut block_len = fragment.len();
        let mut end_headers = head.has(frame::FLAG_END_HEADERS);
        while !end_headers {
            let Some(next) = self.buffered_head(end) else {
                return Ok(None);
            };
            if next.kind != frame::CONTINUATION || next.stream != head.stream {
                return Err(fatal(
                    code::PROTOCOL_ERROR,
                    format!(
                        "expected a CONTINUATION frame on stream {}, got a frame of type {} on stream {}",
                        head.stream, next.kind, next.stream
                    ),
                ));
            }
            if block_len + next.len > MAX_HEADER_BLOCK {
                return Err(too_large());
            }
            block_len += next.len;
            end += frame::HEAD_LEN + next.len;
            if self.buf.len() < end {
                return Ok(None);
            }
            end_headers = next.has(frame::FLAG_END_HEADERS);
        }
        Ok(Some(end))
    }

    async fn send_to_client(&mut self, frames: Vec<u8>) -> Result<(), Stop> {
        match self.policy {
            Policy::Accept => self.inject.send(frames).await.map_err(|_| Stop::Closed),
            // A dialing client never answers for the server.
            Policy::Send(_) => Ok(()),
        }
    }

    /// Decodes one buffered header block (`frames`: HEADERS `head` and its CONTINUATIONs,
    /// checked by [`Requests::buffered_block`]) and passes it on re-encoded, or answers it.
    async fn header_block(&mut self, head: Head, frames: &[u8]) -> Result<(), Stop> {
        let first = &frames[frame::HEAD_LEN..frame::HEAD_LEN + head.len];
        let (priority, fragment) = frame::split_headers_payload(&head, first)
            .map_err(|m| fatal(code::PROTOCOL_ERROR, m))?;
        let mut block = first[fragment].to_vec();
        let mut at = frame::HEAD_LEN + head.len;
        while at < frames.len() {
            let mut b = [0u8; frame::HEAD_LEN];
            b.copy_from_slice(&frames[at..at + frame::HEAD_LEN]);
            let next = Head::parse(&b);
            at += frame::HEAD_LEN;
            block.extend_from_slice(&frames[at..at + next.len]);
            at += next.len;
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
        frame::write_header_block(
            stream,
            end_stream,
            priority,
            &headers::encode(&list),
            &mut self.out,
        );
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
