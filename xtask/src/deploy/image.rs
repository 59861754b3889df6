//! The container image: `deploy/Dockerfile` and `.dockerignore` against the chart, the workspace
//! and the daemon binary. Nothing here needs a Docker engine: the Dockerfile is read as text, the
//! binary's dynamic libraries from its ELF headers.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use anyhow::{Context as _, bail};
use object::read::elf::{FileHeader, ProgramHeader as _};
use serde_json::Value;

/// The Dockerfile, relative to the workspace root.
pub(super) const DOCKERFILE: &str = "deploy/Dockerfile";
/// The ignore file of the build context (the workspace root).
const DOCKERIGNORE: &str = ".dockerignore";

/// One instruction: its keyword in upper case, its arguments as written (continuation lines
/// joined) and the line it starts on.
#[derive(Debug, Clone)]
pub(super) struct Instruction {
    line: usize,
    keyword: String,
    args: String,
}

/// One build stage: `FROM image [AS name]` and the instructions up to the next `FROM`.
#[derive(Debug)]
pub(super) struct Stage {
    line: usize,
    image: String,
    name: Option<String>,
    body: Vec<Instruction>,
}

impl Stage {
    /// The stage's instructions with `keyword`.
    fn all<'a>(&'a self, keyword: &'a str) -> impl Iterator<Item = &'a Instruction> + 'a {
        self.body.iter().filter(move |i| i.keyword == keyword)
    }

    /// The last instruction with `keyword`: the one that counts for ENTRYPOINT, CMD, USER.
    fn last(&self, keyword: &str) -> Option<&Instruction> {
        self.body.iter().rev().find(|i| i.keyword == keyword)
    }
}

/// A parsed Dockerfile: its stages in order (the last one is the image).
#[derive(Debug)]
pub(super) struct Dockerfile {
    stages: Vec<Stage>,
}

impl Dockerfile {
    /// The stage `reference` names, by name or by index, as `COPY --from` does.
    fn stage(&self, reference: &str) -> Option<&Stage> {
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
fn at(line: usize) -> String {
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
fn exec_form(args: &str) -> Option<Vec<String>> {
    args.trim()
        .starts_with('[')
        .then(|| serde_json::from_str(args).ok())
        .flatten()
}

/// `KEY=value` pairs of LABEL, ENV and ARG (`ARG NAME` has no value: `None`); the legacy
/// `ENV KEY value` form too.
fn pairs(args: &str) -> Result<Vec<(String, Option<String>)>, String> {
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
struct Copy {
    line: usize,
    from: Option<String>,
    sources: Vec<String>,
    dest: String,
}

fn copy(i: &Instruction) -> Result<Copy, String> {
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
struct Run<'a> {
    line: usize,
    mounts: Vec<BTreeMap<String, String>>,
    command: &'a str,
}

fn run(i: &Instruction) -> Run<'_> {
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
fn join(dir: &str, path: &str) -> String {
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
    name: String,
    tag: Option<String>,
    digest: Option<String>,
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
fn debian_of_tag(tag: &str) -> Option<u32> {
    tag.split('-').find_map(|w| match w {
        "buster" => Some(10),
        "bullseye" => Some(11),
        "bookworm" => Some(12),
        "trixie" => Some(13),
        _ => None,
    })
}

/// A runtime base image deploy-check knows: what it provides and how it runs.
#[derive(Debug)]
pub(super) struct Base {
    /// Image name without tag.
    name: &'static str,
    debian: u32,
    /// Shared libraries (sonames) it holds.
    libraries: &'static [&'static str],
    /// Program interpreters (dynamic loaders) it holds.
    interpreters: &'static [&'static str],
    /// Its PATH.
    path: &'static str,
}

/// glibc's libraries in every Debian release, the dynamic loaders of the architectures
/// distroless builds for, libgcc_s, libstdc++ and libgomp (the cc image's packages) and
/// OpenSSL's libraries (distroless base).
const DISTROLESS_CC: &[&str] = &[
    "libc.so.6",
    "libm.so.6",
    "libdl.so.2",
    "libpthread.so.0",
    "librt.so.1",
    "libresolv.so.2",
    "libutil.so.1",
    "ld-linux-x86-64.so.2",
    "ld-linux-aarch64.so.1",
    "ld-linux-armhf.so.3",
    "ld64.so.1",
    "ld64.so.2",
    "libgcc_s.so.1",
    "libstdc++.so.6",
    "libgomp.so.1",
    "libssl.so.3",
    "libcrypto.so.3",
];
const LOADERS: &[&str] = &[
    "/lib64/ld-linux-x86-64.so.2",
    "/lib/ld-linux-aarch64.so.1",
    "/lib/ld-linux-armhf.so.3",
    "/lib/ld64.so.1",
    "/lib64/ld64.so.2",
];
const STANDARD_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The runtime bases deploy-check knows (GoogleContainerTools/distroless `cc`: `base` plus
/// libgcc-s1, libstdc++6 and libgomp1).
pub(super) const BASES: &[Base] = &[
    Base {
        name: "gcr.io/distroless/cc-debian12",
        debian: 12,
        libraries: DISTROLESS_CC,
        interpreters: LOADERS,
        path: STANDARD_PATH,
    },
    Base {
        name: "gcr.io/distroless/cc-debian13",
        debian: 13,
        libraries: DISTROLESS_CC,
        interpreters: LOADERS,
        path: STANDARD_PATH,
    },
];

/// What the workspace says the image must match.
#[derive(Debug, Default)]
pub(super) struct Workspace {
    /// `rust-version` of the kubedev crate.
    pub(super) rust_version: String,
    /// Its version: the chart's appVersion, the image tag.
    pub(super) version: String,
    pub(super) license: String,
    pub(super) description: String,
    /// `[workspace.package] repository`.
    pub(super) repository: String,
    /// The kubedev crate's `[features]`.
    pub(super) features: BTreeMap<String, Vec<String>>,
    /// Workspace members' manifests, relative to the root.
    pub(super) members: Vec<String>,
}

/// What the chart says the image must match (its default rendering).
#[derive(Debug, Default)]
pub(super) struct Chart {
    /// The daemon container's `command` and `args`.
    pub(super) command: Vec<String>,
    pub(super) args: Vec<String>,
    /// Its port named `metrics`.
    pub(super) metrics_port: Option<u64>,
    /// Chart.yaml's appVersion: the image tag.
    pub(super) app_version: String,
}

/// The builder stage's facts the other checks use.
#[derive(Debug)]
pub(super) struct Built {
    /// The features `docker build` without `--build-arg FEATURES` compiles.
    pub(super) features: BTreeSet<String>,
    /// The runtime base, when deploy-check knows it.
    pub(super) base: Option<&'static Base>,
}

/// The features `requested` turn on, following `features` (`dep:` entries are not features).
fn resolve(
    features: &BTreeMap<String, Vec<String>>,
    requested: impl IntoIterator<Item = String>,
) -> BTreeSet<String> {
    let mut on = BTreeSet::new();
    let mut todo: Vec<String> = requested.into_iter().collect();
    while let Some(f) = todo.pop() {
        if let Some(implied) = features.get(&f)
            && on.insert(f)
        {
            todo.extend(implied.iter().cloned());
        }
    }
    on.remove("default");
    on
}

/// Checks the Dockerfile against the workspace and the chart: the builder image, the
/// build command and its FEATURES, the runtime base, the installed binary, ENTRYPOINT and
/// CMD, the user, EXPOSE and the labels. Returns the problems and what was built.
pub(super) fn check_dockerfile(
    df: &Dockerfile,
    ws: &Workspace,
    chart: &Chart,
) -> (Vec<String>, Option<Built>) {
    let Some(runtime) = df.stages.last() else {
        return (vec![format!("{DOCKERFILE} has no stage")], None);
    };
    let rt_at = at(runtime.line);

    // The runtime base.
    let base_ref = image_ref(&runtime.image);
    let base = BASES.iter().find(|b| b.name == base_ref.name);
    let mut problems = check_base(runtime, &base_ref, base);
    // The user: root, because of the host paths.
    problems.extend(check_user(runtime, &base_ref));

    // Installed files and PATH.
    let (installed, copy_problems) = Installed::of(runtime, base);
    problems.extend(copy_problems);
    let (binary, binary_problems) = chart_binary(chart, &installed, &rt_at);
    problems.extend(binary_problems);

    // ENTRYPOINT + CMD: what `docker run` does is what the chart runs.
    problems.extend(check_entrypoint(
        runtime,
        chart,
        &installed,
        binary.as_deref(),
    ));
    // EXPOSE: the metrics port.
    problems.extend(check_expose(runtime, chart));
    // Labels.
    problems.extend(check_labels(runtime, ws, chart));

    // The builder: the stage the binary comes from.
    let Some(binary) = binary else {
        return (problems, None);
    };
    let (builder_problems, built) = check_built(df, ws, &installed, &binary, &base_ref, base);
    problems.extend(builder_problems);
    (problems, built)
}

/// The runtime base: written out, and one deploy-check knows the libraries of; returns the
/// problems.
fn check_base(runtime: &Stage, base_ref: &ImageRef, base: Option<&Base>) -> Vec<String> {
    let rt_at = at(runtime.line);
    let mut problems = Vec::new();
    if runtime.image.contains('$') {
        problems.push(format!(
            "{rt_at}: the runtime image {:?} is a variable; write it out so deploy-check can \
                 read it",
            runtime.image
        ));
    } else if base.is_none() {
        problems.push(format!(
            "{rt_at}: deploy-check does not know which libraries the runtime image {} \
                 provides; use one of {:?} or add it to BASES in xtask/src/deploy.rs",
            base_ref.name,
            BASES.iter().map(|b| b.name).collect::<Vec<_>>()
        ));
    }
    problems
}

/// The user the image runs as: root (uid 0), because of the host paths; the last USER
/// counts, else the base's user. Returns the problems.
fn check_user(runtime: &Stage, base_ref: &ImageRef) -> Vec<String> {
    let rt_at = at(runtime.line);
    let user = runtime.last("USER").map(|i| (i.line, i.args.clone()));
    let nonroot_base = base_ref
        .tag
        .as_deref()
        .is_some_and(|t| t.contains("nonroot"));
    match user {
        Some((line, u)) => {
            let name = u.split(':').next().unwrap_or_default().trim();
            if name != "0" && name != "root" {
                return vec![format!(
                    "{}: USER {u} — the daemon must run as root (uid 0): it creates sockets \
                         in the kubelet's host directories and opens device nodes, and the chart \
                         runs it with runAsUser 0",
                    at(line)
                )];
            }
            Vec::new()
        }
        None if nonroot_base => vec![format!(
            "{rt_at}: {} runs as a non-root user and no USER 0 follows; the daemon must run \
                 as root",
            runtime.image
        )],
        None => Vec::new(),
    }
}

/// What the runtime stage installs, by absolute path, and its PATH.
struct Installed {
    files: BTreeMap<String, Copy>,
    path: String,
}

impl Installed {
    /// The runtime stage's COPY and ADD destinations and its PATH (the base's, as ENV
    /// changes it); with the COPY and ADD instructions that do not parse, as problems.
    fn of(runtime: &Stage, base: Option<&Base>) -> (Installed, Vec<String>) {
        let mut problems = Vec::new();
        let mut files: BTreeMap<String, Copy> = BTreeMap::new();
        for i in runtime.all("COPY").chain(runtime.all("ADD")) {
            match copy(i) {
                Ok(c) => {
                    let dest = if c.dest.ends_with('/') && c.sources.len() == 1 {
                        let file = c.sources[0].rsplit('/').next().unwrap_or_default();
                        format!("{}{file}", c.dest)
                    } else {
                        c.dest.clone()
                    };
                    files.insert(join("/", &dest), c);
                }
                Err(e) => problems.push(e),
            }
        }
        let mut path = base.map_or(STANDARD_PATH, |b| b.path).to_string();
        for i in runtime.all("ENV") {
            if let Ok(pairs) = pairs(&i.args) {
                for (k, v) in pairs {
                    if k == "PATH" {
                        path = v
                            .unwrap_or_default()
                            .replace("${PATH}", &path)
                            .replace("$PATH", &path);
                    }
                }
            }
        }
        (Installed { files, path }, problems)
    }

    /// The installed file `program` runs: itself when it is a path, else the first match in
    /// a directory on PATH.
    fn resolve(&self, program: &str) -> Option<String> {
        if program.contains('/') {
            self.files
                .contains_key(program)
                .then(|| program.to_string())
        } else {
            self.path
                .split(':')
                .map(|dir| join(dir, program))
                .find(|p| self.files.contains_key(p))
        }
    }
}

/// The installed file the chart's command runs, when the runtime stage installs it; with the
/// problems.
fn chart_binary(
    chart: &Chart,
    installed: &Installed,
    rt_at: &str,
) -> (Option<String>, Vec<String>) {
    let Some(program) = chart.command.first() else {
        return (
            None,
            vec![
                "the chart's daemon container sets no command; it must name the kubedev \
                     binary"
                    .into(),
            ],
        );
    };
    let found = installed.resolve(program);
    if found.is_some() {
        return (found, Vec::new());
    }
    let problem = format!(
        "{rt_at}: the chart runs {program:?}, but the runtime stage installs no \
             such file{} (PATH {}; installed: {:?})",
        if program.contains('/') {
            ""
        } else {
            " in a directory on its PATH"
        },
        installed.path,
        installed.files.keys().collect::<Vec<_>>()
    );
    (None, vec![problem])
}

/// ENTRYPOINT and CMD in exec form, together the chart's command and args (the program
/// resolving to `binary`); returns the problems.
fn check_entrypoint(
    runtime: &Stage,
    chart: &Chart,
    installed: &Installed,
    binary: Option<&str>,
) -> Vec<String> {
    let rt_at = at(runtime.line);
    let mut problems = Vec::new();
    let exec = |keyword: &str| -> Option<Vec<String>> {
        runtime.last(keyword).and_then(|i| exec_form(&i.args))
    };
    let entrypoint = exec("ENTRYPOINT").unwrap_or_default();
    let cmd = exec("CMD").unwrap_or_default();
    let mut shell_form = false;
    for keyword in ["ENTRYPOINT", "CMD"] {
        if let Some(i) = runtime.last(keyword)
            && exec_form(&i.args).is_none()
        {
            shell_form = true;
            problems.push(format!(
                "{}: {keyword} in shell form needs /bin/sh, which the runtime image lacks; \
                     use the exec form [\"...\"]",
                at(i.line)
            ));
        }
    }
    if let (Some(binary), Some(program), false) = (binary, chart.command.first(), shell_form) {
        let entry_program = entrypoint.first().and_then(|p| installed.resolve(p));
        let image_args: Vec<&String> = entrypoint.iter().skip(1).chain(&cmd).collect();
        let chart_args: Vec<&String> = chart.command.iter().skip(1).chain(&chart.args).collect();
        if entry_program.as_deref() != Some(binary) || image_args != chart_args {
            problems.push(format!(
                "{rt_at}: ENTRYPOINT {entrypoint:?} + CMD {cmd:?} differ from the chart's \
                     command {:?} + args {:?} (the chart runs {program} = {binary})",
                chart.command, chart.args
            ));
        }
    }
    problems
}

/// The runtime stage EXPOSEs the chart's metrics port; returns the problems.
fn check_expose(runtime: &Stage, chart: &Chart) -> Vec<String> {
    let Some(port) = chart.metrics_port else {
        return Vec::new();
    };
    let exposed: BTreeSet<u64> = runtime
        .all("EXPOSE")
        .flat_map(|i| {
            i.args
                .split_whitespace()
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .filter_map(|p| p.split('/').next().and_then(|n| n.parse().ok()))
        .collect();
    if exposed.contains(&port) {
        return Vec::new();
    }
    vec![format!(
        "{}: the runtime stage does not EXPOSE {port}, the chart's metrics port \
             (exposed: {exposed:?})",
        at(runtime.line)
    )]
}

/// The OCI labels (source, licenses, description) are the workspace's, and the chart's
/// appVersion is the kubedev crate's version; returns the problems.
fn check_labels(runtime: &Stage, ws: &Workspace, chart: &Chart) -> Vec<String> {
    let rt_at = at(runtime.line);
    let mut problems = Vec::new();
    let mut labels = BTreeMap::new();
    for i in runtime.all("LABEL") {
        match pairs(&i.args) {
            Ok(p) => labels.extend(p.into_iter().map(|(k, v)| (k, v.unwrap_or_default()))),
            Err(e) => problems.push(format!("{}: {e}", at(i.line))),
        }
    }
    for (label, want, from) in [
        (
            "org.opencontainers.image.source",
            &ws.repository,
            "[workspace.package] repository",
        ),
        (
            "org.opencontainers.image.licenses",
            &ws.license,
            "the kubedev crate's license",
        ),
        (
            "org.opencontainers.image.description",
            &ws.description,
            "the kubedev crate's description",
        ),
    ] {
        let have = labels.get(label);
        if have != Some(want) {
            problems.push(format!(
                "{rt_at}: LABEL {label} is {have:?}, but {from} is {want:?}"
            ));
        }
    }
    if chart.app_version != ws.version {
        problems.push(format!(
            "the chart's appVersion {:?} (the default image tag) is not the kubedev crate's \
                 version {:?}",
            chart.app_version, ws.version
        ));
    }
    problems
}

/// The builder stage `binary` is copied from (not the build context), checked; returns the
/// problems and what it builds.
fn check_built(
    df: &Dockerfile,
    ws: &Workspace,
    installed: &Installed,
    binary: &str,
    base_ref: &ImageRef,
    base: Option<&'static Base>,
) -> (Vec<String>, Option<Built>) {
    let Some(installer) = installed.files.get(binary) else {
        return (Vec::new(), None);
    };
    let Some(from) = installer.from.as_deref() else {
        return (
            vec![format!(
                "{}: {binary} is copied from the build context, not built in a builder stage",
                at(installer.line)
            )],
            None,
        );
    };
    let Some(builder) = df.stage(from) else {
        return (
            vec![format!(
                "{}: COPY --from={from} names no stage of {DOCKERFILE}",
                at(installer.line)
            )],
            None,
        );
    };
    let (problems, features) = check_builder(
        builder,
        &installer.sources[0],
        ws,
        base_ref_debian(base_ref, base),
    );
    (problems, features.map(|features| Built { features, base }))
}

/// The Debian release of the runtime image: the base table's, or a `debian:<codename>` tag's.
fn base_ref_debian(r: &ImageRef, base: Option<&Base>) -> Option<u32> {
    base.map(|b| b.debian).or_else(|| {
        (r.name == "debian")
            .then(|| r.tag.as_deref().and_then(debian_of_tag))
            .flatten()
    })
}

/// The builder stage: the official Rust image at the workspace's rust-version or newer, on
/// the runtime's Debian release; `cargo build --release --locked -p kubedev` with the
/// FEATURES build argument and cache mounts, writing `artifact` (what the runtime copies).
/// Returns the problems and the features the default FEATURES builds.
fn check_builder(
    builder: &Stage,
    artifact: &str,
    ws: &Workspace,
    runtime_debian: Option<u32>,
) -> (Vec<String>, Option<BTreeSet<String>>) {
    let b_at = at(builder.line);
    let mut problems = check_builder_image(builder, ws, runtime_debian);

    // ARG FEATURES and its default.
    let Some(default) = features_arg(builder) else {
        problems.push(format!(
            "{b_at}: the builder stage declares no ARG FEATURES (the cargo features to \
                 build)"
        ));
        return (problems, None);
    };

    // The build step.
    let Some((build, workdir)) = build_step(builder) else {
        problems.push(format!("{b_at}: the builder stage runs no `cargo build`"));
        return (problems, None);
    };
    problems.extend(check_build_command(&build, artifact));
    problems.extend(check_build_caches(&build, &workdir));

    // What the default FEATURES builds.
    let (requested, feature_problems) = default_features(&default, ws, &b_at);
    problems.extend(feature_problems);
    (problems, Some(resolve(&ws.features, requested)))
}

/// The builder image: the official Rust image, tagged with the workspace's rust-version or
/// newer and the runtime's Debian release; returns the problems.
fn check_builder_image(
    builder: &Stage,
    ws: &Workspace,
    runtime_debian: Option<u32>,
) -> Vec<String> {
    let b_at = at(builder.line);
    let image = image_ref(&builder.image);
    if image.name != "rust" {
        return vec![format!(
            "{b_at}: the builder image is {}, not the official Rust image (rust:<version>-…)",
            builder.image
        )];
    }
    let mut problems = Vec::new();
    let tag = image.tag.as_deref().unwrap_or("latest");
    let wanted = version(&ws.rust_version);
    match (tag.split('-').next().and_then(version), wanted) {
        (Some(have), Some(want)) if have >= want => {}
        (Some(_), Some(_)) => problems.push(format!(
            "{b_at}: the builder image {} is older than the workspace's rust-version {}",
            builder.image, ws.rust_version
        )),
        (None, _) => problems.push(format!(
            "{b_at}: the builder image tag {tag:?} names no Rust version \
                 (major.minor, e.g. rust:{}-slim-bookworm); the build would float",
            ws.rust_version
        )),
        (_, None) => problems.push(format!(
            "the kubedev crate's rust-version {:?} is not major.minor[.patch]",
            ws.rust_version
        )),
    }
    match (debian_of_tag(tag), runtime_debian) {
        (Some(b), Some(r)) if b == r => {}
        (Some(b), Some(r)) => problems.push(format!(
            "{b_at}: the builder is Debian {b} but the runtime image is Debian {r}; a \
                 binary linked against a newer glibc than the runtime's does not start"
        )),
        (None, _) => problems.push(format!(
            "{b_at}: the builder tag {tag:?} names no Debian release (bookworm, \
                 trixie); pin it to the runtime image's release"
        )),
        // An unknown runtime image is reported with the runtime stage.
        (_, None) => {}
    }
    problems
}

/// The default of the builder stage's `ARG FEATURES` (empty when it has none), or `None`
/// when the stage declares no such argument.
fn features_arg(builder: &Stage) -> Option<String> {
    let mut default = None;
    for i in builder.all("ARG") {
        if let Ok(pairs) = pairs(&i.args) {
            for (k, v) in pairs {
                if k == "FEATURES" {
                    default = Some(v.unwrap_or_default());
                }
            }
        }
    }
    default
}

/// The builder stage's last RUN of `cargo build`, with the WORKDIR it runs in.
fn build_step(builder: &Stage) -> Option<(Run<'_>, String)> {
    let mut workdir = "/".to_string();
    let mut build = None;
    for i in &builder.body {
        match i.keyword.as_str() {
            "WORKDIR" => workdir = join(&workdir, i.args.trim()),
            "RUN" if i.args.contains("cargo build") => {
                build = Some((run(i), workdir.clone()));
            }
            _ => {}
        }
    }
    build
}

/// The build command: `--release --locked -p kubedev`, `$FEATURES` with
/// `--no-default-features`, and the binary copied to `artifact`; returns the problems.
fn check_build_command(build: &Run<'_>, artifact: &str) -> Vec<String> {
    let mut problems = Vec::new();
    let r_at = at(build.line);
    let tokens: Vec<&str> = build
        .command
        .split_whitespace()
        .map(|t| t.trim_matches(|c| c == ';' || c == '"' || c == '\''))
        .collect();
    let has = |t: &str| tokens.contains(&t);
    let has_pair = |a: &str, b: &str| tokens.windows(2).any(|w| w[0] == a && w[1] == b);
    for flag in ["--release", "--locked"] {
        if !has(flag) {
            problems.push(format!("{r_at}: cargo build without {flag}"));
        }
    }
    if !(has_pair("-p", "kubedev") || has_pair("--package", "kubedev") || has("--package=kubedev"))
    {
        problems.push(format!("{r_at}: cargo build does not select -p kubedev"));
    }
    let passes_features = ["$FEATURES", "${FEATURES}"]
        .iter()
        .any(|v| has_pair("--features", v) || has_pair("-F", v) || has(&format!("--features={v}")));
    if !passes_features {
        problems.push(format!(
            "{r_at}: the build does not pass $FEATURES to cargo, so --build-arg FEATURES \
                 changes nothing"
        ));
    }
    if !has("--no-default-features") {
        problems.push(format!(
            "{r_at}: a FEATURES list must build exactly those features: pass \
                 --no-default-features with it"
        ));
    }
    if !(build.command.contains("release/kubedev") && build.command.contains(artifact)) {
        problems.push(format!(
            "{r_at}: the runtime stage copies {artifact}, but this step does not copy \
                 target/release/kubedev there"
        ));
    }
    problems
}

/// BuildKit cache mounts for the cargo registry and the target directory (beneath
/// `workdir`); returns the problems.
fn check_build_caches(build: &Run<'_>, workdir: &str) -> Vec<String> {
    let r_at = at(build.line);
    let caches: BTreeSet<String> = build
        .mounts
        .iter()
        .filter(|m| m.get("type").map(String::as_str) == Some("cache"))
        .filter_map(|m| {
            m.get("target")
                .or_else(|| m.get("dst"))
                .or_else(|| m.get("destination"))
                .map(|t| join(workdir, t).trim_end_matches('/').to_string())
        })
        .collect();
    let mut problems = Vec::new();
    for (dir, what) in [
        (
            "/usr/local/cargo/registry".to_string(),
            "the cargo registry",
        ),
        (join(workdir, "target"), "the target directory"),
    ] {
        if !caches.contains(&dir) {
            problems.push(format!(
                "{r_at}: no BuildKit cache mount for {what} ({dir}); every build would \
                     start cold"
            ));
        }
    }
    problems
}

/// The features the FEATURES default requests (`default` when empty), each a feature of the
/// kubedev crate; with the problems.
fn default_features(default: &str, ws: &Workspace, b_at: &str) -> (Vec<String>, Vec<String>) {
    let requested: Vec<String> = if default.trim().is_empty() {
        vec!["default".into()]
    } else {
        default
            .split([',', ' '])
            .filter(|f| !f.is_empty())
            .map(str::to_string)
            .collect()
    };
    let mut problems = Vec::new();
    for f in &requested {
        if !ws.features.contains_key(f) {
            problems.push(format!(
                "{b_at}: ARG FEATURES names {f:?}, which is not a feature of the kubedev \
                     crate ({:?})",
                ws.features.keys().collect::<Vec<_>>()
            ));
        }
    }
    (requested, problems)
}

/// The cargo features a rendered configuration needs: one per enabled backend that is not
/// built into core, and `wasm` for selection policies. Each comes with the setting that
/// needs it. A backend deploy-check does not know is an error.
pub(super) fn needed_features(config: &Value) -> Result<Vec<(String, &'static str)>, String> {
    let mut needs = Vec::new();
    if let Some(backends) = config.get("backends").and_then(Value::as_object) {
        for name in backends.keys() {
            let feature = match name.as_str() {
                // Built into kubedev-core.
                "static" => continue,
                "nvidia" => "nvidia",
                "vfio" => "vfio",
                "usb" => "usb",
                "host" => "host",
                other => {
                    return Err(format!(
                        "config.yaml enables backends.{other}, and deploy-check does not know \
                             which cargo feature it needs; add it to needed_features in \
                             xtask/src/deploy.rs"
                    ));
                }
            };
            needs.push((format!("backends.{name}"), feature));
        }
    }
    let dp = config.get("devicePlugin");
    if dp
        .and_then(|d| d.get("policyDir"))
        .and_then(Value::as_str)
        .is_some_and(|d| !d.is_empty())
    {
        needs.push(("devicePlugin.policyDir".into(), "wasm"));
    }
    let resources = dp
        .and_then(|d| d.get("resources"))
        .and_then(Value::as_array);
    for (i, r) in resources.into_iter().flatten().enumerate() {
        if r.get("policy").is_some_and(|p| !p.is_null()) {
            needs.push((format!("devicePlugin.resources[{i}].policy"), "wasm"));
        }
    }
    Ok(needs)
}

/// Each `(rendering, setting, feature)` whose feature the image's default FEATURES leaves
/// out is a problem.
pub(super) fn check_features(
    built: &BTreeSet<String>,
    needs: &[(String, String, &'static str)],
) -> Vec<String> {
    needs
        .iter()
        .filter(|(_, _, feature)| !built.contains(*feature))
        .map(|(label, setting, feature)| {
            format!(
                "{label}: {setting} needs the cargo feature `{feature}`, which the image \
                     built with {DOCKERFILE}'s default FEATURES leaves out (it builds {built:?}); \
                     the chart runs that image"
            )
        })
        .collect()
}

/// The dynamic libraries and program interpreter an ELF executable names.
#[derive(Debug, Default, PartialEq)]
pub(super) struct Linkage {
    /// DT_NEEDED entries: sonames.
    pub(super) needed: Vec<String>,
    /// PT_INTERP: the dynamic loader's path; `None` for a static executable.
    pub(super) interpreter: Option<String>,
}

/// Reads the DT_NEEDED entries and the PT_INTERP path of an ELF file.
pub(super) fn linkage(data: &[u8]) -> anyhow::Result<Linkage> {
    match object::FileKind::parse(data).context("not an object file")? {
        object::FileKind::Elf64 => {
            linkage_of::<object::elf::FileHeader64<object::Endianness>>(data)
        }
        object::FileKind::Elf32 => {
            linkage_of::<object::elf::FileHeader32<object::Endianness>>(data)
        }
        other => bail!("not an ELF file but {other:?}"),
    }
}

fn linkage_of<Elf: FileHeader<Endian = object::Endianness>>(
    data: &[u8],
) -> anyhow::Result<Linkage> {
    let header = Elf::parse(data).context("reading the ELF header")?;
    let endian = header.endian().context("reading the ELF byte order")?;
    let table = header
        .sections(endian, data)
        .context("reading the section table")?
        .dynamic_table(endian, data)
        .context("reading the dynamic section")?;
    let mut needed = Vec::new();
    for entry in &table {
        if entry.tag == object::elf::DT_NEEDED {
            let name = table.string(entry).context("reading a DT_NEEDED name")?;
            needed.push(String::from_utf8_lossy(name).into_owned());
        }
    }
    let mut interpreter = None;
    for ph in header
        .program_headers(endian, data)
        .context("reading the program headers")?
    {
        if let Some(path) = ph
            .interpreter(endian, data)
            .context("reading the interpreter")?
        {
            interpreter = Some(String::from_utf8_lossy(path).into_owned());
        }
    }
    Ok(Linkage {
        needed,
        interpreter,
    })
}

/// Every library and the loader the binary needs must be in the runtime base.
pub(super) fn check_libraries(base: &Base, binary: &str, linkage: &Linkage) -> Vec<String> {
    let mut problems: Vec<String> = linkage
        .needed
        .iter()
        .filter(|lib| !base.libraries.contains(&lib.as_str()))
        .map(|lib| {
            format!(
                "{binary} needs {lib}, which the runtime image {} does not provide; use a \
                     base that has it (or add it to BASES in xtask/src/deploy.rs if it does)",
                base.name
            )
        })
        .collect();
    if let Some(loader) = &linkage.interpreter
        && !base.interpreters.contains(&loader.as_str())
    {
        problems.push(format!(
            "{binary}'s dynamic loader {loader} is not in the runtime image {}",
            base.name
        ));
    }
    problems
}

/// One `.dockerignore` rule.
#[derive(Debug)]
pub(super) struct IgnoreRule {
    exception: bool,
    segments: Vec<String>,
}

/// Parses `.dockerignore`: a pattern per line, `#` comments, `!` for exceptions, paths
/// relative to the context root.
pub(super) fn parse_ignore(text: &str) -> Vec<IgnoreRule> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (exception, pattern) = match l.strip_prefix('!') {
                Some(p) => (true, p.trim()),
                None => (false, l),
            };
            IgnoreRule {
                exception,
                segments: pattern
                    .split('/')
                    .filter(|s| !s.is_empty() && *s != ".")
                    .map(str::to_string)
                    .collect(),
            }
        })
        .collect()
}

/// Whether `path` (relative to the context root) reaches the build: the last rule that
/// matches it or one of its parent directories decides.
pub(super) fn kept(rules: &[IgnoreRule], path: &str) -> bool {
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let mut kept = true;
    for rule in rules {
        let pattern: Vec<&str> = rule.segments.iter().map(String::as_str).collect();
        if (1..=segments.len()).any(|n| glob_path(&pattern, &segments[..n])) {
            kept = rule.exception;
        }
    }
    kept
}

/// Matches path segments against pattern segments; `**` matches any number of segments.
fn glob_path(pattern: &[&str], path: &[&str]) -> bool {
    match pattern.split_first() {
        None => path.is_empty(),
        Some((&"**", rest)) => (0..=path.len()).any(|n| glob_path(rest, &path[n..])),
        Some((p, rest)) => path.split_first().is_some_and(|(s, tail)| {
            glob_segment(p.as_bytes(), s.as_bytes()) && glob_path(rest, tail)
        }),
    }
}

/// Matches one segment: `*` is any run of characters, `?` one character.
fn glob_segment(p: &[u8], s: &[u8]) -> bool {
    match p.split_first() {
        None => s.is_empty(),
        Some((b'*', rest)) => (0..=s.len()).any(|n| glob_segment(rest, &s[n..])),
        Some((b'?', rest)) => !s.is_empty() && glob_segment(rest, &s[1..]),
        Some((c, rest)) => s.first() == Some(c) && glob_segment(rest, &s[1..]),
    }
}

/// The build context: `.dockerignore` keeps every path the Dockerfile copies from it, the
/// workspace manifest, lock file and every member's manifest are copied, and `target/`
/// stays out.
pub(super) fn check_context(df: &Dockerfile, rules: &[IgnoreRule], ws: &Workspace) -> Vec<String> {
    let mut problems = Vec::new();
    let mut sources = Vec::new();
    for stage in &df.stages {
        for i in stage.all("COPY").chain(stage.all("ADD")) {
            let Ok(c) = copy(i) else { continue };
            if c.from.is_some() {
                continue;
            }
            for s in c.sources {
                let s = s.trim_start_matches("./").trim_end_matches('/').to_string();
                let s = if s.is_empty() { ".".to_string() } else { s };
                if s != "." && !kept(rules, &s) {
                    problems.push(format!(
                        "{}: copies {s}, which {DOCKERIGNORE} leaves out of the build context",
                        at(c.line)
                    ));
                }
                sources.push(s);
            }
        }
    }
    let copied = |path: &str| {
        sources.iter().any(|s| {
            s == "." || {
                let pattern: Vec<&str> = s.split('/').collect();
                let segments: Vec<&str> = path.split('/').collect();
                (1..=segments.len()).any(|n| glob_path(&pattern, &segments[..n]))
            }
        })
    };
    let mut required = vec!["Cargo.toml".to_string(), "Cargo.lock".to_string()];
    required.extend(ws.members.iter().cloned());
    for path in required {
        if !kept(rules, &path) {
            problems.push(format!(
                "{DOCKERIGNORE} leaves {path} out of the build context; cargo needs it"
            ));
        } else if !copied(&path) {
            problems.push(format!(
                "{DOCKERFILE} does not copy {path} into the builder; cargo needs every \
                     workspace member's manifest"
            ));
        }
    }
    if kept(rules, "target/release") {
        problems.push(format!(
            "{DOCKERIGNORE} does not leave target/ out: the build context would carry the \
                 whole target directory"
        ));
    }
    problems
}

/// Recreates what the builder stage's context COPYs put in its build directory (only the
/// files `.dockerignore` keeps) under `into`, relative to the WORKDIR of `cargo build`.
/// Returns the problems: sources that do not exist or a stage without `cargo build`.
pub(super) fn copy_context(
    root: &Path,
    df: &Dockerfile,
    rules: &[IgnoreRule],
    into: &Path,
) -> anyhow::Result<Vec<String>> {
    let Some(builder) = df
        .stages
        .iter()
        .find(|s| s.all("RUN").any(|i| i.args.contains("cargo build")))
    else {
        return Ok(vec![format!(
            "{DOCKERFILE} has no stage that runs `cargo build`"
        )]);
    };
    let build_dir = {
        let mut dir = "/".to_string();
        for i in &builder.body {
            if i.keyword == "WORKDIR" {
                dir = join(&dir, i.args.trim());
            } else if i.keyword == "RUN" && i.args.contains("cargo build") {
                break;
            }
        }
        dir
    };
    let mut problems = Vec::new();
    let mut workdir = "/".to_string();
    for i in &builder.body {
        match i.keyword.as_str() {
            "WORKDIR" => workdir = join(&workdir, i.args.trim()),
            "RUN" if i.args.contains("cargo build") => break,
            "COPY" | "ADD" => {}
            _ => continue,
        }
        let Ok(c) = copy(i) else { continue };
        if c.from.is_some() {
            continue;
        }
        let dest = join(&workdir, &c.dest);
        let Some(relative) = dest
            .strip_prefix(build_dir.trim_end_matches('/'))
            .map(|r| r.trim_start_matches('/'))
        else {
            continue;
        };
        let into_dir = c.dest.ends_with('/') || c.sources.len() > 1;
        for source in &c.sources {
            let path = root.join(source.trim_start_matches("./"));
            let name = source
                .trim_end_matches('/')
                .rsplit('/')
                .next()
                .unwrap_or(source);
            if path.is_dir() {
                // A directory's contents go to the destination.
                copy_tree(root, &path, rules, &into.join(relative))?;
            } else if path.is_file() {
                let target = if into_dir {
                    into.join(relative).join(name)
                } else {
                    into.join(relative)
                };
                if let Some(parent) = target.parent() {
                    std::fs::create_dir_all(parent)
                        .with_context(|| format!("creating {}", parent.display()))?;
                }
                std::fs::copy(&path, &target)
                    .with_context(|| format!("copying {}", path.display()))?;
            } else {
                problems.push(format!(
                    "{}: copies {source}, which is not in the repository",
                    at(c.line)
                ));
            }
        }
    }
    Ok(problems)
}

/// Copies the files beneath `dir` that `.dockerignore` keeps into `to`.
fn copy_tree(root: &Path, dir: &Path, rules: &[IgnoreRule], to: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(to).with_context(|| format!("creating {}", to.display()))?;
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let entry = entry.with_context(|| format!("reading {}", dir.display()))?;
        let path = entry.path();
        let relative = path
            .strip_prefix(root)
            .unwrap_or(&path)
            .display()
            .to_string();
        if !kept(rules, &relative) {
            continue;
        }
        let kind = entry
            .file_type()
            .with_context(|| format!("reading {}", path.display()))?;
        let target = to.join(entry.file_name());
        if kind.is_dir() {
            copy_tree(root, &path, rules, &target)?;
        } else if kind.is_file() {
            std::fs::copy(&path, &target).with_context(|| format!("copying {}", path.display()))?;
        }
    }
    Ok(())
}

/// Runs `cargo metadata --locked` in the recreated build directory: cargo loads the workspace
/// from what the image build sees, and the lock file needs no change. Not `--offline`: loading
/// the lock file needs every locked package's manifest, for other platforms too, which a cargo
/// cache that only ever built for this machine does not hold (the image build downloads them
/// the same way).
fn cargo_loads(build_dir: &Path) -> Vec<String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = std::process::Command::new(cargo)
        .current_dir(build_dir)
        .args(["metadata", "--locked", "--format-version", "1"])
        .env("CARGO_TARGET_DIR", build_dir.join("target"))
        .output();
    match out {
        Ok(o) if o.status.success() => Vec::new(),
        Ok(o) => vec![format!(
            "cargo cannot load the workspace from what {DOCKERFILE} copies into the builder \
                 (as {DOCKERIGNORE} filters it): {}",
            String::from_utf8_lossy(&o.stderr)
                .trim()
                .replace(&build_dir.display().to_string(), "<builder WORKDIR>")
        )],
        Err(e) => vec![format!("running cargo metadata: {e}")],
    }
}

/// The kubedev crate's facts and the workspace members, from `cargo metadata`, and the
/// workspace repository from the root Cargo.toml.
pub(super) fn workspace(root: &Path, metadata: &Value) -> anyhow::Result<Workspace> {
    let packages = metadata
        .get("packages")
        .and_then(Value::as_array)
        .context("`cargo metadata` lists no packages")?;
    let kubedev = packages
        .iter()
        .find(|p| p.get("name").and_then(Value::as_str) == Some("kubedev"))
        .context("`cargo metadata` has no kubedev package")?;
    let text = |v: &Value, k: &str| {
        v.get(k)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    let features = kubedev
        .get("features")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .map(|(k, v)| {
            let implied = v
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect();
            (k.clone(), implied)
        })
        .collect();
    let members: BTreeSet<&str> = metadata
        .get("workspace_members")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    let mut member_manifests = Vec::new();
    for p in packages {
        let id = p.get("id").and_then(Value::as_str).unwrap_or_default();
        if !members.contains(id) {
            continue;
        }
        let manifest = Path::new(
            p.get("manifest_path")
                .and_then(Value::as_str)
                .unwrap_or_default(),
        );
        let relative = manifest
            .strip_prefix(root)
            .with_context(|| format!("{} lies outside {}", manifest.display(), root.display()))?;
        member_manifests.push(relative.display().to_string());
    }
    member_manifests.sort();
    let cargo_toml = root.join("Cargo.toml");
    let manifest = std::fs::read_to_string(&cargo_toml)
        .with_context(|| format!("reading {}", cargo_toml.display()))?;
    Ok(Workspace {
        rust_version: text(kubedev, "rust_version"),
        version: text(kubedev, "version"),
        license: text(kubedev, "license"),
        description: text(kubedev, "description"),
        repository: workspace_package_key(&manifest, "repository").unwrap_or_default(),
        features,
        members: member_manifests,
    })
}

/// A string `key = "value"` of the `[workspace.package]` table (which `cargo metadata` does
/// not report when a crate does not inherit it).
pub(super) fn workspace_package_key(manifest: &str, key: &str) -> Option<String> {
    let mut inside = false;
    for line in manifest.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            inside = line == "[workspace.package]";
            continue;
        }
        if !inside {
            continue;
        }
        if let Some((k, v)) = line.split_once('=')
            && k.trim() == key
        {
            return serde_json::from_str::<String>(v.trim()).ok();
        }
    }
    None
}

/// Every image check: reads the Dockerfile, `.dockerignore`, Chart.yaml and the daemon
/// binary; `default` is the chart's default rendering's daemon container and configuration,
/// `configs` each rendering's label and configuration. Returns the problems.
pub(super) fn check(
    root: &Path,
    metadata: &Value,
    binary: &Path,
    default_container: &Value,
    configs: &[(String, Value)],
) -> anyhow::Result<Vec<String>> {
    let ws = workspace(root, metadata)?;
    let path = root.join(DOCKERFILE);
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let df = match parse(&text) {
        Ok(df) => df,
        Err(e) => return Ok(vec![e]),
    };
    let chart_yaml = root.join(super::CHART).join("Chart.yaml");
    let chart_meta: Value = serde_saphyr::from_str(
        &std::fs::read_to_string(&chart_yaml)
            .with_context(|| format!("reading {}", chart_yaml.display()))?,
    )
    .with_context(|| format!("{} is not YAML", chart_yaml.display()))?;
    let strings = |v: Option<&Value>| -> Vec<String> {
        v.and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .map(str::to_string)
            .collect()
    };
    let chart = Chart {
        command: strings(default_container.get("command")),
        args: strings(default_container.get("args")),
        metrics_port: default_container
            .get("ports")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .find(|p| p.get("name").and_then(Value::as_str) == Some("metrics"))
            .and_then(|p| p.get("containerPort"))
            .and_then(Value::as_u64),
        app_version: match chart_meta.get("appVersion") {
            Some(Value::String(s)) => s.clone(),
            Some(other) => other.to_string(),
            None => String::new(),
        },
    };

    let (mut problems, built) = check_dockerfile(&df, &ws, &chart);

    let ignore = root.join(DOCKERIGNORE);
    let rules = match std::fs::read_to_string(&ignore) {
        Ok(t) => parse_ignore(&t),
        Err(e) => {
            problems.push(format!("reading {}: {e}", ignore.display()));
            Vec::new()
        }
    };
    problems.extend(check_context(&df, &rules, &ws));
    let context = tempfile::tempdir().context("creating a scratch build directory")?;
    let copied = copy_context(root, &df, &rules, context.path())?;
    if copied.is_empty() {
        problems.extend(cargo_loads(context.path()));
    }
    problems.extend(copied);

    let mut needs = Vec::new();
    for (label, config) in configs {
        match needed_features(config) {
            Ok(n) => needs.extend(n.into_iter().map(|(s, f)| (label.clone(), s, f))),
            Err(e) => problems.push(format!("{label}: {e}")),
        }
    }
    if let Some(built) = &built {
        problems.extend(check_features(&built.features, &needs));
        if let Some(base) = built.base {
            let bytes =
                std::fs::read(binary).with_context(|| format!("reading {}", binary.display()))?;
            let linkage = linkage(&bytes)
                .with_context(|| format!("reading the ELF headers of {}", binary.display()))?;
            problems.extend(check_libraries(
                base,
                &binary.display().to_string(),
                &linkage,
            ));
        }
    }
    Ok(problems)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// A small Dockerfile with everything the checks want.
    const GOOD: &str = r#"# syntax=docker/dockerfile:1
FROM rust:1.95-slim-bookworm AS builder
ARG FEATURES=""
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY crates crates
COPY xtask xtask
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    # a comment inside a continuation
    if [ -n "$FEATURES" ]; then set -- --no-default-features --features "$FEATURES"; fi; \
    cargo build --release --locked -p kubedev "$@"; \
    cp target/release/kubedev /out/kubedev

FROM gcr.io/distroless/cc-debian12
LABEL org.opencontainers.image.source="https://example.invalid/kubedev" \
      org.opencontainers.image.licenses=Apache-2.0 \
      org.opencontainers.image.description="kubedev: a daemon"
COPY --from=builder /out/kubedev /usr/local/bin/
USER 0:0
EXPOSE 9464/tcp
ENTRYPOINT ["/usr/local/bin/kubedev"]
CMD ["run", "--config", "/etc/kubedev/config.yaml"]
"#;

    fn workspace() -> Workspace {
        let features = [
            ("default", vec!["nvidia", "vfio", "usb", "host", "wasm"]),
            ("nvidia", vec!["dep:kubedev-nvidia"]),
            ("vfio", vec!["dep:kubedev-vfio"]),
            ("usb", vec!["dep:kubedev-usb"]),
            ("host", vec!["dep:kubedev-host"]),
            ("wasm", vec!["dep:kubedev-sandbox"]),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.into_iter().map(str::to_string).collect()))
        .collect();
        Workspace {
            rust_version: "1.95".into(),
            version: "0.1.0".into(),
            license: "Apache-2.0".into(),
            description: "kubedev: a daemon".into(),
            repository: "https://example.invalid/kubedev".into(),
            features,
            members: vec![
                "crates/core/Cargo.toml".into(),
                "crates/kubedev/Cargo.toml".into(),
                "xtask/Cargo.toml".into(),
            ],
        }
    }

    fn chart() -> Chart {
        Chart {
            command: vec!["kubedev".into()],
            args: ["run", "--config", "/etc/kubedev/config.yaml"]
                .map(String::from)
                .to_vec(),
            metrics_port: Some(9464),
            app_version: "0.1.0".into(),
        }
    }

    /// GOOD with `from` replaced by `to` (which must occur), checked.
    #[track_caller]
    fn problems_with(from: &str, to: &str) -> Vec<String> {
        assert!(
            GOOD.contains(from),
            "{from:?} is not in the test Dockerfile"
        );
        let df = parse(&GOOD.replacen(from, to, 1)).unwrap();
        check_dockerfile(&df, &workspace(), &chart()).0
    }

    /// Asserts exactly one problem, containing `needle`.
    #[track_caller]
    fn one(problems: &[String], needle: &str) {
        assert_eq!(problems.len(), 1, "{problems:#?}");
        assert!(problems[0].contains(needle), "{problems:#?}");
    }

    #[test]
    fn stages_instructions_and_continuations_are_read() {
        let df = parse(GOOD).unwrap();
        assert_eq!(df.stages.len(), 2);
        let builder = &df.stages[0];
        assert_eq!(
            (
                builder.line,
                builder.image.as_str(),
                builder.name.as_deref()
            ),
            (2, "rust:1.95-slim-bookworm", Some("builder"))
        );
        let run = builder.last("RUN").unwrap();
        assert_eq!(run.line, 8);
        assert!(!run.args.contains("a comment"), "{}", run.args);
        assert!(run.args.ends_with("cp target/release/kubedev /out/kubedev"));
        assert_eq!(df.stage("0").unwrap().line, 2);
        assert_eq!(df.stage("BUILDER").unwrap().line, 2);
        assert!(df.stage("2").is_none());

        assert!(
            parse("RUN true\nFROM x\n")
                .unwrap_err()
                .contains(":1: RUN before")
        );
        assert!(
            parse("FROM x\nRUN a \\\n")
                .unwrap_err()
                .contains("continuation")
        );
        assert!(parse("# only a comment\n").unwrap_err().contains("no FROM"));
    }

    #[test]
    fn words_honour_quotes_and_escapes() {
        assert_eq!(
            words(r#"a="b c" 'd e' f\ g"#).unwrap(),
            vec!["a=b c", "d e", "f g"]
        );
        assert!(words(r#"a="b"#).unwrap_err().contains("unterminated"));
        assert_eq!(
            pairs("PATH /a:/b").unwrap(),
            vec![("PATH".to_string(), Some("/a:/b".to_string()))]
        );
    }

    #[test]
    fn image_references_and_versions() {
        let r = image_ref("docker.io/library/rust:1.95.1-bookworm@sha256:ab");
        assert_eq!(
            (r.name.as_str(), r.tag.as_deref(), r.digest.as_deref()),
            ("rust", Some("1.95.1-bookworm"), Some("sha256:ab"))
        );
        let r = image_ref("localhost:5000/distroless/cc-debian12");
        assert_eq!(
            (r.name.as_str(), r.tag),
            ("localhost:5000/distroless/cc-debian12", None)
        );
        assert_eq!(version("1.95"), Some((1, 95, 0)));
        assert_eq!(version("1.95.2"), Some((1, 95, 2)));
        assert!(version("1.100") > version("1.95"));
        assert_eq!(version("1"), None);
        assert_eq!(version("slim"), None);
    }

    #[test]
    fn the_good_dockerfile_passes_and_builds_every_default_feature() {
        let df = parse(GOOD).unwrap();
        let (problems, built) = check_dockerfile(&df, &workspace(), &chart());
        assert_eq!(problems, Vec::<String>::new());
        let built = built.unwrap();
        assert_eq!(
            built
                .features
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>(),
            vec!["host", "nvidia", "usb", "vfio", "wasm"]
        );
        assert_eq!(built.base.unwrap().name, "gcr.io/distroless/cc-debian12");
    }

    #[test]
    fn builder_drift_is_reported() {
        let builder = "FROM rust:1.95-slim-bookworm AS builder";
        one(
            &problems_with(builder, "FROM rust:1.94-slim-bookworm AS builder"),
            "older than the workspace's rust-version 1.95",
        );
        one(
            &problems_with(builder, "FROM rust:slim-bookworm AS builder"),
            "names no Rust version",
        );
        one(
            &problems_with(builder, "FROM rust:1.96-slim-trixie AS builder"),
            "the builder is Debian 13 but the runtime image is Debian 12",
        );
        one(
            &problems_with(builder, "FROM debian:bookworm AS builder"),
            "not the official Rust image",
        );
        one(&problems_with("--locked ", ""), "without --locked");
        one(
            &problems_with("-p kubedev", "-p kubedev-core"),
            "-p kubedev",
        );
        one(
            &problems_with(
                "--mount=type=cache,target=/src/target",
                "--mount=type=tmpfs,target=/src/target",
            ),
            "the target directory (/src/target)",
        );
        one(
            &problems_with("--features \"$FEATURES\"", "--features vfio"),
            "does not pass $FEATURES",
        );
        one(
            &problems_with("--no-default-features ", ""),
            "--no-default-features",
        );
        one(
            &problems_with("cp target/release/kubedev /out/kubedev", "true"),
            "does not copy target/release/kubedev there",
        );
        one(&problems_with("ARG FEATURES=\"\"", ""), "no ARG FEATURES");
        one(
            &problems_with("ARG FEATURES=\"\"", "ARG FEATURES=gpu,host"),
            "\"gpu\", which is not a feature",
        );
        // A FEATURES default builds exactly what it names.
        let df = parse(&GOOD.replace("ARG FEATURES=\"\"", "ARG FEATURES=\"usb, host\"")).unwrap();
        let built = check_dockerfile(&df, &workspace(), &chart()).1.unwrap();
        assert_eq!(
            built.features.into_iter().collect::<Vec<_>>(),
            vec!["host", "usb"]
        );
    }

    #[test]
    fn runtime_drift_is_reported() {
        one(
            &problems_with("/usr/local/bin/\n", "/opt/kubedev/\n"),
            "the chart runs \"kubedev\", but the runtime stage installs no such file in a \
                 directory on its PATH",
        );
        // The same, but on a PATH the stage sets: fine.
        let mut df_text = GOOD.replacen("/usr/local/bin/\n", "/opt/kubedev/\n", 1);
        df_text = df_text.replace(
            "ENTRYPOINT [\"/usr/local/bin/kubedev\"]",
            "ENV PATH=/opt/kubedev:$PATH\nENTRYPOINT [\"kubedev\"]",
        );
        let df = parse(&df_text).unwrap();
        assert_eq!(
            check_dockerfile(&df, &workspace(), &chart()).0,
            Vec::<String>::new()
        );

        one(
            &problems_with(
                "\"--config\", \"/etc/kubedev/config.yaml\"",
                "\"--config\", \"/etc/config.yaml\"",
            ),
            "differ from the chart's command",
        );
        one(
            &problems_with(
                "ENTRYPOINT [\"/usr/local/bin/kubedev\"]",
                "ENTRYPOINT /usr/local/bin/kubedev",
            ),
            "shell form",
        );
        one(&problems_with("USER 0:0", "USER 65532"), "must run as root");
        // The last USER counts; without one the base's user does.
        let nonroot_then_root = problems_with("cc-debian12\n", "cc-debian12:nonroot\nUSER 65532\n");
        assert_eq!(nonroot_then_root, Vec::<String>::new());
        assert_eq!(problems_with("USER 0:0", ""), Vec::<String>::new());
        let nonroot = GOOD
            .replace("cc-debian12\n", "cc-debian12:nonroot\n")
            .replace("USER 0:0\n", "");
        one(
            &check_dockerfile(&parse(&nonroot).unwrap(), &workspace(), &chart()).0,
            "runs as a non-root user and no USER 0 follows",
        );
        one(
            &problems_with("EXPOSE 9464/tcp", "EXPOSE 8080"),
            "does not EXPOSE 9464",
        );
        one(
            &problems_with("licenses=Apache-2.0", "licenses=MIT"),
            "LABEL org.opencontainers.image.licenses is Some(\"MIT\")",
        );
        one(
            &problems_with("gcr.io/distroless/cc-debian12", "alpine:3.22"),
            "does not know which libraries the runtime image alpine provides",
        );
        let df = parse(GOOD).unwrap();
        let mut old = chart();
        old.app_version = "0.0.9".into();
        one(
            &check_dockerfile(&df, &workspace(), &old).0,
            "appVersion \"0.0.9\"",
        );
    }

    #[test]
    fn features_the_chart_enables_must_be_built() {
        let config = serde_json::json!({
            "backends": {"static": {}, "nvidia": {}, "host": {}},
            "devicePlugin": {
                "policyDir": "/etc/kubedev/policies",
                "resources": [{"name": "a/b"}, {"name": "c/d", "policy": "numa-pack.wasm"}],
            },
        });
        let needs = needed_features(&config).unwrap();
        assert_eq!(
            needs,
            vec![
                ("backends.host".to_string(), "host"),
                ("backends.nvidia".to_string(), "nvidia"),
                ("devicePlugin.policyDir".to_string(), "wasm"),
                ("devicePlugin.resources[1].policy".to_string(), "wasm"),
            ]
        );
        let unknown = serde_json::json!({"backends": {"fpga": {}}});
        assert!(
            needed_features(&unknown)
                .unwrap_err()
                .contains("backends.fpga")
        );

        let needs: Vec<_> = needs
            .into_iter()
            .map(|(s, f)| ("ci/x.yaml".to_string(), s, f))
            .collect();
        let built = resolve(
            &workspace().features,
            ["host".to_string(), "wasm".to_string()],
        );
        let problems = check_features(&built, &needs);
        one(
            &problems,
            "ci/x.yaml: backends.nvidia needs the cargo feature `nvidia`",
        );
        let all = resolve(&workspace().features, ["default".to_string()]);
        assert_eq!(check_features(&all, &needs), Vec::<String>::new());
    }

    #[test]
    fn elf_linkage_is_read_and_bad_files_are_errors() {
        let exe = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        let found = linkage(&exe).unwrap();
        assert!(found.needed.iter().any(|l| l == "libc.so.6"), "{found:?}");
        assert!(
            found
                .interpreter
                .as_deref()
                .is_some_and(|i| i.contains("ld-")),
            "{found:?}"
        );
        assert!(linkage(b"#!/bin/sh\necho not elf\n").is_err());
        // A header whose tables point past the end.
        assert!(linkage(&exe[..80]).is_err());
    }

    #[test]
    fn libraries_the_base_lacks_are_reported() {
        let base = &BASES[0];
        let fine = Linkage {
            needed: [
                "libgcc_s.so.1",
                "libm.so.6",
                "libc.so.6",
                "ld-linux-x86-64.so.2",
            ]
            .map(String::from)
            .to_vec(),
            interpreter: Some("/lib64/ld-linux-x86-64.so.2".into()),
        };
        assert_eq!(
            check_libraries(base, "kubedev", &fine),
            Vec::<String>::new()
        );
        let wanting = Linkage {
            needed: ["libc.so.6", "libudev.so.1"].map(String::from).to_vec(),
            interpreter: Some("/lib/ld-musl-x86_64.so.1".into()),
        };
        let problems = check_libraries(base, "kubedev", &wanting);
        assert_eq!(problems.len(), 2, "{problems:#?}");
        assert!(problems[0].contains("needs libudev.so.1"), "{problems:#?}");
        assert!(problems[1].contains("ld-musl"), "{problems:#?}");
    }

    const IGNORE: &str = "# comment\n*\n!Cargo.toml\n!Cargo.lock\n!crates\n!xtask/\n**/target\n";

    #[test]
    fn dockerignore_rules_apply_to_paths_and_their_parents() {
        let rules = parse_ignore(IGNORE);
        assert!(kept(&rules, "Cargo.toml"));
        assert!(kept(&rules, "crates/core/src/lib.rs"));
        assert!(kept(&rules, "xtask/Cargo.toml"));
        assert!(!kept(&rules, "crates/core/target/debug/x"));
        assert!(!kept(&rules, "target/release/kubedev"));
        assert!(!kept(&rules, "docs/operations.md"));
        assert!(!kept(&rules, ".git/HEAD"));
        let none = parse_ignore("");
        assert!(kept(&none, "target/release"));
    }

    #[test]
    fn the_build_context_must_hold_what_cargo_reads() {
        let df = parse(GOOD).unwrap();
        let ws = workspace();
        assert_eq!(
            check_context(&df, &parse_ignore(IGNORE), &ws),
            Vec::<String>::new()
        );
        let no_xtask = check_context(&df, &parse_ignore(&IGNORE.replace("!xtask/\n", "")), &ws);
        assert_eq!(no_xtask.len(), 2, "{no_xtask:#?}");
        assert!(no_xtask[0].contains(":7: copies xtask"), "{no_xtask:#?}");
        assert!(
            no_xtask[1].contains("leaves xtask/Cargo.toml out"),
            "{no_xtask:#?}"
        );
        one(
            &check_context(&df, &parse_ignore("docs\n"), &ws),
            "does not leave target/ out",
        );
        let no_xtask = parse(&GOOD.replace("COPY xtask xtask\n", "")).unwrap();
        one(
            &check_context(&no_xtask, &parse_ignore(IGNORE), &ws),
            "does not copy xtask/Cargo.toml",
        );
        let docs = parse(&GOOD.replace("COPY xtask xtask\n", "COPY xtask xtask\nCOPY docs docs\n"))
            .unwrap();
        one(
            &check_context(&docs, &parse_ignore(IGNORE), &ws),
            "copies docs, which .dockerignore leaves out",
        );
    }

    #[test]
    fn the_builder_context_is_recreated_and_must_load_as_a_locked_workspace() {
        let repo = tempfile::tempdir().unwrap();
        let write = |path: &str, text: &str| {
            let p = repo.path().join(path);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        };
        write(
            "Cargo.toml",
            "[workspace]\nmembers = [\"crates/*\"]\nresolver = \"3\"\n",
        );
        write(
            "crates/a/Cargo.toml",
            "[package]\nname = \"a\"\nversion = \"0.1.0\"\nedition = \"2024\"\n",
        );
        write("crates/a/src/lib.rs", "");
        write("crates/a/target/debug/junk", "");
        write("docs/x.md", "");
        let rules = parse_ignore(IGNORE);
        let only_crates = GOOD.replace("COPY xtask xtask\n", "");

        // No lock file: the COPY of Cargo.lock names a missing file.
        let into = tempfile::tempdir().unwrap();
        let df = parse(&only_crates).unwrap();
        let p = copy_context(repo.path(), &df, &rules, into.path()).unwrap();
        one(&p, ":5: copies Cargo.lock, which is not in the repository");

        // A stale lock file: cargo refuses under --locked.
        write("Cargo.lock", "version = 4\n");
        let into = tempfile::tempdir().unwrap();
        assert_eq!(
            copy_context(repo.path(), &df, &rules, into.path()).unwrap(),
            Vec::<String>::new()
        );
        for kept in [
            "Cargo.toml",
            "Cargo.lock",
            "crates/a/Cargo.toml",
            "crates/a/src/lib.rs",
        ] {
            assert!(into.path().join(kept).is_file(), "{kept} was not copied");
        }
        assert!(!into.path().join("crates/a/target").exists());
        assert!(!into.path().join("docs").exists());
        one(&cargo_loads(into.path()), "cannot load the workspace");

        // The right lock file: it loads.
        write(
            "Cargo.lock",
            "version = 4\n\n[[package]]\nname = \"a\"\nversion = \"0.1.0\"\n",
        );
        let into = tempfile::tempdir().unwrap();
        copy_context(repo.path(), &df, &rules, into.path()).unwrap();
        assert_eq!(cargo_loads(into.path()), Vec::<String>::new());
    }

    #[test]
    fn the_workspace_repository_is_read_from_its_table() {
        let manifest = "[package]\nrepository = \"no\"\n[workspace.package]\nversion = \"0.1.0\"\n\
                            repository = \"https://example.invalid/kubedev\"\n[profile.dev]\n";
        assert_eq!(
            workspace_package_key(manifest, "repository").as_deref(),
            Some("https://example.invalid/kubedev")
        );
        assert_eq!(workspace_package_key(manifest, "license"), None);
    }
}
