//! The two directions of one connection behind the layer: requests from the client, parsed
//! frame by frame with their header blocks decoded and re-encoded ([`RequestFilter`]), and
//! responses from the server, passed on with the frames the layer answers with itself put in
//! between whole frames ([`ResponseTracker`]). Both are free of I/O: a serving connection drives
//! them inline from the HTTP/2 server's reads and writes (`super::Connection`), a dialing one
//! from a task between two streams ([`dialing`]).

use std::collections::BTreeSet;
use std::sync::Arc;

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

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

/// Room made in a read buffer before each read.
pub(super) const READ_CHUNK: usize = 16 * 1024;

/// A reason to end the whole connection: the client broke HTTP/2 framing or HPACK, after which
/// no later header block can be read.
#[derive(Debug)]
pub(super) struct Fatal {
    code: u32,
    message: String,
}

fn fatal(code: u32, message: impl Into<String>) -> Fatal {
    Fatal {
        code,
        message: message.into(),
    }
}

/// Where the client's bytes are in the connection preface.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Preface {
    /// Not all of it read yet.
    Pending,
    /// Read: frames follow.
    Frames,
    /// The client sent something else: it does not speak HTTP/2 with prior knowledge, and its
    /// bytes go to the server as they are, for the server to answer.
    Passthrough,
}

/// The request direction of one connection, free of I/O: takes the client's bytes as they are
/// read, leaves what the server is to read in `out`, and the frames the layer answers with
/// itself in `inject`.
pub(super) struct RequestFilter {
    decoder: hpack::Decoder,
    policy: Policy,
    socket: Arc<SocketContext>,
    /// The largest HPACK table size the server has allowed in its SETTINGS.
    table_limit: usize,
    /// The highest client-initiated stream a request was seen on.
    last_request: u32,
    /// Streams answered by the layer itself; the server never heard of them.
    refused: BTreeSet<u32>,
    logged_authority: Option<Vec<u8>>,
    preface: Preface,
    /// Payload bytes of the current frame still to come, passed on as they arrive...
    passing: usize,
    /// ... or thrown away (a frame on a stream the layer refused).
    dropping: bool,
    /// Bytes for the server.
    pub(super) out: Vec<u8>,
    /// Frames for the client (serving only), to go between whole frames of the server's.
    pub(super) inject: Vec<u8>,
}

impl RequestFilter {
    pub(super) fn new(policy: Policy, socket: Arc<SocketContext>) -> Self {
        RequestFilter {
            decoder: hpack::Decoder::default(),
            policy,
            socket,
            table_limit: hpack::DEFAULT_TABLE_SIZE,
            last_request: 0,
            refused: BTreeSet::new(),
            logged_authority: None,
            preface: Preface::Pending,
            passing: 0,
            dropping: false,
            out: Vec::with_capacity(READ_CHUNK),
            inject: Vec::new(),
        }
    }

    /// The path of the socket the connection came in on.
    pub(super) fn socket_path(&self) -> &str {
        &self.socket.path
    }

    /// Notes a header table size the server allowed in its SETTINGS.
    pub(super) fn allow_table_size(&mut self, size: usize) {
        self.table_limit = self.table_limit.max(size);
    }

    /// Handles every whole frame in `buf` (and the part of a passed-through payload that is
    /// there), leaving a frame head or header block that is not complete yet. What came before
    /// a frame that ends the connection is in `out` when this fails, as the GOAWAY's last
    /// stream says.
    pub(super) fn handle(&mut self, buf: &mut BytesMut) -> Result<(), Fatal> {
        match self.preface {
            Preface::Passthrough => {
                self.out.extend_from_slice(buf);
                buf.clear();
                return Ok(());
            }
            Preface::Pending => {
                let n = buf.len().min(frame::PREFACE.len());
                if !frame::PREFACE.starts_with(&buf[..n]) {
                    self.preface = Preface::Passthrough;
                    return self.handle(buf);
                }
                if n < frame::PREFACE.len() {
                    return Ok(());
                }
                self.out.extend_from_slice(&buf.split_to(n));
                self.preface = Preface::Frames;
            }
            Preface::Frames => {}
        }
        loop {
            if self.passing > 0 {
                if buf.is_empty() {
                    return Ok(());
                }
                let n = self.passing.min(buf.len());
                let chunk = buf.split_to(n);
                if !self.dropping {
                    self.out.extend_from_slice(&chunk);
                }
                self.passing -= n;
                continue;
            }
            let Some(head) = buffered_head(buf, 0) else {
                return Ok(());
            };
            match head.kind {
                frame::HEADERS => {
                    let Some(end) = buffered_block(buf, &head)? else {
                        return Ok(());
                    };
                    let frames = buf.split_to(end);
                    self.header_block(head, &frames)?;
                }
                frame::CONTINUATION => {
                    return Err(fatal(
                        code::PROTOCOL_ERROR,
                        format!(
                            "CONTINUATION frame on stream {} without a HEADERS frame before it",
                            head.stream
                        ),
                    ));
                }
                frame::DATA if self.refused.contains(&head.stream) => {
                    self.skip(buf, &head, true);
                    if head.has(frame::FLAG_END_STREAM) {
                        self.refused.remove(&head.stream);
                    }
                    if head.len > 0 {
                        // The server never sees these bytes, so it would never give the
                        // connection's flow-control window back for them.
                        frame::write_window_update(0, head.len as u32, &mut self.inject);
                    }
                }
                frame::RST_STREAM | frame::WINDOW_UPDATE | frame::PRIORITY
                    if self.refused.contains(&head.stream) =>
                {
                    self.skip(buf, &head, true);
                    if head.kind == frame::RST_STREAM {
                        self.refused.remove(&head.stream);
                    }
                }
                _ => {
                    self.out.extend_from_slice(&buf[..frame::HEAD_LEN]);
                    self.skip(buf, &head, false);
                }
            }
        }
    }

    /// At the end of the client's bytes: a preface cut short goes to the server as it is, for
    /// the server to answer; anything else left in `buf` (a frame cut short) is dropped.
    pub(super) fn finish(&mut self, buf: &mut BytesMut) {
        if self.preface == Preface::Pending {
            self.out.extend_from_slice(buf);
        }
        buf.clear();
    }

    /// Logs the reason a connection ends and, when serving, queues a GOAWAY that gives it.
    pub(super) fn fail(&mut self, f: &Fatal) {
        self.socket.warn_limited(|suppressed| {
            tracing::warn!(
                socket = %self.socket.path,
                reason = %f.message,
                suppressed,
                "closed a gRPC connection that broke HTTP/2"
            );
        });
        if matches!(self.policy, Policy::Accept) {
            frame::write_goaway(self.last_request, f.code, &f.message, &mut self.inject);
        }
    }

    /// Takes the buffered frame `head` off `buf`, its payload passed on as it arrives
    /// (`drop`: thrown away).
    fn skip(&mut self, buf: &mut BytesMut, head: &Head, drop: bool) {
        buf.advance(frame::HEAD_LEN);
        self.passing = head.len;
        self.dropping = drop;
    }

    /// Decodes one buffered header block (`frames`: HEADERS `head` and its CONTINUATIONs,
    /// checked by [`buffered_block`]) and passes it on re-encoded, or answers it.
    fn header_block(&mut self, head: Head, frames: &[u8]) -> Result<(), Fatal> {
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
            self.decoder.set_max_allowed_table_size(self.table_limit);
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
                        if let Some(observer) = &self.socket.observer {
                            let method = headers
                                .iter()
                                .find(|(n, _)| n == b":path")
                                .and_then(|(_, v)| std::str::from_utf8(v).ok())
                                .unwrap_or_default();
                            observer.notify(&super::RequestSeen {
                                socket: &self.socket.path,
                                method,
                                authority: authority.as_deref(),
                            });
                        }
                        self.note_authority(authority, replaced);
                        list = headers;
                    }
                    Verdict::Refuse(reason) => {
                        self.refuse(stream, end_stream, reason);
                        return Ok(());
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
    fn refuse(&mut self, stream: u32, end_stream: bool, reason: String) {
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
        frame::write_header_block(
            stream,
            true,
            None,
            &headers::encode(&headers::grpc_error(&message)),
            &mut self.inject,
        );
        if !end_stream {
            frame::write_rst_stream(stream, code::NO_ERROR, &mut self.inject);
            self.refused.insert(stream);
            while self.refused.len() > MAX_REFUSED_REMEMBERED {
                self.refused.pop_first();
            }
        }
    }
}

/// The head of the frame at `at` in `buf`, when all of it is there.
fn buffered_head(buf: &[u8], at: usize) -> Option<Head> {
    let bytes = buf.get(at..at + frame::HEAD_LEN)?;
    let mut b = [0u8; frame::HEAD_LEN];
    b.copy_from_slice(bytes);
    Some(Head::parse(&b))
}

/// Where the header block starting with HEADERS frame `head` (at the start of `buf`) ends, once
/// all its frames are buffered; refuses a block over [`MAX_HEADER_BLOCK`] as soon as a frame
/// head shows it, and a block interrupted by another frame.
fn buffered_block(buf: &[u8], head: &Head) -> Result<Option<usize>, Fatal> {
    if head.len > MAX_HEADER_BLOCK {
        return Err(too_large());
    }
    let mut end = frame::HEAD_LEN + head.len;
    if buf.len() < end {
        return Ok(None);
    }
    // The fragment's length, as the limit counts it (without padding and priority).
    let (_, fragment) = frame::split_headers_payload(head, &buf[frame::HEAD_LEN..end])
        .map_err(|m| fatal(code::PROTOCOL_ERROR, m))?;
    let mut block_len = fragment.len();
    let mut end_headers = head.has(frame::FLAG_END_HEADERS);
    while !end_headers {
        let Some(next) = buffered_head(buf, end) else {
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
        if buf.len() < end {
            return Ok(None);
        }
        end_headers = next.has(frame::FLAG_END_HEADERS);
    }
    Ok(Some(end))
}

fn too_large() -> Fatal {
    fatal(
        code::ENHANCE_YOUR_CALM,
        format!("a header block is larger than {MAX_HEADER_BLOCK} bytes"),
    )
}

/// The response direction, free of I/O: follows the bytes the server has sent to the client,
/// so the layer's own frames go in between whole frames (never inside a frame or a header
/// block), and finds the header table sizes the server allows in its SETTINGS.
#[derive(Debug, Default)]
pub(super) struct ResponseTracker {
    /// The part of a frame head seen so far.
    head: [u8; frame::HEAD_LEN],
    head_len: usize,
    /// Payload bytes of the current frame not yet sent.
    remaining: usize,
    /// Inside a header block that continues in CONTINUATION frames.
    in_block: bool,
    /// The server's connection preface (its first SETTINGS) has begun; nothing goes before it.
    started: bool,
    /// The payload of a SETTINGS frame being sent, to find the header table size.
    settings: Option<Vec<u8>>,
}

impl ResponseTracker {
    /// Follows `bytes`, the next ones the server sent; calls `table_size` with each header
    /// table size a SETTINGS frame among them allows.
    pub(super) fn sent(&mut self, mut bytes: &[u8], mut table_size: impl FnMut(usize)) {
        while !bytes.is_empty() {
            if self.remaining > 0 {
                let n = self.remaining.min(bytes.len());
                if let Some(s) = self.settings.as_mut() {
                    s.extend_from_slice(&bytes[..n]);
                }
                bytes = &bytes[n..];
                self.remaining -= n;
                if self.remaining == 0
                    && let Some(s) = self.settings.take()
                {
                    frame::header_table_sizes(&s).for_each(&mut table_size);
                }
                continue;
            }
            let n = (frame::HEAD_LEN - self.head_len).min(bytes.len());
            self.head[self.head_len..self.head_len + n].copy_from_slice(&bytes[..n]);
            self.head_len += n;
            bytes = &bytes[n..];
            if self.head_len < frame::HEAD_LEN {
                return;
            }
            self.head_len = 0;
            self.started = true;
            let head = Head::parse(&self.head);
            match head.kind {
                frame::HEADERS | frame::PUSH_PROMISE | frame::CONTINUATION => {
                    self.in_block = !head.has(frame::FLAG_END_HEADERS);
                }
                frame::SETTINGS
                    if !head.has(frame::FLAG_ACK) && head.len > 0 && head.len <= 6 * 64 =>
                {
                    self.settings = Some(Vec::with_capacity(head.len));
                }
                _ => {}
            }
            self.remaining = head.len;
        }
    }

    /// Whether the server's bytes so far end between two whole frames outside a header block,
    /// where a frame of the layer's can go.
    pub(super) fn at_boundary(&self) -> bool {
        self.started && self.remaining == 0 && self.head_len == 0 && !self.in_block
    }
}

/// Runs one dialing connection until both sides are done: the requests of `client` (the HTTP/2
/// client's end) to `server` (the socket) with their `:authority` set, the answers copied back
/// as they are.
pub(super) async fn dialing<C, S>(client: C, server: S, policy: Policy, socket: Arc<SocketContext>)
where
    C: AsyncRead + AsyncWrite + Send + 'static,
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let (mut client_rd, mut client_wr) = tokio::io::split(client);
    let (mut server_rd, mut server_wr) = tokio::io::split(server);
    let path = socket.path.clone();
    let requests = async move {
        let mut filter = RequestFilter::new(policy, socket);
        let mut buf = BytesMut::with_capacity(READ_CHUNK);
        loop {
            buf.reserve(READ_CHUNK);
            match client_rd.read_buf(&mut buf).await {
                Ok(0) => {
                    filter.finish(&mut buf);
                    let _ = server_wr.write_all(&filter.out).await;
                    break;
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::debug!(socket = %filter.socket.path, error = %kubedev_core::echo::Chain(&e), "reading a request failed");
                    break;
                }
            }
            let handled = filter.handle(&mut buf);
            if !filter.out.is_empty() {
                if server_wr.write_all(&filter.out).await.is_err() {
                    break;
                }
                filter.out.clear();
            }
            if let Err(f) = handled {
                filter.fail(&f);
                break;
            }
        }
        let _ = server_wr.shutdown().await;
    };
    let responses = async move {
        tokio::io::copy(&mut server_rd, &mut client_wr).await?;
        client_wr.shutdown().await
    };
    tokio::pin!(responses);
    tokio::pin!(requests);
    let ended = tokio::select! {
        () = &mut requests => (&mut responses).await,
        r = &mut responses => r,
    };
    if let Err(e) = ended {
        tracing::debug!(socket = %path, error = %kubedev_core::echo::Chain(&e), "connection ended");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame_bytes(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        Head {
            len: payload.len(),
            kind,
            flags,
            stream,
        }
        .write(&mut out);
        out.extend_from_slice(payload);
        out
    }

    #[test]
    fn the_layers_frames_go_only_between_whole_frames_of_the_servers() {
        // The server's SETTINGS (a header table of 8 KiB), a header block split over HEADERS
        // and CONTINUATION, and a DATA frame, written a few bytes at a time.
        let mut settings = Vec::new();
        settings.extend_from_slice(&frame::SETTING_HEADER_TABLE_SIZE.to_be_bytes());
        settings.extend_from_slice(&8192u32.to_be_bytes());
        let frames = [
            frame_bytes(frame::SETTINGS, 0, 0, &settings),
            frame_bytes(frame::HEADERS, 0, 1, b"abc"),
            frame_bytes(frame::CONTINUATION, frame::FLAG_END_HEADERS, 1, b"de"),
            frame_bytes(frame::DATA, frame::FLAG_END_STREAM, 1, b"hello"),
        ];
        let all: Vec<u8> = frames.concat();
        // Where a whole frame ends outside a header block.
        let mut boundaries = vec![frames[0].len()];
        boundaries.push(boundaries[0] + frames[1].len() + frames[2].len());
        boundaries.push(all.len());
        for step in [1, 2, 4, 7, 9, 16] {
            let mut tracker = ResponseTracker::default();
            assert!(
                !tracker.at_boundary(),
                "nothing goes before the server's preface"
            );
            let mut sizes = Vec::new();
            let mut at = 0;
            while at < all.len() {
                let end = (at + step).min(all.len());
                tracker.sent(&all[at..end], |s| sizes.push(s));
                at = end;
                assert_eq!(
                    tracker.at_boundary(),
                    boundaries.contains(&at),
                    "after {at} bytes, {step} at a time"
                );
            }
            assert_eq!(sizes, [8192], "{step} at a time");
        }
    }
}
