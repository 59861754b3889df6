//! The runtime stage against the chart and the workspace: a base deploy-check knows, root, the
//! binary the chart runs installed on the PATH, ENTRYPOINT and CMD the chart's command, the
//! metrics port exposed, the environment the soaks measure, the labels; then the builder stage the binary comes from (the
//! `builder` module). And the libraries the daemon's ELF headers name, in the base.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::{Context as _, bail};
use object::read::elf::{FileHeader, ProgramHeader as _};

use super::builder::check_builder;
use super::dockerfile::{
    Copy, Dockerfile, ImageRef, Stage, at, copy, debian_of_tag, image_ref, join, pairs,
};
use super::{Built, Chart, DOCKERFILE, Workspace};

/// A runtime base image deploy-check knows: what it provides and how it runs.
#[derive(Debug)]
pub(in crate::deploy) struct Base {
    /// Image name without tag.
    pub(super) name: &'static str,
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
    // ENV: what the soaks and the real cluster run the daemon with.
    problems.extend(check_env(runtime));
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
                 provides; use one of {:?} or add it to BASES in xtask/src/deploy/image/runtime.rs",
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
        runtime.last(keyword).and_then(|i| i.exec.clone())
    };
    let entrypoint = exec("ENTRYPOINT").unwrap_or_default();
    let cmd = exec("CMD").unwrap_or_default();
    let mut shell_form = false;
    for keyword in ["ENTRYPOINT", "CMD"] {
        if let Some(i) = runtime.last(keyword)
            && i.exec.is_none()
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

/// The runtime stage sets the environment kubedev's image gives the daemon
/// ([`KUBEDEV_ENV`](crate::cluster::image::KUBEDEV_ENV): the image the real cluster runs, and
/// what the soaks measure); returns the problems.
fn check_env(runtime: &Stage) -> Vec<String> {
    let mut set = BTreeMap::new();
    for i in runtime.all("ENV") {
        if let Ok(pairs) = pairs(&i.args) {
            set.extend(pairs.into_iter().map(|(k, v)| (k, v.unwrap_or_default())));
        }
    }
    crate::cluster::image::KUBEDEV_ENV
        .iter()
        .filter(|(k, v)| set.get(*k).map(String::as_str) != Some(*v))
        .map(|(k, v)| {
            format!(
                "{}: the runtime stage sets {k} to {:?}, but kubedev's image sets {k}={v} \
                 (KUBEDEV_ENV in xtask/src/cluster/image.rs: what the soaks and the real \
                 cluster run the daemon with)",
                at(runtime.line),
                set.get(*k)
            )
        })
        .collect()
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
                     base that has it (or add it to BASES in xtask/src/deploy/image/runtime.rs if it does)",
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
