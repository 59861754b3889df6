use super::builder::*;
use super::context::*;
use super::dockerfile::*;
use super::runtime::*;
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
ENV MALLOC_ARENA_MAX=1
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
        release_profiles: ["release", "dist"].map(String::from).into(),
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

    let before = parse("RUN true\nFROM x\n").unwrap_err();
    assert!(before.contains("expected FROM at line 1"), "{before}");
    let none = parse("# only a comment\n").unwrap_err();
    assert!(none.contains("at least one FROM"), "{none}");
}

#[test]
fn exec_forms_options_and_escape_directives_are_read() {
    let df = parse(
        "# escape=`\nFROM --platform=linux/amd64 x AS b\nRUN --mount=type=cache,target=/t `\n  # a comment\n  make all\nCOPY --from=b [\"/a b\", \"/c\"]\nENTRYPOINT [\"/bin/d\", \"run\"]\nCMD d run\n",
    )
    .unwrap();
    let stage = &df.stages[0];
    assert_eq!(
        (stage.image.as_str(), stage.name.as_deref()),
        ("x", Some("b"))
    );
    let run = run(stage.last("RUN").unwrap());
    assert_eq!(run.command, "make all");
    assert_eq!(run.mounts[0]["target"], "/t");
    let copied = copy(stage.last("COPY").unwrap()).unwrap();
    assert_eq!(
        (
            copied.from.as_deref(),
            copied.sources,
            copied.dest.as_str(),
            copied.line
        ),
        (Some("b"), vec!["/a b".to_string()], "/c", 6)
    );
    assert_eq!(
        stage.last("ENTRYPOINT").unwrap().exec.as_deref(),
        Some(&["/bin/d".to_string(), "run".to_string()][..])
    );
    assert!(stage.last("CMD").unwrap().exec.is_none());
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
    one(&problems_with("--release ", ""), "without --release");
    one(
        &problems_with("--release ", "--profile dev "),
        "--profile dev: not a profile that optimizes as release does (release, or a workspace \
         profile that inherits from it: dist, release)",
    );
    one(
        &problems_with("--release ", "--profile dist "),
        "does not copy target/dist/kubedev there",
    );
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
fn a_profile_that_inherits_from_release_builds_the_image() {
    let dist = GOOD
        .replace("--release ", "--profile dist ")
        .replace("cp target/release/kubedev", "cp target/dist/kubedev");
    let df = parse(&dist).unwrap();
    let (problems, _) = check_dockerfile(&df, &workspace(), &chart());
    assert!(problems.is_empty(), "{problems:#?}");
}

#[test]
fn release_profiles_follow_inheritance_in_the_manifest() {
    let manifest = r#"
[profile.release]
debug = false
[profile.dist]
inherits = "release"
lto = "fat"
[profile.dist-small]
inherits = "dist"
[profile.fast-dev]
inherits = "dev"
"#;
    assert_eq!(
        release_profiles(manifest),
        ["dist", "dist-small", "release"].map(String::from).into()
    );
    assert_eq!(
        release_profiles("not toml ["),
        ["release".to_string()].into()
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
        &problems_with("ENV MALLOC_ARENA_MAX=1\n", ""),
        "sets MALLOC_ARENA_MAX to None, but kubedev's image sets MALLOC_ARENA_MAX=1",
    );
    one(
        &problems_with("MALLOC_ARENA_MAX=1", "MALLOC_ARENA_MAX=8"),
        "sets MALLOC_ARENA_MAX to Some(\"8\")",
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
    let docs =
        parse(&GOOD.replace("COPY xtask xtask\n", "COPY xtask xtask\nCOPY docs docs\n")).unwrap();
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
    // Any TOML spelling of the table and the string.
    let dotted = "workspace.package.repository = 'https://example.invalid/kubedev' # where\n";
    assert_eq!(
        workspace_package_key(dotted, "repository").as_deref(),
        Some("https://example.invalid/kubedev")
    );
    assert_eq!(
        workspace_package_key("[workspace.package\n", "repository"),
        None
    );
}
