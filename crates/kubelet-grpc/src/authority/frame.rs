//! The few pieces of HTTP/2 framing (RFC 9113 §4 and §6) the `:authority` layer reads and
//! writes: frame heads, header-block fragments, and the control frames it sends itself.

/// The client connection preface every HTTP/2 connection with prior knowledge starts with.
pub(super) const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// The size of a frame head.
pub(super) const HEAD_LEN: usize = 9;

/// The largest frame payload every peer must accept (the initial `SETTINGS_MAX_FRAME_SIZE`);
/// frames this layer writes never exceed it.
pub(super) const MIN_MAX_FRAME: usize = 16_384;

pub(super) const DATA: u8 = 0x0;
pub(super) const HEADERS: u8 = 0x1;
pub(super) const PRIORITY: u8 = 0x2;
pub(super) const RST_STREAM: u8 = 0x3;
pub(super) const SETTINGS: u8 = 0x4;
pub(super) const PUSH_PROMISE: u8 = 0x5;
pub(super) const GOAWAY: u8 = 0x7;
pub(super) const WINDOW_UPDATE: u8 = 0x8;
pub(super) const CONTINUATION: u8 = 0x9;

pub(super) const FLAG_END_STREAM: u8 = 0x1;
pub(super) const FLAG_ACK: u8 = 0x1;
pub(super) const FLAG_END_HEADERS: u8 = 0x4;
pub(super) const FLAG_PADDED: u8 = 0x8;
pub(super) const FLAG_PRIORITY: u8 = 0x20;

/// `SETTINGS_HEADER_TABLE_SIZE`.
pub(super) const SETTING_HEADER_TABLE_SIZE: u16 = 0x1;

/// HTTP/2 error codes (RFC 9113 §7) this layer sends.
pub(super) mod code {
    pub(in crate::authority) const NO_ERROR: u32 = 0x0;
    pub(in crate::authority) const PROTOCOL_ERROR: u32 = 0x1;
    pub(in crate::authority) const COMPRESSION_ERROR: u32 = 0x9;
    pub(in crate::authority) const ENHANCE_YOUR_CALM: u32 = 0xb;
}

/// A frame head: payload length, type, flags and stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Head {
    pub(super) len: usize,
    pub(super) kind: u8,
    pub(super) flags: u8,
    pub(super) stream: u32,
}

impl Head {
    pub(super) fn parse(b: &[u8; HEAD_LEN]) -> Head {
        Head {
            len: (usize::from(b[0]) << 16) | (usize::from(b[1]) << 8) | usize::from(b[2]),
            kind: b[3],
            flags: b[4],
            stream: u32::from_be_bytes([b[5], b[6], b[7], b[8]]) & 0x7fff_ffff,
        }
    }

    pub(super) fn has(&self, flag: u8) -> bool {
        self.flags & flag != 0
    }

    pub(super) fn write(&self, out: &mut Vec<u8>) {
        let len = u32::try_from(self.len).unwrap_or(u32::MAX).to_be_bytes();
        out.extend_from_slice(&len[1..]);
        out.push(self.kind);
        out.push(self.flags);
        out.extend_from_slice(&(self.stream & 0x7fff_ffff).to_be_bytes());
    }
}

/// The parts of a HEADERS payload: its priority fields, if any, and its header-block fragment
/// with the padding removed.
pub(super) fn split_headers_payload(
    head: &Head,
    payload: &[u8],
) -> Result<(Option<[u8; 5]>, std::ops::Range<usize>), &'static str> {
    let mut start = 0;
    let mut end = payload.len();
    if head.has(FLAG_PADDED) {
        let Some(&pad) = payload.first() else {
            return Err("a padded HEADERS frame has no pad length");
        };
        start = 1;
        end = end
            .checked_sub(usize::from(pad))
            .filter(|e| *e >= start)
            .ok_or("a HEADERS frame has more padding than payload")?;
    }
    let priority = if head.has(FLAG_PRIORITY) {
        let fields = payload
            .get(start..start + 5)
            .filter(|_| start + 5 <= end)
            .ok_or("a HEADERS frame with PRIORITY is too short for its priority fields")?;
        start += 5;
        let mut p = [0u8; 5];
        p.copy_from_slice(fields);
        Some(p)
    } else {
        None
    };
    Ok((priority, start..end))
}

/// Appends a header block as one HEADERS frame plus as many CONTINUATION frames as it needs.
pub(super) fn write_header_block(
    stream: u32,
    end_stream: bool,
    priority: Option<[u8; 5]>,
    block: &[u8],
    out: &mut Vec<u8>,
) {
    let room = MIN_MAX_FRAME - if priority.is_some() { 5 } else { 0 };
    let (first, mut rest) = block.split_at(block.len().min(room));
    let mut flags = if end_stream { FLAG_END_STREAM } else { 0 };
    if rest.is_empty() {
        flags |= FLAG_END_HEADERS;
    }
    if priority.is_some() {
        flags |= FLAG_PRIORITY;
    }
    Head {
        len: first.len() + if priority.is_some() { 5 } else { 0 },
        kind: HEADERS,
        flags,
        stream,
    }
    .write(out);
    if let Some(p) = priority {
        out.extend_from_slice(&p);
    }
    out.extend_from_slice(first);
    while !rest.is_empty() {
        let (part, tail) = rest.split_at(rest.len().min(MIN_MAX_FRAME));
        rest = tail;
        Head {
            len: part.len(),
            kind: CONTINUATION,
            flags: if rest.is_empty() { FLAG_END_HEADERS } else { 0 },
            stream,
        }
        .write(out);
        out.extend_from_slice(part);
    }
}

/// Appends an RST_STREAM frame.
pub(super) fn write_rst_stream(stream: u32, error: u32, out: &mut Vec<u8>) {
    Head {
        len: 4,
        kind: RST_STREAM,
        flags: 0,
        stream,
    }
    .write(out);
    out.extend_from_slice(&error.to_be_bytes());
}

/// Appends a WINDOW_UPDATE frame.
pub(super) fn write_window_update(stream: u32, increment: u32, out: &mut Vec<u8>) {
    Head {
        len: 4,
        kind: WINDOW_UPDATE,
        flags: 0,
        stream,
    }
    .write(out);
    out.extend_from_slice(&(increment & 0x7fff_ffff).to_be_bytes());
}

/// Appends a GOAWAY frame whose debug data says what went wrong.
pub(super) fn write_goaway(last_stream: u32, error: u32, debug: &str, out: &mut Vec<u8>) {
    let debug = &debug.as_bytes()[..debug.len().min(MIN_MAX_FRAME - 8)];
    Head {
        len: 8 + debug.len(),
        kind: GOAWAY,
        flags: 0,
        stream: 0,
    }
    .write(out);
    out.extend_from_slice(&(last_stream & 0x7fff_ffff).to_be_bytes());
    out.extend_from_slice(&error.to_be_bytes());
    out.extend_from_slice(debug);
}

/// The `SETTINGS_HEADER_TABLE_SIZE` values in a SETTINGS payload.
pub(super) fn header_table_sizes(payload: &[u8]) -> impl Iterator<Item = usize> + '_ {
    payload
        .chunks_exact(6)
        .filter(|s| u16::from_be_bytes([s[0], s[1]]) == SETTING_HEADER_TABLE_SIZE)
        .map(|s| u32::from_be_bytes([s[2], s[3], s[4], s[5]]) as usize)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn head_of(bytes: &[u8]) -> Head {
        Head::parse(bytes[..HEAD_LEN].try_into().unwrap())
    }

    #[test]
    fn heads_round_trip() {
        let h = Head {
            len: 0x01_0203,
            kind: HEADERS,
            flags: FLAG_END_HEADERS | FLAG_END_STREAM,
            stream: 0x7fff_fffe,
        };
        let mut out = Vec::new();
        h.write(&mut out);
        assert_eq!(out.len(), HEAD_LEN);
        assert_eq!(head_of(&out), h);
        // The reserved bit of the stream identifier is ignored on reading.
        out[5] |= 0x80;
        assert_eq!(head_of(&out).stream, 0x7fff_fffe);
    }

    #[test]
    fn padding_and_priority_are_taken_off_the_fragment() {
        let head = Head {
            len: 0,
            kind: HEADERS,
            flags: FLAG_PADDED | FLAG_PRIORITY,
            stream: 1,
        };
        let payload = [2, 0, 0, 0, 3, 16, b'a', b'b', 0, 0];
        let (prio, range) = split_headers_payload(&head, &payload).unwrap();
        assert_eq!(prio, Some([0, 0, 0, 3, 16]));
        assert_eq!(&payload[range], b"ab");
        assert!(split_headers_payload(&head, &[9, 0, 0]).is_err());
        assert!(split_headers_payload(&head, &[]).is_err());
        let only_prio = Head {
            flags: FLAG_PRIORITY,
            ..head
        };
        assert!(split_headers_payload(&only_prio, &[0, 0, 0]).is_err());
    }

    #[test]
    fn a_large_block_is_split_into_continuations_of_legal_size() {
        let block = vec![7u8; MIN_MAX_FRAME * 2 + 10];
        let mut out = Vec::new();
        write_header_block(5, true, Some([0, 0, 0, 1, 0]), &block, &mut out);
        let mut at = 0;
        let mut frames = Vec::new();
        let mut carried = Vec::new();
        while at < out.len() {
            let h = head_of(&out[at..]);
            assert!(h.len <= MIN_MAX_FRAME);
            let payload = &out[at + HEAD_LEN..at + HEAD_LEN + h.len];
            carried.extend_from_slice(if h.kind == HEADERS {
                &payload[5..]
            } else {
                payload
            });
            frames.push(h);
            at += HEAD_LEN + h.len;
        }
        assert_eq!(carried, block);
        assert_eq!(frames.len(), 3);
        assert_eq!(frames[0].kind, HEADERS);
        assert!(frames[0].has(FLAG_END_STREAM) && frames[0].has(FLAG_PRIORITY));
        assert!(!frames[0].has(FLAG_END_HEADERS));
        assert_eq!(frames[1].kind, CONTINUATION);
        assert!(!frames[1].has(FLAG_END_HEADERS));
        assert!(frames[2].has(FLAG_END_HEADERS));
    }

    #[test]
    fn settings_name_their_header_table_size() {
        let payload = [0, 1, 0, 0, 0x10, 0, 0, 3, 0, 0, 0, 100];
        assert_eq!(header_table_sizes(&payload).collect::<Vec<_>>(), [4096]);
    }
}
