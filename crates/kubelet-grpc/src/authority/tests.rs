//! The layer between real sockets: tonic clients that send each authority, and a raw HTTP/2
//! client for what tonic would never send.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tokio_util::sync::CancellationToken;

use super::frame::{self, Head};
use super::*;
use crate::pb::pluginregistration as reg;

struct Info;

#[tonic::async_trait]
impl reg::registration_server::Registration for Info {
    async fn get_info(
        &self,
        _: tonic::Request<reg::InfoRequest>,
    ) -> Result<tonic::Response<reg::PluginInfo>, tonic::Status> {
        Ok(tonic::Response::new(reg::PluginInfo {
            r#type: "DRAPlugin".into(),
            name: "gpu.example.com".into(),
            endpoint: "/x/dra.sock".into(),
            supported_versions: vec!["v1.DRAPlugin".into()],
        }))
    }

    async fn notify_registration_status(
        &self,
        _: tonic::Request<reg::RegistrationStatus>,
    ) -> Result<tonic::Response<reg::RegistrationStatusResponse>, tonic::Status> {
        Ok(tonic::Response::new(reg::RegistrationStatusResponse {}))
    }
}

/// Serves the registration service on `path`, through the layer or (`layer == false`) straight.
fn serve(path: &Path, layer: bool, cancel: &CancellationToken) {
    let listener = UnixListener::bind(path).unwrap();
    let router = tonic::transport::Server::builder()
        .add_service(reg::registration_server::RegistrationServer::new(Info));
    let signal = cancel.clone().cancelled_owned();
    if layer {
        let incoming = incoming(listener, path);
        tokio::spawn(router.serve_with_incoming_shutdown(incoming, signal));
    } else {
        let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
        tokio::spawn(router.serve_with_incoming_shutdown(incoming, signal));
    }
}

async fn get_info(path: &Path, authority: ClientAuthority) -> Result<String, tonic::Status> {
    let channel = dial(path, authority, Duration::from_secs(5))
        .await
        .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    let mut client = reg::registration_client::RegistrationClient::new(channel);
    Ok(client
        .get_info(reg::InfoRequest {})
        .await?
        .into_inner()
        .name)
}

fn all_authorities() -> Vec<ClientAuthority> {
    vec![
        ClientAuthority::EscapedSocketPath,
        ClientAuthority::SocketPath,
        ClientAuthority::Localhost,
        ClientAuthority::Empty,
        ClientAuthority::Value("a b%zz/".into()),
    ]
}

#[tokio::test]
async fn every_authority_a_client_sends_is_served() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("reg.sock");
    let cancel = CancellationToken::new();
    serve(&path, true, &cancel);
    for authority in all_authorities() {
        assert_eq!(
            get_info(&path, authority.clone()).await.unwrap(),
            "gpu.example.com",
            "{authority:?}"
        );
    }
    cancel.cancel();
}

#[tokio::test]
async fn the_observer_hears_each_request_with_its_method_and_the_authority_as_sent() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("reg.sock");
    let cancel = CancellationToken::new();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = seen.clone();
    let observer = RequestObserver::new(move |r: &RequestSeen<'_>| {
        record.lock().push((
            r.method.to_string(),
            r.authority_kind(),
            r.socket.to_string(),
        ));
    });
    let listener = UnixListener::bind(&path).unwrap();
    let router = tonic::transport::Server::builder()
        .add_service(reg::registration_server::RegistrationServer::new(Info));
    tokio::spawn(router.serve_with_incoming_shutdown(
        incoming_observed(listener, &path, Some(observer)),
        cancel.clone().cancelled_owned(),
    ));
    for authority in all_authorities() {
        get_info(&path, authority).await.unwrap();
    }
    let socket = path.display().to_string();
    let method = "/pluginregistration.Registration/GetInfo".to_string();
    assert_eq!(
        *seen.lock(),
        [
            "escaped-socket-path",
            "socket-path",
            "localhost",
            "empty",
            "other"
        ]
        .map(|kind| (method.clone(), kind, socket.clone()))
        .to_vec()
    );
    cancel.cancel();
}

#[tokio::test]
async fn without_the_layer_the_kubelets_authority_is_reset() {
    // What the layer exists for: the HTTP/2 server alone resets these streams.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("reg.sock");
    let cancel = CancellationToken::new();
    serve(&path, false, &cancel);
    assert!(get_info(&path, ClientAuthority::Localhost).await.is_ok());
    for authority in [
        ClientAuthority::EscapedSocketPath,
        ClientAuthority::SocketPath,
        ClientAuthority::Empty,
    ] {
        let e = get_info(&path, authority.clone()).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::Internal, "{authority:?}: {e}");
    }
    cancel.cancel();
}

#[tokio::test]
async fn many_calls_on_one_connection_keep_both_hpack_contexts_in_step() {
    // tonic's client indexes repeated headers in its dynamic table: each call after the first
    // refers to entries the layer's decoder must have kept.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("reg.sock");
    let cancel = CancellationToken::new();
    serve(&path, true, &cancel);
    let channel = dial(
        &path,
        ClientAuthority::EscapedSocketPath,
        Duration::from_secs(5),
    )
    .await
    .unwrap();
    let mut client = reg::registration_client::RegistrationClient::new(channel);
    for i in 0..200 {
        let mut request = tonic::Request::new(reg::InfoRequest {});
        // A header whose value changes each time, so new entries keep being indexed and old
        // ones evicted from a 4 KiB table.
        request.metadata_mut().insert(
            "x-call",
            format!("{i}-{}", "v".repeat(i % 97)).parse().unwrap(),
        );
        client.get_info(request).await.unwrap();
    }
    cancel.cancel();
}

/// A raw HTTP/2 client: the preface and an empty SETTINGS, then whatever the test writes.
struct Raw {
    stream: UnixStream,
    decoder: loona_hpack::Decoder<'static>,
}

impl Raw {
    async fn connect(path: &Path) -> Raw {
        let mut stream = UnixStream::connect(path).await.unwrap();
        let mut out = frame::PREFACE.to_vec();
        Head {
            len: 0,
            kind: frame::SETTINGS,
            flags: 0,
            stream: 0,
        }
        .write(&mut out);
        stream.write_all(&out).await.unwrap();
        Raw {
            stream,
            decoder: loona_hpack::Decoder::new(),
        }
    }

    async fn request(&mut self, stream: u32, headers: &[(&str, &str)], end_stream: bool) {
        let list: Vec<(Vec<u8>, Vec<u8>)> = headers
            .iter()
            .map(|(n, v)| (n.as_bytes().to_vec(), v.as_bytes().to_vec()))
            .collect();
        let mut out = Vec::new();
        frame::write_header_block(stream, end_stream, None, &headers::encode(&list), &mut out);
        self.stream.write_all(&out).await.unwrap();
    }

    async fn empty_message(&mut self, stream: u32) {
        let mut out = Vec::new();
        Head {
            len: 5,
            kind: frame::DATA,
            flags: frame::FLAG_END_STREAM,
            stream,
        }
        .write(&mut out);
        out.extend_from_slice(&[0, 0, 0, 0, 0]);
        self.stream.write_all(&out).await.unwrap();
    }

    async fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).await.unwrap();
    }

    /// The next frame, with header blocks decoded; `None` when the connection closed.
    async fn next(&mut self) -> Option<(Head, Vec<u8>, Vec<(String, String)>)> {
        let read = async {
            let mut hb = [0u8; frame::HEAD_LEN];
            self.stream.read_exact(&mut hb).await.ok()?;
            let head = Head::parse(&hb);
            let mut payload = vec![0; head.len];
            self.stream.read_exact(&mut payload).await.ok()?;
            Some((head, payload))
        };
        let (head, payload) = tokio::time::timeout(Duration::from_secs(5), read)
            .await
            .expect("no frame within 5 s")?;
        let mut fields = Vec::new();
        if head.kind == frame::HEADERS {
            let (_, range) = frame::split_headers_payload(&head, &payload).unwrap();
            for (n, v) in self.decoder.decode(&payload[range]).unwrap() {
                fields.push((
                    String::from_utf8_lossy(&n).into_owned(),
                    String::from_utf8_lossy(&v).into_owned(),
                ));
            }
        }
        Some((head, payload, fields))
    }

    /// Frames until one of `kind` on `stream` arrives.
    async fn until(&mut self, kind: u8, stream: u32) -> (Head, Vec<u8>, Vec<(String, String)>) {
        loop {
            let f = self.next().await.expect("connection closed");
            if f.0.kind == kind && f.0.stream == stream {
                return f;
            }
        }
    }
}

fn field<'a>(fields: &'a [(String, String)], name: &str) -> Option<&'a str> {
    fields
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}

const GET_INFO: &str = "/pluginregistration.Registration/GetInfo";

fn grpc_headers(authority: &str) -> Vec<(&'static str, &str)> {
    vec![
        (":method", "POST"),
        (":scheme", "http"),
        (":path", GET_INFO),
        (":authority", authority),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ]
}

#[tokio::test]
async fn a_malformed_request_gets_a_grpc_error_and_the_connection_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("reg.sock");
    let cancel = CancellationToken::new();
    serve(&path, true, &cancel);
    let mut raw = Raw::connect(&path).await;

    // No :path: the HTTP/2 server would reset the stream.
    raw.request(
        1,
        &[
            (":method", "POST"),
            (":scheme", "http"),
            (":authority", "%2Fsome%2Fsocket"),
            ("content-type", "application/grpc"),
        ],
        false,
    )
    .await;
    let (head, _, fields) = raw.until(frame::HEADERS, 1).await;
    assert!(head.has(frame::FLAG_END_STREAM));
    assert_eq!(field(&fields, ":status"), Some("200"));
    assert_eq!(field(&fields, "grpc-status"), Some("13"));
    let message = field(&fields, "grpc-message").unwrap();
    assert!(message.contains("no :path"), "{message}");
    let (_, payload, _) = raw.until(frame::RST_STREAM, 1).await;
    assert_eq!(payload, 0u32.to_be_bytes(), "RST_STREAM with NO_ERROR");

    // The client's body for the refused stream is dropped; the connection window comes back.
    // (The server's own connection-window updates may come before or after it.)
    raw.empty_message(1).await;
    while raw.until(frame::WINDOW_UPDATE, 0).await.1 != 5u32.to_be_bytes() {}

    // The same connection serves a good request next, with the kubelet's authority.
    raw.request(3, &grpc_headers("%2Fvar%2Flib%2Fx-reg.sock"), false)
        .await;
    raw.empty_message(3).await;
    let (_, _, fields) = raw.until(frame::HEADERS, 3).await;
    assert_eq!(field(&fields, ":status"), Some("200"));
    let (head, payload, _) = raw.until(frame::DATA, 3).await;
    assert!(payload.len() > 5, "{head:?}");
    let (_, _, trailers) = raw.until(frame::HEADERS, 3).await;
    assert_eq!(field(&trailers, "grpc-status"), Some("0"));
    cancel.cancel();
}

#[tokio::test]
async fn requests_that_arrive_a_few_bytes_at_a_time_are_served() {
    // A client (or a busy kernel) may hand over a frame head, a header block split into
    // CONTINUATIONs, or a message in any number of pieces: each request is still served.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("reg.sock");
    let cancel = CancellationToken::new();
    serve(&path, true, &cancel);
    let mut raw = Raw::connect(&path).await;
    let mut bytes = Vec::new();
    for stream in [1u32, 3] {
        let list: Vec<(Vec<u8>, Vec<u8>)> = grpc_headers("%2Fvar%2Flib%2Fx-reg.sock")
            .iter()
            .map(|(n, v)| (n.as_bytes().to_vec(), v.as_bytes().to_vec()))
            .collect();
        let block = headers::encode(&list);
        // The block in three frames: HEADERS and two CONTINUATIONs.
        let (a, rest) = block.split_at(block.len() / 3);
        let (b, c) = rest.split_at(rest.len() / 2);
        for (kind, flags, part) in [
            (frame::HEADERS, 0, a),
            (frame::CONTINUATION, 0, b),
            (frame::CONTINUATION, frame::FLAG_END_HEADERS, c),
        ] {
            Head {
                len: part.len(),
                kind,
                flags,
                stream,
            }
            .write(&mut bytes);
            bytes.extend_from_slice(part);
        }
        Head {
            len: 5,
            kind: frame::DATA,
            flags: frame::FLAG_END_STREAM,
            stream,
        }
        .write(&mut bytes);
        bytes.extend_from_slice(&[0, 0, 0, 0, 0]);
    }
    for (i, piece) in bytes.chunks(7).enumerate() {
        raw.send(piece).await;
        if i % 3 == 0 {
            tokio::task::yield_now().await;
        }
    }
    for stream in [1, 3] {
        let (_, _, fields) = raw.until(frame::HEADERS, stream).await;
        assert_eq!(field(&fields, ":status"), Some("200"), "stream {stream}");
        let (_, _, trailers) = raw.until(frame::HEADERS, stream).await;
        assert_eq!(
            field(&trailers, "grpc-status"),
            Some("0"),
            "stream {stream}"
        );
    }
    cancel.cancel();
}

#[tokio::test]
async fn a_header_block_that_does_not_decode_ends_the_connection_with_a_reason() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("reg.sock");
    let cancel = CancellationToken::new();
    serve(&path, true, &cancel);
    let mut raw = Raw::connect(&path).await;
    // Indexed field 70: the client's dynamic table is empty, so there is no such entry.
    let mut out = Vec::new();
    Head {
        len: 1,
        kind: frame::HEADERS,
        flags: frame::FLAG_END_HEADERS,
        stream: 1,
    }
    .write(&mut out);
    out.push(0x80 | 70);
    raw.send(&out).await;
    let (_, payload, _) = raw.until(frame::GOAWAY, 0).await;
    assert_eq!(
        &payload[4..8],
        &frame::code::COMPRESSION_ERROR.to_be_bytes()
    );
    let debug = String::from_utf8_lossy(&payload[8..]).into_owned();
    assert!(debug.contains("does not decode"), "{debug}");
    // Then the connection closes.
    while raw.next().await.is_some() {}
    cancel.cancel();
}

#[tokio::test]
async fn framing_errors_and_oversized_blocks_end_the_connection_with_a_reason() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("reg.sock");
    let cancel = CancellationToken::new();
    serve(&path, true, &cancel);

    // A CONTINUATION out of nowhere.
    let mut raw = Raw::connect(&path).await;
    let mut out = Vec::new();
    Head {
        len: 0,
        kind: frame::CONTINUATION,
        flags: frame::FLAG_END_HEADERS,
        stream: 1,
    }
    .write(&mut out);
    raw.send(&out).await;
    let (_, payload, _) = raw.until(frame::GOAWAY, 0).await;
    assert_eq!(&payload[4..8], &frame::code::PROTOCOL_ERROR.to_be_bytes());

    // A header block that keeps growing past the limit.
    let mut raw = Raw::connect(&path).await;
    let mut out = Vec::new();
    Head {
        len: 0,
        kind: frame::HEADERS,
        flags: 0,
        stream: 1,
    }
    .write(&mut out);
    for _ in 0..17 {
        Head {
            len: frame::MIN_MAX_FRAME,
            kind: frame::CONTINUATION,
            flags: 0,
            stream: 1,
        }
        .write(&mut out);
        out.extend(std::iter::repeat_n(0u8, frame::MIN_MAX_FRAME));
    }
    raw.send(&out).await;
    let (_, payload, _) = raw.until(frame::GOAWAY, 0).await;
    assert_eq!(
        &payload[4..8],
        &frame::code::ENHANCE_YOUR_CALM.to_be_bytes()
    );
    cancel.cancel();
}

#[tokio::test]
async fn a_client_that_is_not_http2_gets_the_servers_own_answer() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("reg.sock");
    let cancel = CancellationToken::new();
    serve(&path, true, &cancel);
    let mut stream = UnixStream::connect(&path).await.unwrap();
    stream
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    // The server closes the connection (it speaks only HTTP/2); nothing hangs.
    let mut rest = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut rest))
        .await
        .expect("the connection is closed")
        .ok();
    cancel.cancel();
}

#[test]
fn escaped_paths_match_what_grpc_clients_send() {
    assert_eq!(
        ClientAuthority::EscapedSocketPath.value_for(Path::new(
            "/var/lib/kubelet/plugins_registry/gpu.example.com-reg.sock"
        )),
        b"%2Fvar%2Flib%2Fkubelet%2Fplugins_registry%2Fgpu.example.com-reg.sock"
    );
    assert_eq!(
        ClientAuthority::EscapedSocketPath.value_for(Path::new("/a b/c%d")),
        b"%2Fa%20b%2Fc%25d"
    );
}

#[test]
fn warnings_are_rate_limited_per_socket_and_count_what_was_suppressed() {
    let context = SocketContext::new(Path::new("/x.sock"), None);
    let mut logged = Vec::new();
    for _ in 0..5 {
        context.warn_limited(|suppressed| logged.push(suppressed));
    }
    assert_eq!(logged, [0]);
    context.warned.lock().last = Some(Instant::now() - WARN_INTERVAL);
    context.warn_limited(|suppressed| logged.push(suppressed));
    assert_eq!(logged, [0, 4]);
}
