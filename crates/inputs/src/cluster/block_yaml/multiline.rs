//! Values over several lines: plain and single-quoted values continued on more indented
//! lines, and literal and folded block scalars.

use super::Parser;
use super::scalars::{Step, Unsupported, only_comment, push_json_str};

impl<'a> Parser<'a> {
    /// A single-quoted value that goes on past its first line (`first`, after the opening
    /// quote), under a key or `-` at column `indent`: its lines folded into one.
    pub(super) fn single_quoted_lines(&mut self, indent: usize, first: &str) -> Step {
        let mut value = std::mem::take(&mut self.scratch);
        value.clear();
        push_single_quoted(&mut value, first.trim_end_matches(' '));
        loop {
            let (blanks, content) = self.continuation(indent, false)?.ok_or(Unsupported)?;
            fold(&mut value, blanks);
            match close_single_quoted(content) {
                Some(end) => {
                    push_single_quoted(&mut value, &content[..end]);
                    only_comment(&content[end + 1..])?;
                    break;
                }
                None => push_single_quoted(&mut value, content.trim_end_matches(' ')),
            }
        }
        push_json_str(&mut self.out, &value);
        self.scratch = value;
        Ok(())
    }

    /// The next line that continues a value under a key or `-` at column `indent` (a line
    /// more indented than that), taken with the blank lines before it: their number and its
    /// text from the first non-space character. `None`, taking nothing, where the value ends
    /// (a less indented line, the end of the text, or a comment when `comments_end`).
    pub(super) fn continuation(
        &mut self,
        indent: usize,
        comments_end: bool,
    ) -> Step<Option<(usize, &'a str)>> {
        let start = self.mark();
        let mut blanks = 0;
        while let Some((line_indent, content)) = self.indented() {
            if content.is_empty() {
                blanks += 1;
                self.advance();
                continue;
            }
            if self.tabs && content.contains('\t') {
                return Err(Unsupported);
            }
            if line_indent <= indent || (comments_end && content.starts_with('#')) {
                break;
            }
            self.advance();
            return Ok(Some((blanks, content)));
        }
        self.back_to(start);
        Ok(None)
    }

    /// A block scalar, literal (`|`) or `folded` (`>`), whose header (after `|` or `>`) is
    /// `header`, under a key or `-` at column `indent`; the header line is taken already.
    pub(super) fn block_scalar(&mut self, indent: usize, header: &str, folded: bool) -> Step {
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
        if folded && seen {
            value = fold_block(&value);
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

/// Appends the line break between two lines of a folded value: a space, or one line feed
/// for each of the `blanks` blank lines between them.
pub(super) fn fold(value: &mut String, blanks: usize) {
    if blanks == 0 {
        value.push(' ');
    } else {
        value.extend(std::iter::repeat_n('\n', blanks));
    }
}

/// The lines of a folded block scalar (each ended by a line feed, blank lines empty) folded:
/// a line break between two lines of text is a space, or is dropped before blank lines, which
/// give a line feed each; breaks around more indented lines are kept.
fn fold_block(lines: &str) -> String {
    let lines: Vec<&str> = lines
        .strip_suffix('\n')
        .unwrap_or(lines)
        .split('\n')
        .collect();
    let Some(last) = lines.iter().rposition(|l| !l.is_empty()) else {
        return lines.join("\n");
    };
    let mut value = String::with_capacity(lines.iter().map(|l| l.len() + 1).sum());
    let mut prev_text: Option<bool> = None;
    let mut blanks = 0;
    for line in &lines[..=last] {
        if line.is_empty() {
            blanks += 1;
            continue;
        }
        let text = !line.starts_with([' ', '\t']);
        let breaks = match prev_text {
            None => blanks,
            Some(true) if text && blanks == 0 => {
                value.push(' ');
                0
            }
            Some(true) if text => blanks,
            Some(_) => blanks + 1,
        };
        value.extend(std::iter::repeat_n('\n', breaks));
        value.push_str(line);
        prev_text = Some(text);
        blanks = 0;
    }
    value.extend(std::iter::repeat_n('\n', lines.len() - last));
    value
}

/// Where the single-quoted text `s` (inside its quotes) closes, if it does on this line.
fn close_single_quoted(s: &str) -> Option<usize> {
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\'' {
            if b.get(i + 1) == Some(&b'\'') {
                i += 2;
                continue;
            }
            return Some(i);
        }
        i += 1;
    }
    None
}

/// Appends single-quoted text (without its closing quote) to `value`, `''` read as `'`.
fn push_single_quoted(value: &mut String, s: &str) {
    let mut parts = s.split("''");
    if let Some(p) = parts.next() {
        value.push_str(p);
    }
    for p in parts {
        value.push('\'');
        value.push_str(p);
    }
}
