//! Block-style YAML, the way `kubectl get -o yaml` and YAML serializers print it, rewritten
//! as JSON text in one pass over its lines, so that a large dump is read by the JSON reader.
//!
//! The subset read: one or more documents (`---` separators, `...` ends) whose top is a
//! block mapping or block sequence; block mappings and sequences with any consistent
//! indentation, sequences indented under their key or at its column, `- key: value` items;
//! keys plain or quoted; values plain, single-quoted or double-quoted on one line, `{}`, `[]`
//! and literal block scalars (`|`, `|-`, `|+`); comments on their own lines and after values.
//! Plain values are typed as the YAML reader types them for a JSON value (`true`, `yes`,
//! `null`, `~`, `12`, `1.5`, `007` …), and only where that typing is certain.
//!
//! Anything else returns `None`, never an error: anchors, aliases, tags, flow collections with
//! content, complex keys, folded and multi-line scalars, tabs, duplicate keys, directives,
//! unusual plain values. The caller then reads the text with the full YAML reader, which also
//! words every error.

use std::borrow::Cow;
use std::collections::HashSet;
use std::fmt::Write as _;
use std::ops::Range;

/// The deepest nesting rewritten (the YAML reader's own limit is 64 levels).
const MAX_DEPTH: usize = 48;
/// The most documents rewritten (the YAML reader reads at most 1,024).
const MAX_DOCUMENTS: usize = 1_000;
/// The most keys, values and collections rewritten (the YAML reader's limit for cluster
/// dumps is 20 million).
const MAX_NODES: usize = 15_000_000;
/// The largest text rewritten, in bytes.
const MAX_BYTES: usize = 200 << 20;
/// Mappings with more keys than this check duplicates through a hash set.
const LINEAR_KEYS: usize = 32;

/// JSON text of every document of a YAML text, one after the other.
#[derive(Debug)]
pub(crate) struct JsonDocuments {
    json: String,
    documents: Vec<Range<usize>>,
}

impl JsonDocuments {
    /// Each document's JSON text, in order (empty documents are left out).
    pub(crate) fn iter(&self) -> impl Iterator<Item = &str> {
        self.documents.iter().map(|r| &self.json[r.clone()])
    }
}

/// The JSON text of `text`'s documents, or `None` for text outside the subset this module
/// reads (see the module's documentation).
pub(crate) fn to_json(text: &str) -> Option<JsonDocuments> {
    if text.len() > MAX_BYTES || !plain_characters(text) {
        return None;
    }
    let mut p = Parser {
        text,
        pos: 0,
        out: String::with_capacity(text.len() + text.len() / 8),
        keys: Vec::new(),
        scratch: String::new(),
        depth: 0,
        nodes: 0,
    };
    let documents = p.documents().ok()?;
    Some(JsonDocuments {
        json: p.out,
        documents,
    })
}

/// Whether `text` holds only characters the subset reads: no control characters other than
/// tab and line feed (no carriage returns), no C1 controls, no byte order marks.
fn plain_characters(text: &str) -> bool {
    let b = text.as_bytes();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'\n' | b'\t' => {}
            0..=0x1f | 0x7f => return false,
            // U+0080..U+009F (C1 controls, NEL included).
            0xc2 if b.get(i + 1).is_some_and(|c| (0x80..=0x9f).contains(c)) => return false,
            // U+FEFF (byte order mark), U+FFFE, U+FFFF.
            0xef if matches!(
                b.get(i + 1..i + 3),
                Some([0xbb, 0xbf] | [0xbf, 0xbe | 0xbf])
            ) =>
            {
                return false;
            }
            _ => {}
        }
        i += 1;
    }
    true
}

/// Text outside the subset.
#[derive(Debug)]
struct Unsupported;

type Step<T = ()> = Result<T, Unsupported>;

/// The type the YAML reader gives a plain value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Plain {
    Null,
    Bool(bool),
    /// An integer that fits 64 bits (written from its text).
    Int,
    Float(f64),
    Str,
}

/// The type of plain value `s` (trimmed, non-empty), or `None` where it is not certain.
pub(crate) fn plain_type(s: &str) -> Option<Plain> {
    match s {
        "~" | "null" | "Null" | "NULL" => return Some(Plain::Null),
        _ => {}
    }
    for (words, value) in [
        (["true", "yes", "y", "on"], true),
        (["false", "no", "n", "off"], false),
    ] {
        if words.iter().any(|w| s.eq_ignore_ascii_case(w)) {
            return Some(Plain::Bool(value));
        }
    }
    let unsigned = s.strip_prefix(['+', '-']).unwrap_or(s);
    let numeral = |t: &str| {
        t.bytes()
            .next()
            .is_some_and(|c| c.is_ascii_digit() || c == b'.')
    };
    if unsigned.len() < s.len() && unsigned.strip_prefix(['+', '-']).is_some_and(&numeral) {
        return None;
    }
    if !numeral(unsigned) {
        return Some(Plain::Str);
    }
    // Integers in other radixes and with `_` separators, and non-finite floats, are left
    // to the YAML reader; other text with those characters is a string.
    let b = unsigned.as_bytes();
    let radix = b.len() > 1 && b[0] == b'0' && matches!(b[1] | 0x20, b'x' | b'o' | b'b');
    if (radix && b[2..].iter().all(|c| c.is_ascii_hexdigit() || *c == b'_'))
        || (s.contains('_') && s.bytes().all(|c| b"0123456789_.eE+-".contains(&c)))
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
fn push_json_str(out: &mut String, s: &str) {
    out.push('"');
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
fn is_entry(content: &str) -> bool {
    content == "-" || content.starts_with("- ")
}

/// Whether `line` is the document marker `marker` (`---` or `...`), alone or with a comment.
/// `Err` for a line that starts with the marker's characters but is something else.
fn is_marker(line: &str, marker: &str) -> Step<bool> {
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
fn only_comment(rest: &str) -> Step {
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
fn quoted(s: &str) -> Step<(Cow<'_, str>, &str)> {
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
fn split_key(content: &str) -> Step<Option<(Cow<'_, str>, &str)>> {
    if content.starts_with(['"', '\'']) {
        let (key, after) = quoted(content)?;
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
fn check_plain(s: &str) -> Step {
    let b = s.as_bytes();
    match b.first() {
        None => Err(Unsupported),
        Some(b'[' | b']' | b'{' | b'}' | b',' | b'#' | b'&' | b'*' | b'!' | b'|' | b'>')
        | Some(b'\'' | b'"' | b'%' | b'@' | b'`') => Err(Unsupported),
        Some(b'-' | b'?' | b':') if b.len() == 1 || b[1] == b' ' => Err(Unsupported),
        _ => Ok(()),
    }
}

struct Parser<'a> {
    text: &'a str,
    /// Start of the current line.
    pos: usize,
    out: String,
    /// Keys of the mappings being read, innermost last.
    keys: Vec<Cow<'a, str>>,
    /// A literal block scalar's value being gathered.
    scratch: String,
    depth: usize,
    nodes: usize,
}

impl<'a> Parser<'a> {
    /// The current line (without its line feed), `None` at the end of the text.
    fn line(&self) -> Option<&'a str> {
        let rest = self.text.get(self.pos..).filter(|r| !r.is_empty())?;
        Some(rest.split_once('\n').map_or(rest, |(l, _)| l))
    }

    fn advance(&mut self) {
        self.pos = match self.text[self.pos..].find('\n') {
            Some(i) => self.pos + i + 1,
            None => self.text.len(),
        };
    }

    /// Skips blank and comment lines; the next line with content, as its indentation and
    /// its text from the first non-space character, without taking it. `None` at the end of
    /// the text or at a document marker.
    fn peek(&mut self) -> Step<Option<(usize, &'a str)>> {
        while let Some(line) = self.line() {
            if line.contains('\t') {
                return Err(Unsupported);
            }
            let content = line.trim_start_matches(' ');
            if content.is_empty() || content.starts_with('#') {
                self.advance();
                continue;
            }
            let indent = line.len() - content.len();
            if indent == 0 && (is_marker(line, "---")? || is_marker(line, "...")?) {
                return Ok(None);
            }
            return Ok(Some((indent, content)));
        }
        Ok(None)
    }

    fn count(&mut self) -> Step {
        self.nodes += 1;
        if self.nodes > MAX_NODES {
            return Err(Unsupported);
        }
        Ok(())
    }

    fn enter(&mut self) -> Step {
        self.depth += 1;
        self.count()?;
        if self.depth > MAX_DEPTH {
            return Err(Unsupported);
        }
        Ok(())
    }

    /// Every document, each written as JSON; their ranges in the output.
    fn documents(&mut self) -> Step<Vec<Range<usize>>> {
        let mut documents = Vec::new();
        let mut markers = 0;
        loop {
            let next = self.peek()?;
            let Some(line) = self.line() else { break };
            if next.is_none() {
                if is_marker(line, "...")? {
                    // An end marker: only comments, or the next document, may follow.
                    self.advance();
                    if self.peek()?.is_some() {
                        return Err(Unsupported);
                    }
                    continue;
                }
                // Empty documents (`---` right after `---`) are left out, as the YAML
                // reader leaves them out.
                markers += 1;
                if markers > MAX_DOCUMENTS {
                    return Err(Unsupported);
                }
                self.advance();
                continue;
            }
            if line.starts_with('%') {
                return Err(Unsupported);
            }
            let start = self.out.len();
            self.document()?;
            documents.push(start..self.out.len());
            if documents.len() > MAX_DOCUMENTS {
                return Err(Unsupported);
            }
        }
        Ok(documents)
    }

    /// One document with content: a block mapping or sequence, up to the next marker.
    fn document(&mut self) -> Step {
        let Some((indent, content)) = self.peek()? else {
            return Err(Unsupported);
        };
        if is_entry(content) {
            self.sequence(indent, None)?;
        } else {
            self.mapping(indent, None)?;
        }
        match self.peek()? {
            None => Ok(()),
            Some(_) => Err(Unsupported),
        }
    }

    /// What follows `key:` or `-` with nothing after it on the line, the key or entry at
    /// column `indent`: a collection on the next lines, or null.
    fn block_value(&mut self, indent: usize, compact: bool) -> Step {
        match self.peek()? {
            Some((i, c)) if i > indent => {
                if is_entry(c) {
                    self.sequence(i, None)
                } else {
                    self.mapping(i, None)
                }
            }
            Some((i, c)) if compact && i == indent && is_entry(c) => self.sequence(i, None),
            _ => {
                self.count()?;
                self.out.push_str("null");
                Ok(())
            }
        }
    }

    /// A block mapping whose keys are at column `indent`; `first` is its first entry when
    /// that is on the current line after a sequence's `- `.
    fn mapping(&mut self, indent: usize, mut first: Option<&'a str>) -> Step {
        self.enter()?;
        self.out.push('{');
        let start = self.keys.len();
        let mut many: Option<HashSet<Cow<'a, str>>> = None;
        loop {
            let content = match first.take() {
                Some(c) => c,
                None => match self.peek()? {
                    Some((i, c)) if i == indent && !is_entry(c) => c,
                    Some((i, _)) if i >= indent => return Err(Unsupported),
                    _ => break,
                },
            };
            let (key, rest) = split_key(content)?.ok_or(Unsupported)?;
            self.count()?;
            if self.keys.len() > start {
                self.out.push(',');
            }
            push_json_str(&mut self.out, &key);
            self.out.push(':');
            let repeated = match &mut many {
                Some(set) => !set.insert(key.clone()),
                None => self.keys[start..].contains(&key),
            };
            if repeated {
                return Err(Unsupported);
            }
            self.keys.push(key);
            if many.is_none() && self.keys.len() - start > LINEAR_KEYS {
                many = Some(self.keys[start..].iter().cloned().collect());
            }
            self.value(indent, rest, true)?;
        }
        self.keys.truncate(start);
        self.out.push('}');
        self.depth -= 1;
        Ok(())
    }

    /// A block sequence whose `-` are at column `indent`; `first` is its first entry when
    /// that is on the current line after an outer sequence's `- `.
    fn sequence(&mut self, indent: usize, mut first: Option<&'a str>) -> Step {
        self.enter()?;
        self.out.push('[');
        let mut count = 0;
        loop {
            let content = match first.take() {
                Some(c) => c,
                None => match self.peek()? {
                    Some((i, c)) if i == indent && is_entry(c) => c,
                    Some((i, _)) if i > indent => return Err(Unsupported),
                    _ => break,
                },
            };
            if count > 0 {
                self.out.push(',');
            }
            count += 1;
            let after = &content[1..];
            let item = after.trim_start_matches(' ');
            let column = indent + 1 + after.len() - item.len();
            if is_entry(item) {
                self.sequence(column, Some(item))?;
            } else if split_key(item)?.is_some() {
                self.mapping(column, Some(item))?;
            } else {
                self.value(indent, after, false)?;
            }
        }
        self.out.push(']');
        self.depth -= 1;
        Ok(())
    }

    /// The value after a key (or `-`) at column `indent`, starting with `rest` on the
    /// current line, which this takes. `compact`: a sequence may sit at the key's column.
    fn value(&mut self, indent: usize, rest: &'a str, compact: bool) -> Step {
        let v = rest.trim_start_matches(' ');
        self.advance();
        if v.is_empty() || v.starts_with('#') {
            if !v.is_empty() && v.len() == rest.len() {
                return Err(Unsupported);
            }
            return self.block_value(indent, compact);
        }
        self.count()?;
        if let Some(header) = v.strip_prefix('|') {
            return self.literal(indent, header);
        }
        if v.starts_with(['"', '\'']) {
            let (s, after) = quoted(v)?;
            only_comment(after)?;
            push_json_str(&mut self.out, &s);
        } else if let Some(after) = v.strip_prefix("{}").or_else(|| v.strip_prefix("[]")) {
            only_comment(after)?;
            self.out.push_str(&v[..2]);
        } else {
            let end = v.find(" #").unwrap_or(v.len());
            let s = v[..end].trim_end_matches(' ');
            check_plain(s)?;
            if s.contains(": ") || s.ends_with(':') {
                return Err(Unsupported);
            }
            match plain_type(s).ok_or(Unsupported)? {
                Plain::Null => self.out.push_str("null"),
                Plain::Bool(b) => self.out.push_str(if b { "true" } else { "false" }),
                Plain::Int => {
                    let s = s.strip_prefix('+').unwrap_or(s);
                    if s == "-0" {
                        self.out.push('0');
                    } else {
                        self.out.push_str(s);
                    }
                }
                Plain::Float(f) => {
                    // Only a float the JSON reader reads back exactly.
                    let start = self.out.len();
                    let n = serde_json::Number::from_f64(f).ok_or(Unsupported)?;
                    let _ = write!(self.out, "{n}");
                    if serde_json::from_str::<f64>(&self.out[start..]).ok() != Some(f) {
                        return Err(Unsupported);
                    }
                }
                Plain::Str => push_json_str(&mut self.out, s),
            }
        }
        // A more indented line after a one-line value would continue it.
        match self.peek()? {
            Some((i, _)) if i > indent => Err(Unsupported),
            _ => Ok(()),
        }
    }

    /// A literal block scalar whose header (after `|`) is `header`, under a key or `-` at
    /// column `indent`; the header line is taken already.
    fn literal(&mut self, indent: usize, header: &str) -> Step {
        // Chomping (`-` strip, `+` keep) and indentation (a digit) indicators, in any order.
        let mut chomp = None;
        let mut content_indent = None;
        let mut after = header;
        for _ in 0..2 {
            match after.as_bytes().first() {
                Some(b'-') if chomp.is_none() => chomp = Some(false),
                Some(b'+') if chomp.is_none() => chomp = Some(true),
                Some(d @ b'1'..=b'9') if content_indent.is_none() => {
                    content_indent = Some(indent + usize::from(d - b'0'));
                }
                _ => break,
            }
            after = &after[1..];
        }
        if !after.is_empty() {
            only_comment(after)?;
        }
        let mut value = std::mem::take(&mut self.scratch);
        value.clear();
        let mut seen = false;
        let mut leading_blank = 0;
        while let Some(line) = self.line() {
            let spaces = line.len() - line.trim_start_matches(' ').len();
            let blank = spaces == line.len();
            match content_indent {
                Some(ci) if blank && spaces <= ci => value.push('\n'),
                Some(ci) if spaces >= ci => {
                    value.push_str(&line[ci..]);
                    value.push('\n');
                    seen = true;
                }
                Some(_) => break,
                None if blank => {
                    leading_blank = leading_blank.max(spaces);
                    value.push('\n');
                }
                None => {
                    if spaces <= indent {
                        break;
                    }
                    if leading_blank > spaces {
                        return Err(Unsupported);
                    }
                    content_indent = Some(spaces);
                    value.push_str(&line[spaces..]);
                    value.push('\n');
                    seen = true;
                }
            }
            self.advance();
        }
        if !seen && chomp != Some(true) {
            value.clear();
        }
        match chomp {
            Some(true) => {}
            Some(false) => value.truncate(value.trim_end_matches('\n').len()),
            None => {
                value.truncate(value.trim_end_matches('\n').len());
                if !value.is_empty() {
                    value.push('\n');
                }
            }
        }
        push_json_str(&mut self.out, &value);
        self.scratch = value;
        Ok(())
    }
}
