//! The Dockerfile read as text: stages and instructions (continuation lines joined, comments
//! dropped), the shell-like words, exec form and `KEY=value` pairs of arguments, COPY and RUN
//! options, and image references and versions.

use std::collections::BTreeMap;

use super::DOCKERFILE;

/// One instruction: its keyword in upper case, its arguments as written (continuation lines
/// joined) and the line it starts on.
#[derive(Debug, Clone)]
pub(super) struct Instruction {
    pub(super) line: usize,
    pub(super) keyword: String,
    pub(super) args: String,
}

/// One build stage: `FROM image [AS name]` and the instructions up to the next `FROM`.
#[derive(Debug)]
pub(super) struct Stage {
    pub(super) line: usize,
    pub(super) image: String,
    pub(super) name: Option<String>,
    pub(super) body: Vec<Instruction>,
}

impl Stage {
    /// The stage's instructions with `keyword`.
    pub(super) fn all<'a>(
        &'a self,
        keyword: &'a str,
    ) -> impl Iterator<Item = &'a Instruction> + 'a {
        self.body.iter().filter(move |i| i.keyword == keyword)
    }

    /// The last instruction with `keyword`: the one that counts for ENTRYPOINT, CMD, USER.
    pub(super) fn last(&self, keyword: &str) -> Option<&Instruction> {
        self.body.iter().rev().find(|i| i.keyword == keyword)
    }
}

/// A parsed Dockerfile: its stages in order (the last one is the image).
#[derive(Debug)]
pub(super) struct Dockerfile {
    pub(super) stages: Vec<Stage>,
}

impl Dockerfile {
    /// The stage `reference` names, by name or by index, as `COPY --from` does.
    pub(super) fn stage(&self, reference: &str) -> Option<&Stage> {
        self.stages
            .iter()
            .find(|s| {
                s.name
                    .as_deref()
                    .is_some_and(|n| n.eq_ignore_ascii_case(reference))
            })
            .or_else(|| {
                reference
                    .parse::<usize>()
                    .ok()
                    .and_then(|i| self.stages.get(i))
            })
    }
}

/// `deploy/Dockerfile:<line>`, for messages.
pub(super) fn at(line: usize) -> String {
    format!("{DOCKERFILE}:{line}")
}

/// Splits a Dockerfile into stages and instructions: comment lines are dropped, lines ending
/// in `\` continue on the next line. Fails on an instruction before the first `FROM` other
/// than `ARG`, on a `FROM` without an image, and on a file without `FROM`.
pub(super) fn parse(text: &str) -> Result<Dockerfile, String> {
    let mut instructions = Vec::new();
    let mut pending: Option<(usize, String)> = None;
    for (index, raw) in text.lines().enumerate() {
        let line = index + 1;
        let trimmed = raw.trim();
        if trimmed.starts_with('#') || (trimmed.is_empty() && pending.is_none()) {
            continue;
        }
        let (start, mut joined) = pending.take().unwrap_or((line, String::new()));
        let (body, continues) = match trimmed.strip_suffix('\\') {
            Some(b) => (b, true),
            None => (trimmed, false),
        };
        if !joined.is_empty() {
            joined.push(' ');
        }
        joined.push_str(body.trim());
        if continues {
            pending = Some((start, joined));
        } else if !joined.trim().is_empty() {
            instructions.push((start, joined));
        }
    }
    if let Some((start, _)) = pending {
        return Err(format!(
            "{}: the last instruction ends in a line continuation",
            at(start)
        ));
    }

    let mut stages: Vec<Stage> = Vec::new();
    for (line, text) in instructions {
        let (keyword, args) = text.split_once(char::is_whitespace).unwrap_or((&text, ""));
        let instruction = Instruction {
            line,
            keyword: keyword.to_ascii_uppercase(),
            args: args.trim().to_string(),
        };
        if instruction.keyword == "FROM" {
            let words = words(&instruction.args).map_err(|e| format!("{}: {e}", at(line)))?;
            let mut rest = words.iter().filter(|w| !w.starts_with("--"));
            let image = rest
                .next()
                .ok_or_else(|| format!("{}: FROM names no image", at(line)))?
                .clone();
            let name = match (rest.next(), rest.next()) {
                (Some(kw), Some(name)) if kw.eq_ignore_ascii_case("as") => Some(name.clone()),
                _ => None,
            };
            stages.push(Stage {
                line,
                image,
                name,
                body: Vec::new(),
            });
        } else if let Some(stage) = stages.last_mut() {
            stage.body.push(instruction);
        } else if instruction.keyword != "ARG" {
            return Err(format!(
                "{}: {} before the first FROM",
                at(line),
                instruction.keyword
            ));
        }
    }
    if stages.is_empty() {
        return Err(format!("{DOCKERFILE} has no FROM"));
    }
    Ok(Dockerfile { stages })
}

/// Splits arguments into words the way the Dockerfile's shell-like syntax does: whitespace
/// separates, single and double quotes group, a backslash escapes the next character.
pub(super) fn words(s: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut quote: Option<char> = None;
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        match (quote, c) {
            (None, c) if c.is_whitespace() => {
                if in_word {
                    out.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            (None, '"' | '\'') => {
                quote = Some(c);
                in_word = true;
            }
            (Some(q), c) if c == q => quote = None,
            (Some('\''), c) => word.push(c),
            (_, '\\') => {
                word.push(chars.next().unwrap_or('\\'));
                in_word = true;
            }
            (_, c) => {
                word.push(c);
                in_word = true;
            }
        }
    }
    if let Some(q) = quote {
        return Err(format!("unterminated {q} quote in {s:?}"));
    }
    if in_word {
        out.push(word);
    }
    Ok(out)
}

/// The exec (JSON array) form of ENTRYPOINT, CMD or COPY; `None` for the shell form.
pub(super) fn exec_form(args: &str) -> Option<Vec<String>> {
    args.trim()
        .starts_with('[')
        .then(|| serde_json::from_str(args).ok())
        .flatten()
}

/// `KEY=value` pairs of LABEL, ENV and ARG (`ARG NAME` has no value: `None`); the legacy
/// `ENV KEY value` form too.
pub(super) fn pairs(args: &str) -> Result<Vec<(String, Option<String>)>, String> {
    let words = words(args)?;
    if let Some(first) = words.first()
        && !first.contains('=')
        && words.len() > 1
    {
        return Ok(vec![(first.clone(), Some(words[1..].join(" ")))]);
    }
    Ok(words
        .into_iter()
        .map(|w| match w.split_once('=') {
            Some((k, v)) => (k.to_string(), Some(v.to_string())),
            None => (w, None),
        })
        .collect())
}

/// A COPY or ADD: its `--from` stage (none: the build context), sources and destination.
#[derive(Debug)]
pub(super) struct Copy {
    pub(super) line: usize,
    pub(super) from: Option<String>,
    pub(super) sources: Vec<String>,
    pub(super) dest: String,
}

pub(super) fn copy(i: &Instruction) -> Result<Copy, String> {
    let mut words = match exec_form(&i.args) {
        Some(w) => w,
        None => words(&i.args).map_err(|e| format!("{}: {e}", at(i.line)))?,
    };
    let mut from = None;
    while words.first().is_some_and(|w| w.starts_with("--")) {
        let flag = words.remove(0);
        if let Some(stage) = flag.strip_prefix("--from=") {
            from = Some(stage.to_string());
        }
    }
    let Some(dest) = words.pop() else {
        return Err(format!(
            "{}: {} names nothing to copy",
            at(i.line),
            i.keyword
        ));
    };
    if words.is_empty() {
        return Err(format!("{}: {} has no source", at(i.line), i.keyword));
    }
    Ok(Copy {
        line: i.line,
        from,
        sources: words,
        dest,
    })
}

/// A RUN: its `--mount` options (each as key/value pairs) and its shell command.
#[derive(Debug)]
pub(super) struct Run<'a> {
    pub(super) line: usize,
    pub(super) mounts: Vec<BTreeMap<String, String>>,
    pub(super) command: &'a str,
}

pub(super) fn run(i: &Instruction) -> Run<'_> {
    let mut rest = i.args.as_str();
    let mut mounts = Vec::new();
    loop {
        let t = rest.trim_start();
        if !t.starts_with("--") {
            rest = t;
            break;
        }
        let end = t.find(char::is_whitespace).unwrap_or(t.len());
        if let Some(options) = t[..end].strip_prefix("--mount=") {
            mounts.push(
                options
                    .split(',')
                    .map(|kv| match kv.split_once('=') {
                        Some((k, v)) => (k.to_string(), v.to_string()),
                        None => (kv.to_string(), String::new()),
                    })
                    .collect(),
            );
        }
        rest = &t[end..];
    }
    Run {
        line: i.line,
        mounts,
        command: rest,
    }
}

/// `dir` joined with `path` unless `path` is absolute.
pub(super) fn join(dir: &str, path: &str) -> String {
    if path.starts_with('/') {
        path.to_string()
    } else {
        format!("{}/{path}", dir.trim_end_matches('/'))
    }
}

/// An image reference split into name (Docker Hub's `library/` and host left out), tag and
/// digest.
#[derive(Debug, PartialEq)]
pub(super) struct ImageRef {
    pub(super) name: String,
    pub(super) tag: Option<String>,
    pub(super) digest: Option<String>,
}

pub(super) fn image_ref(s: &str) -> ImageRef {
    let (rest, digest) = match s.split_once('@') {
        Some((r, d)) => (r, Some(d.to_string())),
        None => (s, None),
    };
    let slash = rest.rfind('/').map_or(0, |i| i + 1);
    let (name, tag) = match rest[slash..].split_once(':') {
        Some((n, t)) => (format!("{}{n}", &rest[..slash]), Some(t.to_string())),
        None => (rest.to_string(), None),
    };
    let name = name
        .strip_prefix("docker.io/")
        .or_else(|| name.strip_prefix("index.docker.io/"))
        .map(str::to_string)
        .unwrap_or(name);
    let name = name
        .strip_prefix("library/")
        .map(str::to_string)
        .unwrap_or(name);
    ImageRef { name, tag, digest }
}

/// A `major.minor[.patch]` version; a missing patch is 0.
pub(super) fn version(s: &str) -> Option<(u64, u64, u64)> {
    let mut parts = s.split('.').map(|p| p.parse::<u64>().ok());
    let major = parts.next()??;
    let minor = parts.next()??;
    let patch = match parts.next() {
        Some(p) => p?,
        None => 0,
    };
    parts.next().is_none().then_some((major, minor, patch))
}

/// The Debian release a tag's variant names (`1.95-slim-bookworm`: 12).
pub(super) fn debian_of_tag(tag: &str) -> Option<u32> {
    tag.split('-').find_map(|w| match w {
        "buster" => Some(10),
        "bullseye" => Some(11),
        "bookworm" => Some(12),
        "trixie" => Some(13),
        _ => None,
    })
}
