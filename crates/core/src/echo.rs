//! Text from outside kubedev, and errors with their causes, made fit for an error message or a
//! log line.
//!
//! A value that came from the kubelet, the API server, a configuration file, sysfs or a policy
//! may be of any length and hold any bytes. [`echo`] quotes it as `{:?}` would, but stops after
//! [`ECHO_LIMIT`] bytes of output (saying how long the value was) and escapes every control
//! character, so that a 1 MiB claim UID cannot make a 1 MiB error, and a newline or an escape
//! sequence in a namespace cannot forge a log line or reach an operator's terminal.
//!
//! [`chain`] renders an error followed by each of its causes, once, so that the operating
//! system's reason ("No space left on device (os error 28)") survives the trip to the kubelet
//! and the log.
//!
//! ```
//! use kubedev_core::echo::{chain, echo};
//!
//! assert_eq!(echo("gpu-0").to_string(), "\"gpu-0\"");
//! assert_eq!(echo("a\nb\x1b[31m").to_string(), "\"a\\nb\\u{1b}[31m\"");
//! let long = "x".repeat(1 << 20);
//! assert!(echo(&long).to_string().ends_with("…\" (1048576 bytes)"));
//!
//! #[derive(Debug, thiserror::Error)]
//! #[error("writing spec.json failed")]
//! struct Write(#[source] std::io::Error);
//! let e = Write(std::io::Error::from_raw_os_error(28));
//! assert_eq!(chain(&e), "writing spec.json failed: No space left on device (os error 28)");
//! ```

use std::error::Error;
use std::fmt::{self, Write as _};

/// The most bytes an echoed value contributes to a message, quotes and escapes included (the
/// marker of a cut value and its length come on top).
pub const ECHO_LIMIT: usize = 256;

/// A value from outside, as it appears in an error or a log line: quoted, control characters
/// escaped, and cut after [`ECHO_LIMIT`] bytes with its original length stated.
#[derive(Clone, Copy)]
pub struct Echo<'a>(&'a str);

/// `value`, quoted, escaped and bounded for an error message or a log line.
pub fn echo(value: &str) -> Echo<'_> {
    Echo(value)
}

impl fmt::Display for Echo<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut written = 2; // the quotes
        let mut piece = String::new();
        f.write_char('"')?;
        for c in self.0.chars() {
            piece.clear();
            escape_into(c, &mut piece);
            if written + piece.len() > ECHO_LIMIT {
                return write!(f, "…\" ({} bytes)", self.0.len());
            }
            written += piece.len();
            f.write_str(&piece)?;
        }
        f.write_char('"')
    }
}

impl fmt::Debug for Echo<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// One character as `{:?}` of a string writes it: control characters, quotes and backslashes
/// escaped; printable characters as they are.
fn escape_into(c: char, out: &mut String) {
    match c {
        '"' => out.push_str("\\\""),
        '\\' => out.push_str("\\\\"),
        c if c.is_control() || is_format_char(c) => out.extend(c.escape_default()),
        c => out.push(c),
    }
}

/// Unicode characters that change how text around them is shown (bidirectional overrides,
/// zero-width marks): escaped like control characters, so an echo reads as what it holds.
fn is_format_char(c: char) -> bool {
    matches!(c, '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{feff}')
}

/// `error` and each of its causes, joined by `": "`, as one line. A cause whose text the message
/// before it already contains is not repeated, so errors that print their source themselves
/// come out the same.
pub fn chain(error: &(dyn Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(c) = cause {
        let more = c.to_string();
        if !more.is_empty() && !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        cause = c.source();
    }
    text
}

/// [`chain`] as a `Display` value, for log fields: `error = %Chain(&e)`.
#[derive(Clone, Copy)]
pub struct Chain<'a>(pub &'a (dyn Error + 'static));

impl fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&chain(self.0))
    }
}

impl fmt::Debug for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Every control character of a formatted log line escaped, except its final newline: one event
/// stays one line whatever its fields hold. Tabs stay; `keep_escape` keeps the ESC bytes of a
/// terminal's colours (the log formatter escapes those in field values itself).
pub fn escape_log_line(line: &str, keep_escape: bool) -> std::borrow::Cow<'_, str> {
    let body = line.strip_suffix('\n').unwrap_or(line);
    let bad = |c: char| c.is_control() && c != '\t' && !(keep_escape && c == '\x1b');
    if !body.contains(bad) {
        return std::borrow::Cow::Borrowed(line);
    }
    let mut out = String::with_capacity(line.len() + 16);
    for c in body.chars() {
        if bad(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    if body.len() < line.len() {
        out.push('\n');
    }
    std::borrow::Cow::Owned(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn short_values_read_as_debug_quotes_them() {
        for v in ["", "gpu-0", "ns/name", "a\"b\\c", "ünï", "tab\there"] {
            assert_eq!(echo(v).to_string(), format!("{v:?}"), "{v}");
        }
    }

    #[test]
    fn control_bytes_never_come_out_raw() {
        let hostile = "a\0b\nc\r\x1b[2Jd\x07\u{202e}e\u{85}";
        let out = echo(hostile).to_string();
        assert!(!out.chars().any(|c| c.is_control()), "{out:?}");
        assert_eq!(out, "\"a\\u{0}b\\nc\\r\\u{1b}[2Jd\\u{7}\\u{202e}e\\u{85}\"");
    }

    #[test]
    fn a_mebibyte_is_cut_with_its_length() {
        let v = "u".repeat(1 << 20);
        let out = echo(&v).to_string();
        assert!(out.len() <= ECHO_LIMIT + 32, "{}", out.len());
        assert!(out.ends_with("…\" (1048576 bytes)"), "{out}");
        // All escapes: the bound holds on the escaped form, and no escape is cut in half.
        let v = "\x1b".repeat(1 << 20);
        let out = echo(&v).to_string();
        assert!(out.len() <= ECHO_LIMIT + 32, "{}", out.len());
        assert!(out.contains("\\u{1b}…\""), "{out}");
        // A value that fits exactly is not cut.
        let v = "a".repeat(ECHO_LIMIT - 2);
        assert_eq!(echo(&v).to_string(), format!("\"{v}\""));
        let v = "a".repeat(ECHO_LIMIT - 1);
        assert!(echo(&v).to_string().ends_with(" (255 bytes)"));
        // Multi-byte characters are never split.
        let v = "é".repeat(1000);
        assert!(echo(&v).to_string().starts_with("\"éé"));
    }

    #[derive(Debug, thiserror::Error)]
    #[error("writing {0} failed")]
    struct Outer(&'static str, #[source] Middle);

    #[derive(Debug, thiserror::Error)]
    #[error("CDI: {0}")]
    struct Middle(#[from] std::io::Error);

    #[test]
    fn chain_names_each_cause_once() {
        let e = Outer("spec.json", Middle(std::io::Error::from_raw_os_error(28)));
        // `Middle` prints its source itself: the io::Error is not repeated.
        assert_eq!(
            chain(&e),
            "writing spec.json failed: CDI: No space left on device (os error 28)"
        );
        assert_eq!(Chain(&e).to_string(), chain(&e));
        let plain = std::io::Error::from_raw_os_error(13);
        assert_eq!(chain(&plain), "Permission denied (os error 13)");
    }

    #[test]
    fn log_lines_stay_one_line() {
        assert!(matches!(
            escape_log_line("plain line\n", false),
            std::borrow::Cow::Borrowed(_)
        ));
        assert_eq!(
            escape_log_line("a\nforged\0\x1b[31m\n", false),
            "a\\nforged\\u{0}\\u{1b}[31m\n"
        );
        assert_eq!(
            escape_log_line("\x1b[2mcolour\x1b[0m x\ry\n", true),
            "\x1b[2mcolour\x1b[0m x\\ry\n"
        );
        assert_eq!(escape_log_line("no newline\n\n", false), "no newline\\n\n");
    }
}
