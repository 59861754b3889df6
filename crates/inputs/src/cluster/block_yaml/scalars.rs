//! The scalars and keys of one line of block-style YAML: plain values typed as the YAML
//! reader types them, quoted values decoded, and JSON strings written.

use std::borrow::Cow;
use std::fmt::Write as _;

/// Text outside the subset.
#[derive(Debug)]
pub(super) struct Unsupported;

pub(super) type Step<T = ()> = Result<T, Unsupported>;

/// The type the YAML reader gives a plain value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Plain {
    Null,
    Bool(bool),
    /// An integer that fits 64 bits (written from its text).
    Int,
    Float(f64),
    Str,
}

/// The type of plain value `s` (trimmed, non-empty), or `None` where it is not certain.
pub(super) fn plain_type(s: &str) -> Option<Plain> {
    match s {
        "~" | "null" | "Null" | "NULL" => return Some(Plain::Null),
        _ => {}
    }
    let maybe_word = s
        .bytes()
        .next()
        .is_some_and(|c| matches!(c | 0x20, b't' | b'f' | b'y' | b'n' | b'o'));
    if s.len() <= 5 && maybe_word {
        for (words, value) in [
            (["true", "yes", "y", "on"], true),
            (["false", "no", "n", "off"], false),
        ] {
            if words.iter().any(|w| s.eq_ignore_ascii_case(w)) {
                return Some(Plain::Bool(value));
            }
        }
    }
    let unsigned = s.strip_prefix(['+', '-']).unwrap_or(s);
    let numeral = |t: &str| {
        t.bytes()
            .next()
            .is_some_and(|c| c.is_ascii_digit() || c == b'.')
    };
    if !numeral(unsigned) {
        return Some(Plain::Str);
    }
    // Integers in other radixes and with `_` separators, and non-finite floats, are left
    // to the YAML reader; other text with those characters is a string (floats have no
    // `_` separators).
    let b = unsigned.as_bytes();
    // A prefix with no digits after it (`0B`, `0x`) is no number in any radix.
    let radix = b.len() > 2 && b[0] == b'0' && matches!(b[1] | 0x20, b'x' | b'o' | b'b');
    let radix_digit = |c: u8| match b[1] | 0x20 {
        b'x' => c.is_ascii_hexdigit(),
        b'o' => (b'0'..=b'7').contains(&c),
        _ => c == b'0' || c == b'1',
    };
    if (radix && b[2..].iter().all(|c| radix_digit(*c) || *c == b'_'))
        || (unsigned.contains('_') && unsigned.bytes().all(|c| c.is_ascii_digit() || c == b'_'))
        || unsigned.eq_ignore_ascii_case(".inf")
        || unsigned.eq_ignore_ascii_case(".nan")
    {
        return None;
    }
    let digits = |t: &str| !t.is_empty() && t.bytes().all(|c| c.is_ascii_digit());
    if digits(unsigned) && (unsigned == "0" || !unsigned.starts_with('0')) {
        let fits = if s.starts_with('-') {
            s.parse::<i64>().is_ok()
        } else {
            unsigned.parse::<u64>().is_ok()
        };
        return fits.then_some(Plain::Int);
    }
    let (mantissa, exponent) = match unsigned.find(['e', 'E']) {
        Some(i) => (&unsigned[..i], Some(&unsigned[i + 1..])),
        None => (unsigned, None),
    };
    let (whole, fraction) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let mantissa_ok = (whole.is_empty() || digits(whole))
        && (fraction.is_empty() || digits(fraction))
        && !(whole.is_empty() && fraction.is_empty());
    let exponent_ok = exponent.is_none_or(|e| digits(e.strip_prefix(['+', '-']).unwrap_or(e)));
    if !(mantissa_ok && exponent_ok) {
        return Some(Plain::Str);
    }
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() => Some(Plain::Float(v)),
        _ => None,
    }
}

/// Appends `s` to `out` as a JSON string.
pub(super) fn push_json_str(out: &mut String, s: &str) {
    out.push('"');
    if !s
        .bytes()
        .any(|b| b == b'"' || b == b'\\' || b < 0x20 || b == 0x7f)
    {
        out.push_str(s);
        out.push('"');
        return;
    }
    let mut start = 0;
    for (i, b) in s.bytes().enumerate() {
        let escape = match b {
            b'"' => "\\\"",
            b'\\' => "\\\\",
            b'\n' => "\\n",
            b'\t' => "\\t",
            0..=0x1f | 0x7f => "",
            _ => continue,
        };
        out.push_str(&s[start..i]);
        if escape.is_empty() {
            let _ = write!(out, "\\u{b:04x}");
        } else {
            out.push_str(escape);
        }
        start = i + 1;
    }
    out.push_str(&s[start..]);
    out.push('"');
}

/// Whether `content` (a line from its first non-space character) is a sequence entry.
pub(super) fn is_entry(content: &str) -> bool {
    content == "-" || content.starts_with("- ")
}

/// Whether `line` is the document marker `marker` (`---` or `...`), alone or with a comment.
/// `Err` for a line that starts with the marker's characters but is something else.
pub(super) fn is_marker(line: &str, marker: &str) -> Step<bool> {
    match line.strip_prefix(marker) {
        None => Ok(false),
        Some(rest) if rest.trim_start_matches(' ').is_empty() => Ok(true),
        Some(rest) if rest.starts_with(" ") && rest.trim_start_matches(' ').starts_with('#') => {
            Ok(true)
        }
        Some(_) => Err(Unsupported),
    }
}

/// `rest` (what follows a value on its line) is empty or a comment.
pub(super) fn only_comment(rest: &str) -> Step {
    let t = rest.trim_start_matches(' ');
    if t.is_empty() || (t.starts_with('#') && t.len() < rest.len()) {
        Ok(())
    } else {
        Err(Unsupported)
    }
}

/// A quoted scalar at the start of `s` (which starts with its quote): its value and the text
/// after its closing quote. `Err` for one that does not close on this line or has an escape
/// this module does not decode.
pub(super) fn quoted(s: &str) -> Step<(Cow<'_, str>, &str)> {
    if let Some(body) = s.strip_prefix('\'') {
        let mut value: Option<String> = None;
        let mut start = 0;
        let b = body.as_bytes();
        let mut i = 0;
        while i < b.len() {
            if b[i] == b'\'' {
                if b.get(i + 1) == Some(&b'\'') {
                    let v = value.get_or_insert_with(String::new);
                    v.push_str(&body[start..=i]);
                    i += 2;
                    start = i;
                    continue;
                }
                let rest = &body[i + 1..];
                return Ok(match value {
                    None => (Cow::Borrowed(&body[..i]), rest),
                    Some(mut v) => {
                        v.push_str(&body[start..i]);
                        (Cow::Owned(v), rest)
                    }
                });
            }
            i += 1;
        }
        return Err(Unsupported);
    }
    let body = s.strip_prefix('"').ok_or(Unsupported)?;
    let end = body.find(['"', '\\']).ok_or(Unsupported)?;
    if body.as_bytes()[end] == b'"' {
        return Ok((Cow::Borrowed(&body[..end]), &body[end + 1..]));
    }
    let mut value = String::from(&body[..end]);
    let mut chars = body[end..].char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '"' => return Ok((Cow::Owned(value), &body[end + i + 1..])),
            '\\' => {
                let (_, e) = chars.next().ok_or(Unsupported)?;
                let simple = match e {
                    '"' | '\\' | '/' | ' ' => Some(e),
                    'n' => Some('\n'),
                    't' => Some('\t'),
                    'r' => Some('\r'),
                    'b' => Some('\u{8}'),
                    'f' => Some('\u{c}'),
                    '0' => Some('\0'),
                    'a' => Some('\u{7}'),
                    'v' => Some('\u{b}'),
                    'e' => Some('\u{1b}'),
                    'N' => Some('\u{85}'),
                    '_' => Some('\u{a0}'),
                    'L' => Some('\u{2028}'),
                    'P' => Some('\u{2029}'),
                    _ => None,
                };
                let c = match simple {
                    Some(c) => c,
                    None => {
                        let len = match e {
                            'x' => 2,
                            'u' => 4,
                            'U' => 8,
                            _ => return Err(Unsupported),
                        };
                        let mut code = 0u32;
                        for _ in 0..len {
                            let (_, h) = chars.next().ok_or(Unsupported)?;
                            code = code * 16 + h.to_digit(16).ok_or(Unsupported)?;
                        }
                        char::from_u32(code).ok_or(Unsupported)?
                    }
                };
                value.push(c);
            }
            c => value.push(c),
        }
    }
    Err(Unsupported)
}

/// The key at the start of `content` and the text after its `:`; `None` when `content` is
/// not a mapping entry (a scalar). `Err` for a key outside the subset.
pub(super) fn split_key(content: &str) -> Step<Option<(Cow<'_, str>, &str)>> {
    if content.starts_with(['"', '\'']) {
        // A quoted value that does not close on this line is no key.
        let Ok((key, after)) = quoted(content) else {
            return Ok(None);
        };
        let t = after.trim_start_matches(' ');
        return match t.strip_prefix(':') {
            Some(rest) if rest.is_empty() || rest.starts_with(' ') => Ok(Some((key, rest))),
            _ => Ok(None),
        };
    }
    let b = content.as_bytes();
    for i in 0..b.len() {
        match b[i] {
            b':' if i + 1 == b.len() || b[i + 1] == b' ' => {
                let key = content[..i].trim_end_matches(' ');
                check_plain(key)?;
                if key == "<<" || plain_type(key) != Some(Plain::Str) {
                    return Err(Unsupported);
                }
                return Ok(Some((Cow::Borrowed(key), &content[i + 1..])));
            }
            b'#' if i > 0 && b[i - 1] == b' ' => return Ok(None),
            _ => {}
        }
    }
    Ok(None)
}

/// `s` (trimmed, non-empty) may be a plain scalar: it does not start with an indicator.
pub(super) fn check_plain(s: &str) -> Step {
    let b = s.as_bytes();
    match b.first() {
        None => Err(Unsupported),
        Some(b'[' | b']' | b'{' | b'}' | b',' | b'#' | b'&' | b'*' | b'!' | b'|' | b'>')
        | Some(b'\'' | b'"' | b'%' | b'@' | b'`') => Err(Unsupported),
        Some(b'-' | b'?' | b':') if b.len() == 1 || b[1] == b' ' => Err(Unsupported),
        _ => Ok(()),
    }
}
