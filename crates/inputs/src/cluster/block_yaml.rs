//! Block-style YAML, the way `kubectl get -o yaml` and YAML serializers print it, rewritten
//! as JSON text in one pass over its lines, so that a large dump is read by the JSON reader.
//!
//! The subset read: one or more documents (`---` separators, `...` ends) whose top is a
//! block mapping or block sequence; block mappings and sequences with any consistent
//! indentation, sequences indented under their key or at its column, `- key: value` and
//! `- - item` entries; keys plain or quoted, on one line; values plain or single-quoted
//! (continued on more indented lines, as kubectl wraps long values), double-quoted on one
//! line, `{}`, `[]`, literal (`|`) and folded (`>`) block scalars with their indicators;
//! comments on their own lines and after values. Plain values are typed as the YAML reader
//! types them for a JSON value (`true`, `yes`, `null`, `~`, `12`, `1.5`, `007` …), and only
//! where that typing is certain.
//!
//! Anything else returns `None`, never an error: anchors, aliases, tags, flow collections with
//! content, complex keys, double-quoted values over several lines, tabs outside block scalars,
//! duplicate keys, merge keys, directives, unusual plain values (`0x1F`, `1_000`, `.inf`),
//! and sizes near the YAML reader's limits. The caller then reads the text with the full YAML
//! reader, which also words every error.

use std::borrow::Cow;
use std::collections::HashSet;
use std::fmt::Write as _;
use std::ops::Range;

mod multiline;
mod scalars;

use multiline::fold;
use scalars::{
    Plain, Step, Unsupported, check_plain, is_entry, is_marker, only_comment, plain_type,
    push_json_str, quoted, split_key,
};

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
pub(crate) struct JsonDocuments<'a> {
    json: String,
    documents: Vec<Document<'a>>,
    /// Where the elements of lists that are top-level values are in `json`.
    elements: Vec<Range<usize>>,
}

/// Where one document's JSON text is in the output, and its top-level values.
#[derive(Debug)]
struct Document<'a> {
    range: Range<usize>,
    top: Vec<TopValue<'a>>,
}

/// A top-level key of a document: where its value's JSON text is and, for a list, where
/// its elements' ranges are in the list of elements.
#[derive(Debug)]
struct TopValue<'a> {
    key: Cow<'a, str>,
    value: Range<usize>,
    elements: Range<usize>,
}

/// One document as JSON.
pub(crate) struct JsonDocument<'d> {
    /// Its JSON text.
    pub(crate) json: &'d str,
    all: &'d JsonDocuments<'d>,
    top: &'d [TopValue<'d>],
}

impl<'d> JsonDocument<'d> {
    fn top_value(&self, key: &str) -> Option<&'d TopValue<'d>> {
        self.top.iter().find(|t| t.key == key)
    }

    /// The JSON text of top-level key `key`'s value, where the document is a mapping with
    /// that key.
    pub(crate) fn value(&self, key: &str) -> Option<&'d str> {
        let all = self.all;
        self.top_value(key).map(|t| &all.json[t.value.clone()])
    }

    /// The JSON texts of the elements of top-level key `key`'s value, where that is a list.
    pub(crate) fn elements(&self, key: &str) -> Option<impl Iterator<Item = &'d str>> {
        let all = self.all;
        let t = self.top_value(key)?;
        all.json[t.value.clone()].starts_with('[').then(|| {
            all.elements[t.elements.clone()]
                .iter()
                .map(|r| &all.json[r.clone()])
        })
    }
}

impl JsonDocuments<'_> {
    /// Each document, in order (empty documents are left out).
    pub(crate) fn iter(&self) -> impl Iterator<Item = JsonDocument<'_>> {
        self.documents.iter().map(|d| JsonDocument {
            json: &self.json[d.range.clone()],
            all: self,
            top: &d.top,
        })
    }
}

/// The JSON text of `text`'s documents, or `None` for text outside the subset this module
/// reads (see the module's documentation).
pub(crate) fn to_json(text: &str) -> Option<JsonDocuments<'_>> {
    if text.len() > MAX_BYTES || !plain_characters(text) {
        return None;
    }
    let mut p = Parser {
        text,
        pos: 0,
        end: 0,
        indent: 0,
        tabs: text.contains('\t'),
        top: Vec::new(),
        elements: Vec::new(),
        out: String::with_capacity(text.len() + text.len() / 8),
        keys: Vec::new(),
        scratch: String::new(),
        depth: 0,
        nodes: 0,
    };
    p.go_to(0);
    let documents = p.documents().ok()?;
    Some(JsonDocuments {
        json: p.out,
        documents,
        elements: p.elements,
    })
}

/// Whether `text` holds only characters the subset reads: no control characters other than
/// tab and line feed (no carriage returns), no C1 controls, no byte order marks.
fn plain_characters(text: &str) -> bool {
    // Most text is printable ASCII: that is checked a block at a time.
    let odd = |c: u8| (c < 0x20 && c != b'\n' && c != b'\t') || c >= 0x7f;
    if text
        .as_bytes()
        .chunks(64)
        .all(|chunk| !chunk.iter().fold(false, |any, &c| any | odd(c)))
    {
        return true;
    }
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

/// Where the line starting at `start` ends (its line feed, or the end of the text).
fn line_end(text: &str, start: usize) -> usize {
    text.get(start..)
        .and_then(|rest| rest.find('\n'))
        .map_or(text.len(), |i| start + i)
}

/// Where the comment in `s` starts (a `#` after a space), if it has one.
fn comment_start(s: &str) -> Option<usize> {
    let b = s.as_bytes();
    let mut from = 0;
    while let Some(i) = b[from..].iter().position(|&c| c == b'#') {
        let at = from + i;
        if at > 0 && b[at - 1] == b' ' {
            return Some(at - 1);
        }
        from = at + 1;
    }
    None
}

/// The rewriting of one text: where it stands in the text, and the JSON written so far.
struct Parser<'a> {
    text: &'a str,
    /// Start of the current line.
    pos: usize,
    /// End of the current line (its line feed, or the end of the text).
    end: usize,
    /// The number of spaces the current line starts with.
    indent: usize,
    /// Whether the text has a tab anywhere.
    tabs: bool,
    /// The current document's top-level values.
    top: Vec<TopValue<'a>>,
    /// Where the elements of lists that are top-level values are in the output.
    elements: Vec<Range<usize>>,
    /// The JSON text written.
    out: String,
    /// Keys of the mappings being read, innermost last.
    keys: Vec<Cow<'a, str>>,
    /// A value over several lines being gathered.
    scratch: String,
    /// How many mappings and lists are open.
    depth: usize,
    /// How many keys, values, mappings and lists were read.
    nodes: usize,
}

impl<'a> Parser<'a> {
    /// The current line (without its line feed), `None` at the end of the text.
    fn line(&self) -> Option<&'a str> {
        (self.pos < self.text.len()).then(|| &self.text[self.pos..self.end])
    }

    /// The current line as its indentation and its text from the first non-space
    /// character, `None` at the end of the text.
    fn indented(&self) -> Option<(usize, &'a str)> {
        (self.pos < self.text.len())
            .then(|| (self.indent, &self.text[self.pos + self.indent..self.end]))
    }

    /// Moves to the next line.
    fn advance(&mut self) {
        self.go_to((self.end + 1).min(self.text.len()));
    }

    /// Moves to the line starting at `start`.
    fn go_to(&mut self, start: usize) {
        self.pos = start;
        self.end = line_end(self.text, start);
        let line = &self.text.as_bytes()[start..self.end];
        self.indent = line.iter().position(|&c| c != b' ').unwrap_or(line.len());
    }

    /// The current line, to come back to it with [`Self::back_to`].
    fn mark(&self) -> (usize, usize, usize) {
        (self.pos, self.end, self.indent)
    }

    /// Comes back to the line at `mark`.
    fn back_to(&mut self, mark: (usize, usize, usize)) {
        (self.pos, self.end, self.indent) = mark;
    }

    /// Skips blank and comment lines; the next line with content, as its indentation and
    /// its text from the first non-space character, without taking it. `None` at the end of
    /// the text or at a document marker.
    fn peek(&mut self) -> Step<Option<(usize, &'a str)>> {
        while let Some((indent, content)) = self.indented() {
            if content.is_empty() || content.starts_with('#') {
                self.advance();
                continue;
            }
            if self.tabs && content.contains('\t') {
                return Err(Unsupported);
            }
            if indent == 0 && (is_marker(content, "---")? || is_marker(content, "...")?) {
                return Ok(None);
            }
            return Ok(Some((indent, content)));
        }
        Ok(None)
    }

    /// Counts one key, value, mapping or list; `Err` past the most rewritten.
    fn count(&mut self) -> Step {
        self.nodes += 1;
        if self.nodes > MAX_NODES {
            return Err(Unsupported);
        }
        Ok(())
    }

    /// Opens a mapping or list; `Err` past the deepest nesting rewritten.
    fn enter(&mut self) -> Step {
        self.depth += 1;
        self.count()?;
        if self.depth > MAX_DEPTH {
            return Err(Unsupported);
        }
        Ok(())
    }

    /// Every document, each written as JSON; their ranges in the output.
    fn documents(&mut self) -> Step<Vec<Document<'a>>> {
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
            self.top.clear();
            self.document()?;
            documents.push(Document {
                range: start..self.out.len(),
                top: std::mem::take(&mut self.top),
            });
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
            let top_key = (self.depth == 1).then(|| key.clone());
            self.keys.push(key);
            if many.is_none() && self.keys.len() - start > LINEAR_KEYS {
                many = Some(self.keys[start..].iter().cloned().collect());
            }
            let (value_start, elements_start) = (self.out.len(), self.elements.len());
            self.value(indent, rest, true)?;
            if let Some(key) = top_key {
                self.top.push(TopValue {
                    key,
                    value: value_start..self.out.len(),
                    elements: elements_start..self.elements.len(),
                });
            }
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
            let start = self.out.len();
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
            // The elements of a top-level value.
            if self.depth == 2 {
                self.elements.push(start..self.out.len());
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
            return self.block_scalar(indent, header, false);
        }
        if let Some(header) = v.strip_prefix('>') {
            return self.block_scalar(indent, header, true);
        }
        if v.starts_with(['"', '\'']) {
            match quoted(v) {
                Ok((s, after)) => {
                    only_comment(after)?;
                    push_json_str(&mut self.out, &s);
                }
                Err(_) if v.starts_with('\'') => self.single_quoted_lines(indent, &v[1..])?,
                Err(e) => return Err(e),
            }
        } else if let Some(after) = v.strip_prefix("{}").or_else(|| v.strip_prefix("[]")) {
            only_comment(after)?;
            self.out.push_str(&v[..2]);
        } else {
            self.plain(indent, v)?;
        }
        // A more indented line after a one-line value would continue it.
        match self.peek()? {
            Some((i, _)) if i > indent => Err(Unsupported),
            _ => Ok(()),
        }
    }

    /// A plain value `v` (up to its comment) under a key or `-` at column `indent`, with
    /// the more indented lines that continue it, folded into one line.
    fn plain(&mut self, indent: usize, v: &'a str) -> Step {
        let comment = comment_start(v);
        let s = v[..comment.unwrap_or(v.len())].trim_end_matches(' ');
        check_plain(s)?;
        if s.contains(": ") || s.ends_with(':') {
            return Err(Unsupported);
        }
        let mut next = match comment {
            None => self.continuation(indent, true)?,
            Some(_) => None,
        };
        if next.is_some() {
            let mut folded = std::mem::take(&mut self.scratch);
            folded.clear();
            folded.push_str(s);
            while let Some((blanks, content)) = next {
                let comment = comment_start(content);
                let piece = content[..comment.unwrap_or(content.len())].trim_end_matches(' ');
                if piece.contains(": ") || piece.ends_with(':') {
                    return Err(Unsupported);
                }
                fold(&mut folded, blanks);
                folded.push_str(piece);
                next = match comment {
                    None => self.continuation(indent, true)?,
                    Some(_) => None,
                };
            }
            // A folded plain value is a string, unless the YAML reader types it otherwise.
            if plain_type(&folded) != Some(Plain::Str) {
                return Err(Unsupported);
            }
            push_json_str(&mut self.out, &folded);
            self.scratch = folded;
            return Ok(());
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
        Ok(())
    }
}
