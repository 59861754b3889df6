//! One accepted connection as the HTTP/2 server sees it: the socket, with the layer applied
//! to the bytes as the server reads and writes them, in the server's own task.

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker, ready};

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::UnixStream;

use super::proxy::{READ_CHUNK, RequestFilter, ResponseTracker};
use super::{Policy, SocketContext};

/// The most bytes of the layer's own frames held for a client; past it the client's requests
/// are not read until it reads its answers.
const MAX_HELD: usize = 64 * 1024;

/// One accepted connection, as the HTTP/2 server sees it: reads give the client's requests with
/// their header blocks re-encoded (refused requests taken out), writes go to the client with
/// the layer's own answers put in between whole frames.
pub struct Connection {
    io: UnixStream,
    filter: RequestFilter,
    /// Bytes read from the client and not handled yet.
    raw: BytesMut,
    /// How much of the filter's output the server has read.
    out_read: usize,
    /// How much of the layer's own frames has been sent.
    held_sent: usize,
    responses: ResponseTracker,
    /// The client's side is over (closed, failed, or broke HTTP/2): once the server has read
    /// what is left, and the layer's frames are out, it reads the end.
    ended: bool,
    /// The server's read, waiting for the layer's frames to go out.
    read_waker: Option<Waker>,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("io", &self.io)
            .field("ended", &self.ended)
            .finish_non_exhaustive()
    }
}

impl tonic::transport::server::Connected for Connection {
    type ConnectInfo = ();

    fn connect_info(&self) -> Self::ConnectInfo {}
}

impl Connection {
    pub(super) fn new(io: UnixStream, socket: Arc<SocketContext>) -> Self {
        Connection {
            io,
            filter: RequestFilter::new(Policy::Accept, socket),
            raw: BytesMut::with_capacity(READ_CHUNK),
            out_read: 0,
            held_sent: 0,
            responses: ResponseTracker::default(),
            ended: false,
            read_waker: None,
        }
    }

    fn held(&self) -> usize {
        self.filter.inject.len() - self.held_sent
    }

    /// Sends the layer's frames when the server's bytes end between whole frames; ready once
    /// none are left to send there (or none can go yet).
    fn poll_send_held(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.held() > 0 && self.responses.at_boundary() {
            let n = ready!(
                Pin::new(&mut self.io).poll_write(cx, &self.filter.inject[self.held_sent..])
            )?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.held_sent += n;
        }
        if self.held() == 0 && self.held_sent > 0 {
            self.filter.inject.clear();
            self.held_sent = 0;
            if let Some(w) = self.read_waker.take() {
                w.wake();
            }
        }
        Poll::Ready(Ok(()))
    }

    /// Reads what the client sent into the buffer; `0` at its end.
    fn poll_read_client(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        self.raw.reserve(READ_CHUNK);
        loop {
            ready!(self.io.poll_read_ready(cx))?;
            match self.io.try_read_buf(&mut self.raw) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                read => return Poll::Ready(read),
            }
        }
    }

    /// Follows the first `n` bytes of `bufs`, just sent to the client.
    fn sent(&mut self, bufs: &[IoSlice<'_>], mut n: usize) {
        let filter = &mut self.filter;
        for b in bufs {
            if n == 0 {
                break;
            }
            let take = n.min(b.len());
            self.responses
                .sent(&b[..take], |size| filter.allow_table_size(size));
            n -= take;
        }
        if self.held() > 0
            && self.responses.at_boundary()
            && let Some(w) = self.read_waker.take()
        {
            w.wake();
        }
    }
}

impl AsyncRead for Connection {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        dst: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            let out = &mut this.filter.out;
            if this.out_read < out.len() {
                let n = dst.remaining().min(out.len() - this.out_read);
                dst.put_slice(&out[this.out_read..this.out_read + n]);
                this.out_read += n;
                if this.out_read == out.len() {
                    out.clear();
                    this.out_read = 0;
                }
                return Poll::Ready(Ok(()));
            }
            if this.held() > 0 {
                if let Poll::Ready(Err(e)) = this.poll_send_held(cx) {
                    return Poll::Ready(Err(e));
                }
                // A GOAWAY goes out before the server reads the end; a client that does not
                // read its answers is not read from either.
                if this.held() > 0 && (this.ended || this.held() > MAX_HELD) {
                    this.read_waker = Some(cx.waker().clone());
                    return Poll::Pending;
                }
            }
            if this.ended {
                return Poll::Ready(Ok(()));
            }
            match ready!(this.poll_read_client(cx)) {
                Err(e) => {
                    tracing::debug!(socket = %this.filter.socket_path(), error = %kubedev_core::echo::Chain(&e), "reading a request failed");
                    this.ended = true;
                    return Poll::Ready(Err(e));
                }
                Ok(0) => {
                    this.filter.finish(&mut this.raw);
                    this.ended = true;
                }
                Ok(_) => {
                    if let Err(f) = this.filter.handle(&mut this.raw) {
                        this.filter.fail(&f);
                        this.ended = true;
                    }
                }
            }
        }
    }
}

impl AsyncWrite for Connection {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_write_vectored(cx, &[IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        ready!(this.poll_send_held(cx))?;
        let n = ready!(Pin::new(&mut this.io).poll_write_vectored(cx, bufs))?;
        this.sent(bufs, n);
        Poll::Ready(Ok(n))
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_send_held(cx))?;
        Pin::new(&mut this.io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_send_held(cx))?;
        Pin::new(&mut this.io).poll_shutdown(cx)
    }
}
