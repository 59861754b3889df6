//! What the `:authority` layer does to one request's header list: the checks the HTTP/2 server
//! underneath would make (so a bad request gets a gRPC error instead of a stream reset), the
//! `:authority` it passes on, and the HPACK encoding of what it sends.

use std::io::Write as _;

use http::header::{HeaderName, HeaderValue};
use http::uri::{Authority, PathAndQuery, Scheme};

/// A decoded header list, in order, as (name, value) bytes.
pub(super) type HeaderList = Vec<(Vec<u8>, Vec<u8>)>;

/// The authority put in place of one the HTTP/2 server cannot parse.
pub(super) const REPLACEMENT_AUTHORITY: &[u8] = b"localhost";

/// What becomes of a request's headers.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Verdict {
    /// Pass these headers on; `authority` is what the client sent (`None` when it sent none).
    Forward {
        headers: HeaderList,
        authority: Option<Vec<u8>>,
        replaced: bool,
    },
    /// Answer the request with a gRPC error saying this, and pass nothing on.
    Refuse(String),
}

/// The server side: keeps an `:authority` that parses as a URI authority and replaces any other
/// (a socket path, raw or percent-encoded, or an empty value) with `localhost`; refuses a request
/// the HTTP/2 server would reset, naming why.
pub(super) fn accept_request(mut headers: HeaderList) -> Verdict {
    let pseudo = match PseudoHeaders::find(&headers) {
        Ok(pseudo) => pseudo,
        Err(reason) => return Verdict::Refuse(reason),
    };
    if let Err(reason) = pseudo.check_request(&headers) {
        return Verdict::Refuse(reason);
    }
    let mut replaced = false;
    let sent = pseudo.authority.map(|i| {
        let original = headers[i].1.clone();
        if Authority::try_from(original.as_slice()).is_err() {
            headers[i].1 = REPLACEMENT_AUTHORITY.to_vec();
            replaced = true;
        }
        original
    });
    Verdict::Forward {
        headers,
        authority: sent,
        replaced,
    }
}

/// Where a request's pseudo-header fields are in its header list.
#[derive(Default)]
struct PseudoHeaders {
    method: Option<usize>,
    scheme: Option<usize>,
    path: Option<usize>,
    authority: Option<usize>,
    /// The request carries `:protocol` (an extended CONNECT).
    protocol: bool,
}

impl PseudoHeaders {
    /// Finds the pseudo-header fields, refusing a list the server would reset for its fields
    /// alone: a pseudo-header after a regular field, an unknown, repeated or response one, a
    /// value that is not UTF-8, a regular field HTTP/2 does not allow.
    fn find(headers: &HeaderList) -> Result<Self, String> {
        let mut found = PseudoHeaders::default();
        let mut regular_seen = false;
        for (i, (name, value)) in headers.iter().enumerate() {
            if name.first() == Some(&b':') {
                if regular_seen {
                    let shown = name.escape_ascii();
                    return Err(format!(
                        "pseudo-header {shown} comes after regular header fields"
                    ));
                }
                found.note(i, name, value)?;
                continue;
            }
            regular_seen = true;
            check_regular_field(name, value)?;
        }
        Ok(found)
    }

    /// Records pseudo-header field `i`.
    fn note(&mut self, i: usize, name: &[u8], value: &[u8]) -> Result<(), String> {
        let shown = name.escape_ascii();
        let slot = match name {
            b":method" => &mut self.method,
            b":scheme" => &mut self.scheme,
            b":path" => &mut self.path,
            b":authority" => &mut self.authority,
            b":protocol" => {
                self.protocol = true;
                return Ok(());
            }
            b":status" => {
                return Err("a request carries the response pseudo-header :status".into());
            }
            _ => return Err(format!("unknown pseudo-header {shown}")),
        };
        if slot.replace(i).is_some() {
            return Err(format!("pseudo-header {shown} appears twice"));
        }
        if name != b":authority" && std::str::from_utf8(value).is_err() {
            return Err(format!("the value of {shown} is not UTF-8"));
        }
        Ok(())
    }

    /// Checks `:method`, `:scheme` and `:path` together, as the server would for a request
    /// (a CONNECT request carries neither scheme nor path, unless it is an extended one).
    fn check_request(&self, headers: &HeaderList) -> Result<(), String> {
        let value = |slot: Option<usize>| slot.map(|i| headers[i].1.as_slice());
        let Some(method_value) = value(self.method) else {
            return Err("the request has no :method".into());
        };
        let is_connect = method_value == b"CONNECT";
        if http::Method::from_bytes(method_value).is_err() {
            return Err(format!(
                ":method {:?} is not an HTTP method",
                method_value.escape_ascii().to_string()
            ));
        }
        if self.protocol && !is_connect {
            return Err(":protocol is only allowed on CONNECT requests".into());
        }
        check_scheme(value(self.scheme), is_connect, self.protocol)?;
        check_path(value(self.path), is_connect, self.protocol)
    }
}

/// Refuses a regular header field the server would reset the stream for: an invalid name or
/// value, a connection-specific field, `te` other than `trailers`.
fn check_regular_field(name: &[u8], value: &[u8]) -> Result<(), String> {
    let shown = name.escape_ascii();
    if HeaderName::from_bytes(name).is_err() {
        return Err(format!("\"{shown}\" is not a valid header field name"));
    }
    if HeaderValue::from_bytes(value).is_err() {
        return Err(format!(
            "the value of header field {shown} has characters HTTP does not allow"
        ));
    }
    let lower = name.to_ascii_lowercase();
    if matches!(
        lower.as_slice(),
        b"connection" | b"transfer-encoding" | b"upgrade" | b"keep-alive" | b"proxy-connection"
    ) {
        return Err(format!(
            "connection-specific header field {shown} is not allowed in HTTP/2"
        ));
    }
    if lower == b"te" && value != b"trailers" {
        return Err(format!(
            "header field te is {:?}; HTTP/2 allows only \"trailers\"",
            value.escape_ascii().to_string()
        ));
    }
    Ok(())
}

/// Checks the request's `:scheme`: required unless it is a plain CONNECT, which must not
/// carry one.
fn check_scheme(scheme: Option<&[u8]>, is_connect: bool, protocol: bool) -> Result<(), String> {
    match scheme {
        Some(_) if is_connect && !protocol => Err("a CONNECT request carries :scheme".into()),
        Some(s) if Scheme::try_from(s).is_err() => Err(format!(
            ":scheme {:?} is not a URI scheme",
            s.escape_ascii().to_string()
        )),
        Some(_) => Ok(()),
        None if !is_connect || protocol => Err("the request has no :scheme".into()),
        None => Ok(()),
    }
}

/// Checks the request's `:path`: a valid, non-empty request path, required unless it is a
/// plain CONNECT, which must not carry one.
fn check_path(path: Option<&[u8]>, is_connect: bool, protocol: bool) -> Result<(), String> {
    match path {
        Some(_) if is_connect && !protocol => Err("a CONNECT request carries :path".into()),
        Some([]) => Err("the request's :path is empty".into()),
        Some(p) if PathAndQuery::try_from(p).is_err() => Err(format!(
            ":path {:?} is not a valid request path",
            p.escape_ascii().to_string()
        )),
        Some(_) => Ok(()),
        None if !is_connect => Err("the request has no :path".into()),
        None if protocol => Err("an extended CONNECT request has no :path".into()),
        None => Ok(()),
    }
}

/// The client side: sets `:authority` to exactly `value`, whatever the client stack put there.
pub(super) fn set_authority(headers: &mut HeaderList, value: &[u8]) {
    if let Some(entry) = headers.iter_mut().find(|(n, _)| n == b":authority") {
        entry.1 = value.to_vec();
        return;
    }
    let at = headers
        .iter()
        .position(|(n, _)| n.first() != Some(&b':'))
        .unwrap_or(headers.len());
    headers.insert(at, (b":authority".to_vec(), value.to_vec()));
}

/// HPACK-encodes a header list using only literals without indexing (RFC 7541 §6.2.2), so the
/// peer's dynamic table is never touched: whatever its size setting, the encoder and the peer's
/// decoder cannot disagree about it.
pub(super) fn encode(headers: &[(Vec<u8>, Vec<u8>)]) -> Vec<u8> {
    let mut out = Vec::with_capacity(headers.iter().map(|(n, v)| n.len() + v.len() + 8).sum());
    for (name, value) in headers {
        // Writing to a Vec cannot fail.
        let _ = out.write_all(&[0x00]);
        for s in [name, value] {
            // A string literal without Huffman coding: H bit clear, 7-bit length prefix.
            let _ = loona_hpack::encoder::encode_integer_into(s.len(), 7, 0, &mut out);
            out.extend_from_slice(s);
        }
    }
    out
}

/// The gRPC status code for INTERNAL, which gRPC also gives a stream reset with PROTOCOL_ERROR.
const GRPC_INTERNAL: &str = "13";

/// A complete trailers-only gRPC response saying the request was refused and why.
pub(super) fn grpc_error(message: &str) -> HeaderList {
    vec![
        (b":status".to_vec(), b"200".to_vec()),
        (b"content-type".to_vec(), b"application/grpc".to_vec()),
        (b"grpc-status".to_vec(), GRPC_INTERNAL.as_bytes().to_vec()),
        (b"grpc-message".to_vec(), percent_encode_message(message)),
    ]
}

/// `grpc-message` encoding: bytes outside printable ASCII, and `%`, as `%XX`.
fn percent_encode_message(message: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(message.len());
    for &b in message.as_bytes() {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            out.push(b);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn h(pairs: &[(&str, &str)]) -> HeaderList {
        pairs
            .iter()
            .map(|(n, v)| (n.as_bytes().to_vec(), v.as_bytes().to_vec()))
            .collect()
    }

    fn grpc_request(authority: &str) -> HeaderList {
        h(&[
            (":method", "POST"),
            (":scheme", "http"),
            (":path", "/pluginregistration.Registration/GetInfo"),
            (":authority", authority),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
        ])
    }

    fn forwarded_authority(v: Verdict) -> (Vec<u8>, bool) {
        match v {
            Verdict::Forward {
                headers, replaced, ..
            } => (
                headers
                    .into_iter()
                    .find(|(n, _)| n == b":authority")
                    .unwrap()
                    .1,
                replaced,
            ),
            Verdict::Refuse(r) => panic!("refused: {r}"),
        }
    }

    #[test]
    fn socket_paths_and_empty_authorities_become_localhost() {
        for sent in [
            "%2Fvar%2Flib%2Fkubelet%2Fplugins_registry%2Fgpu.example.com-reg.sock",
            "/var/lib/kubelet/plugins_registry/gpu.example.com-reg.sock",
            "",
        ] {
            assert_eq!(
                forwarded_authority(accept_request(grpc_request(sent))),
                (b"localhost".to_vec(), true),
                "{sent:?}"
            );
        }
    }

    #[test]
    fn authorities_http_accepts_pass_unchanged() {
        for sent in [
            "localhost",
            "tonic",
            "127.0.0.1:8080",
            "[::1]:80",
            "dra.sock",
        ] {
            assert_eq!(
                forwarded_authority(accept_request(grpc_request(sent))),
                (sent.as_bytes().to_vec(), false)
            );
        }
        // No :authority at all is fine too.
        let mut no_authority = grpc_request("x");
        no_authority.retain(|(n, _)| n != b":authority");
        assert!(matches!(
            accept_request(no_authority),
            Verdict::Forward {
                authority: None,
                replaced: false,
                ..
            }
        ));
    }

    #[test]
    fn requests_the_server_would_reset_are_refused_with_a_reason() {
        let cases: Vec<(HeaderList, &str)> = vec![
            (
                h(&[(":scheme", "http"), (":path", "/a"), (":authority", "x")]),
                "no :method",
            ),
            (h(&[(":method", "POST"), (":path", "/a")]), "no :scheme"),
            (h(&[(":method", "POST"), (":scheme", "http")]), "no :path"),
            (
                h(&[(":method", "POST"), (":scheme", "http"), (":path", "")]),
                ":path is empty",
            ),
            (
                h(&[
                    (":method", "POST"),
                    ("content-type", "application/grpc"),
                    (":scheme", "http"),
                    (":path", "/a"),
                ]),
                "after regular header fields",
            ),
            (
                h(&[
                    (":method", "POST"),
                    (":method", "GET"),
                    (":scheme", "http"),
                    (":path", "/a"),
                ]),
                "appears twice",
            ),
            (
                h(&[
                    (":method", "POST"),
                    (":scheme", "http"),
                    (":path", "/a"),
                    (":color", "red"),
                ]),
                "unknown pseudo-header :color",
            ),
            (
                h(&[
                    (":method", "POST"),
                    (":scheme", "http"),
                    (":path", "/a"),
                    ("connection", "close"),
                ]),
                "connection-specific header field connection",
            ),
            (
                h(&[
                    (":method", "POST"),
                    (":scheme", "http"),
                    (":path", "/a"),
                    ("te", "gzip"),
                ]),
                "te is",
            ),
            (
                h(&[
                    (":method", "POST"),
                    (":scheme", "http"),
                    (":path", "/a"),
                    ("bad name", "x"),
                ]),
                "\"bad name\" is not a valid header field name",
            ),
            (
                h(&[
                    (":method", "POST"),
                    (":scheme", "http"),
                    (":path", "/a"),
                    ("x", "a\nb"),
                ]),
                "characters HTTP does not allow",
            ),
            (
                h(&[
                    (":method", "POST"),
                    (":scheme", "http"),
                    (":path", "/a"),
                    (":status", "200"),
                ]),
                ":status",
            ),
            (
                h(&[(":method", "PO ST"), (":scheme", "http"), (":path", "/a")]),
                "not an HTTP method",
            ),
            (
                h(&[(":method", "POST"), (":scheme", "ht tp"), (":path", "/a")]),
                "not a URI scheme",
            ),
            (
                h(&[(":method", "POST"), (":scheme", "http"), (":path", "/a b")]),
                "not a valid request path",
            ),
        ];
        for (headers, expected) in cases {
            match accept_request(headers.clone()) {
                Verdict::Refuse(reason) => {
                    assert!(reason.contains(expected), "{reason:?} lacks {expected:?}")
                }
                other => panic!("{headers:?} was not refused: {other:?}"),
            }
        }
    }

    #[test]
    fn the_client_side_sets_exactly_the_authority_asked_for() {
        let mut headers = grpc_request("localhost");
        set_authority(&mut headers, b"%2Ftmp%2Fx.sock");
        assert_eq!(headers[3].1, b"%2Ftmp%2Fx.sock");
        let mut headers = h(&[(":method", "POST"), (":path", "/a"), ("te", "trailers")]);
        set_authority(&mut headers, b"");
        assert_eq!(headers[2], (b":authority".to_vec(), Vec::new()));
    }

    #[test]
    fn encoding_decodes_to_the_same_list_and_leaves_the_table_empty() {
        let headers = grpc_request(&"a".repeat(300));
        let block = encode(&headers);
        let mut decoder = loona_hpack::Decoder::new();
        assert_eq!(decoder.decode(&block).unwrap(), headers);
        // Nothing was indexed: a block that refers to dynamic entry 62 does not decode.
        assert!(decoder.decode(&[0x80 | 62]).is_err());
    }

    #[test]
    fn error_messages_are_percent_encoded_for_grpc() {
        let list = grpc_error("100% wrong: é\n");
        assert_eq!(list[3].1, b"100%25 wrong: %C3%A9%0A");
        assert_eq!(list[2].1, b"13");
    }
}
