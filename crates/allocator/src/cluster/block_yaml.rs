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
        let comment = v.find(" #");
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
                let comment = content.find(" #");
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
