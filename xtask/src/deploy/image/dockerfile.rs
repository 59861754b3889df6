//! The Dockerfile read as text: stages and instructions (continuation lines joined, comments
//! dropped), the shell-like words, exec form and `KEY=value` pairs of arguments, COPY and RUN
//! options, and image references and versions.

use std::collections::BTreeMap;

use super::DOCKERFILE;

/// One instruction: its keyword in upper case, the line it starts on, its arguments as text
/// (continuation lines joined, comment lines inside it dropped), its options, the exec form of
/// RUN, CMD and ENTRYPOINT, and the paths of COPY and ADD (sources, then the destination).
#[derive(Debug, Clone)]
pub(super) struct Instruction {
    pub(super) line: usize,
    pub(super) keyword: String,
    pub(super) args: String,
    /// `--name[=value]` options, in order.
    pub(super) options: Vec<(String, Option<String>)>,
    /// The exec (JSON array) form's words; `None` for the shell form or another instruction.
    pub(super) exec: Option<Vec<String>>,
    /// COPY and ADD: the sources, then the destination.
    pub(super) paths: Vec<String>,
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

/// Reads a Dockerfile with BuildKit's syntax (`parse-dockerfile`: parser directives, line
/// continuations, comments, exec and shell forms, here-documents) into stages and
/// instructions. Fails, naming the line, where that syntax does: an instruction other than
/// `ARG` before the first `FROM`, a file without `FROM`, a malformed instruction.
pub(super) fn parse(text: &str) -> Result<Dockerfile, String> {
    let parsed = parse_dockerfile::parse(text).map_err(|e| format!("{DOCKERFILE}: {e}"))?;
    let escape = parsed
        .parser_directives
        .escape
        .as_ref()
        .map_or('\\', |d| d.value.value);
    let lines = LineIndex::new(text);
    let mut stages: Vec<Stage> = Vec::new();
    for instruction in &parsed.instructions {
        let Some(read) = read_instruction(instruction, text, escape, &lines) else {
            continue;
        };
        if let parse_dockerfile::Instruction::From(from) = instruction {
            stages.push(Stage {
                line: read.line,
                image: from.image.value.to_string(),
                name: from.as_.as_ref().map(|(_, name)| name.value.to_string()),
                body: Vec::new(),
            });
        } else if let Some(stage) = stages.last_mut() {
            stage.body.push(read);
        }
    }
    Ok(Dockerfile { stages })
}

/// Line numbers of byte offsets.
struct LineIndex(Vec<usize>);

impl LineIndex {
    fn new(text: &str) -> LineIndex {
        LineIndex(text.match_indices('\n').map(|(i, _)| i).collect())
    }

    /// The 1-based line holding byte `offset`.
    fn line(&self, offset: usize) -> usize {
        self.0.partition_point(|&newline| newline < offset) + 1
    }
}

/// One parsed instruction in deploy-check's model; `None` for the kinds no check reads
/// (HEALTHCHECK, ONBUILD, SHELL, VOLUME, STOPSIGNAL, MAINTAINER).
fn read_instruction(
    instruction: &parse_dockerfile::Instruction<'_>,
    text: &str,
    escape: char,
    lines: &LineIndex,
) -> Option<Instruction> {
    use parse_dockerfile::Instruction as I;
    let unescaped = |s: &parse_dockerfile::UnescapedString<'_>| s.value.to_string();
    let no_options = Vec::new;
    let (keyword, args, exec, options, paths) = match instruction {
        I::Run(i) => {
            let (args, exec) = command(&i.arguments, escape);
            (&i.run, args, exec, options(&i.options), Vec::new())
        }
        I::Cmd(i) => {
            let (args, exec) = command(&i.arguments, escape);
            (&i.cmd, args, exec, no_options(), Vec::new())
        }
        I::Entrypoint(i) => {
            let (args, exec) = command(&i.arguments, escape);
            (&i.entrypoint, args, exec, no_options(), Vec::new())
        }
        I::Copy(i) => (
            &i.copy,
            String::new(),
            None,
            options(&i.options),
            paths(&i.src, &i.dest),
        ),
        I::Add(i) => (
            &i.add,
            String::new(),
            None,
            options(&i.options),
            paths(&i.src, &i.dest),
        ),
        I::From(i) => (
            &i.from,
            unescaped(&i.image),
            None,
            options(&i.options),
            Vec::new(),
        ),
        I::Expose(i) => {
            let ports: Vec<String> = i.arguments.iter().map(unescaped).collect();
            (&i.expose, ports.join(" "), None, no_options(), Vec::new())
        }
        I::Arg(i) => (
            &i.arg,
            unescaped(&i.arguments),
            None,
            no_options(),
            Vec::new(),
        ),
        I::Env(i) => (
            &i.env,
            unescaped(&i.arguments),
            None,
            no_options(),
            Vec::new(),
        ),
        I::Label(i) => (
            &i.label,
            unescaped(&i.arguments),
            None,
            no_options(),
            Vec::new(),
        ),
        I::User(i) => (
            &i.user,
            unescaped(&i.arguments),
            None,
            no_options(),
            Vec::new(),
        ),
        I::Workdir(i) => (
            &i.workdir,
            unescaped(&i.arguments),
            None,
            no_options(),
            Vec::new(),
        ),
        _ => return None,
    };
    Some(Instruction {
        line: lines.line(keyword.span.start),
        keyword: text[keyword.span.clone()].to_ascii_uppercase(),
        args,
        options,
        exec,
        paths,
    })
}

/// `--name[=value]` options as (name, value) pairs, in order.
fn options(flags: &[parse_dockerfile::Flag<'_>]) -> Vec<(String, Option<String>)> {
    flags
        .iter()
        .map(|f| {
            let value = f.value.as_ref().map(|v| v.value.to_string());
            (f.name.value.to_string(), value)
        })
        .collect()
}

/// The sources of a COPY or ADD (here-documents left out), then its destination.
fn paths(
    src: &[parse_dockerfile::Source<'_>],
    dest: &parse_dockerfile::UnescapedString<'_>,
) -> Vec<String> {
    src.iter()
        .filter_map(|s| match s {
            parse_dockerfile::Source::Path(p) => Some(p.value.to_string()),
            _ => None,
        })
        .chain([dest.value.to_string()])
        .collect()
}

/// A RUN, CMD or ENTRYPOINT command as text (the shell form with its line continuations
/// joined and the comment lines inside it dropped, as the builder reads it; the exec form's
/// words joined by spaces) and the exec form's words.
fn command(command: &parse_dockerfile::Command<'_>, escape: char) -> (String, Option<Vec<String>>) {
    match command {
        parse_dockerfile::Command::Exec(words) => {
            let words: Vec<String> = words.value.iter().map(|w| w.value.to_string()).collect();
            (words.join(" "), Some(words))
        }
        parse_dockerfile::Command::Shell(shell) => {
            let joined: Vec<&str> = shell
                .value
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty() && !l.starts_with('#'))
                .map(|l| l.strip_suffix(escape).unwrap_or(l).trim_end())
                .collect();
            (joined.join(" "), None)
        }
        _ => (String::new(), None),
    }
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

/// The COPY or ADD `i` as kubedev's checks read it.
pub(super) fn copy(i: &Instruction) -> Result<Copy, String> {
    let Some((dest, sources)) = i.paths.split_last() else {
        return Err(format!(
            "{}: {} names nothing to copy",
            at(i.line),
            i.keyword
        ));
    };
    if sources.is_empty() {
        return Err(format!("{}: {} has no source", at(i.line), i.keyword));
    }
    Ok(Copy {
        line: i.line,
        from: option(i, "from").map(str::to_string),
        sources: sources.to_vec(),
        dest: dest.clone(),
    })
}

/// The value of the option `--name=value` of `i` (the last one given).
fn option<'a>(i: &'a Instruction, name: &str) -> Option<&'a str> {
    i.options
        .iter()
        .rev()
        .find(|(n, _)| n == name)
        .and_then(|(_, v)| v.as_deref())
}

/// A RUN: its `--mount` options (each as key/value pairs) and its command.
#[derive(Debug)]
pub(super) struct Run<'a> {
    pub(super) line: usize,
    pub(super) mounts: Vec<BTreeMap<String, String>>,
    pub(super) command: &'a str,
}

/// The RUN `i` as kubedev's checks read it.
pub(super) fn run(i: &Instruction) -> Run<'_> {
    let mounts = i
        .options
        .iter()
        .filter(|(name, _)| name == "mount")
        .map(|(_, value)| {
            value
                .as_deref()
                .unwrap_or_default()
                .split(',')
                .map(|kv| match kv.split_once('=') {
                    Some((k, v)) => (k.to_string(), v.to_string()),
                    None => (kv.to_string(), String::new()),
                })
                .collect()
        })
        .collect();
    Run {
        line: i.line,
        mounts,
        command: &i.args,
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
