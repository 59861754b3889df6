//! `cargo xtask codegen [--check]`: the kubelet gRPC bindings.
//!
//! The kubelet API `.proto` files in `crates/kubelet-grpc/proto` are compiled
//! with protox (a protobuf compiler written in Rust, so `protoc` is never
//! needed) into a `FileDescriptorSet`, which tonic-prost-build turns into
//! prost messages plus tonic clients and servers. Each `.proto` file is
//! compiled on its own and becomes exactly one Rust file in
//! `crates/kubelet-grpc/src/generated`, named after the API rather than after
//! the protobuf package: several kubelet APIs use bare package names such as
//! `v1` or `v1beta1`, which would be ambiguous as file names.
//!
//! The output is committed. `--check` generates into a temporary directory
//! and fails, naming the file, when anything differs from what is committed.
//! The files are formatted by prettyplease (through prost-build), so the
//! result does not depend on the installed rustfmt; the crate pulls them in
//! with `include!`, which rustfmt does not follow.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, bail, ensure};

/// Where the `.proto` files live, relative to the workspace root.
const PROTO_DIR: &str = "crates/kubelet-grpc/proto";

/// Where the generated Rust files go, relative to the workspace root.
const OUT_DIR: &str = "crates/kubelet-grpc/src/generated";

/// One kubelet API: a `.proto` file and the Rust file generated from it.
#[derive(Debug)]
struct Api {
    /// The `.proto` file, relative to [`PROTO_DIR`].
    proto: &'static str,
    /// The protobuf package the file must declare.
    package: &'static str,
    /// The generated file's name in [`OUT_DIR`].
    output: &'static str,
}

/// Every API the kubelet-grpc crate binds, one entry per `.proto` file.
const APIS: &[Api] = &[
    Api {
        proto: "deviceplugin/v1beta1/api.proto",
        package: "v1beta1",
        output: "deviceplugin_v1beta1.rs",
    },
    Api {
        proto: "pluginregistration/v1/api.proto",
        package: "pluginregistration",
        output: "pluginregistration_v1.rs",
    },
    Api {
        proto: "dra/v1/api.proto",
        package: "k8s.io.kubelet.pkg.apis.dra.v1",
        output: "dra_v1.rs",
    },
    Api {
        proto: "dra/v1beta1/api.proto",
        package: "k8s.io.kubelet.pkg.apis.dra.v1beta1",
        output: "dra_v1beta1.rs",
    },
    Api {
        proto: "drahealth/v1alpha1/api.proto",
        package: "v1alpha1",
        output: "drahealth_v1alpha1.rs",
    },
    Api {
        proto: "drahealth/v1/api.proto",
        package: "v1",
        output: "drahealth_v1.rs",
    },
    Api {
        proto: "podresources/v1/api.proto",
        package: "v1",
        output: "podresources_v1.rs",
    },
];

/// Runs `cargo xtask codegen`: writes the bindings, or with `check` only
/// compares them with the committed ones.
pub(crate) fn run(root: &Path, check: bool) -> Result<()> {
    let proto_dir = root.join(PROTO_DIR);
    let out_dir = root.join(OUT_DIR);

    let mut generated = BTreeMap::new();
    for api in APIS {
        let source = generate(&proto_dir, api)
            .with_context(|| format!("generating bindings for {PROTO_DIR}/{}", api.proto))?;
        generated.insert(api.output, source);
    }

    if check {
        check_committed(&out_dir, &generated)
    } else {
        write_generated(&out_dir, &generated)
    }
}

/// Compiles one `.proto` file and returns the generated Rust source,
/// header included.
fn generate(proto_dir: &Path, api: &Api) -> Result<String> {
    // protox reports errors with spans; `{:?}` of its error is terse, its
    // Display names the file and the problem.
    let fds = protox::compile([api.proto], [proto_dir]).map_err(|e| anyhow::anyhow!("{e}"))?;

    let declared: Vec<&str> = fds.file.iter().map(|f| f.package()).collect();
    ensure!(
        declared == [api.package],
        "{} declares package(s) {declared:?}, expected exactly [{:?}]; update the table in xtask/src/codegen.rs",
        api.proto,
        api.package
    );

    let scratch = tempfile::tempdir().context("creating a temporary directory")?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .build_transport(true)
        .emit_rerun_if_changed(false)
        // Ordered maps: the same message always encodes to the same bytes.
        .btree_map(".")
        .out_dir(scratch.path())
        .compile_fds(fds)
        .with_context(|| format!("running tonic-prost-build on {}", api.proto))?;

    let expected_name = format!("{}.rs", api.package);
    let produced = list_files(scratch.path())?;
    ensure!(
        produced == [expected_name.clone()],
        "tonic-prost-build produced {produced:?} for {}, expected [{expected_name:?}]",
        api.proto
    );
    let path = scratch.path().join(&expected_name);
    let body = fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;

    Ok(format!(
        "// Generated by `cargo xtask codegen` from {PROTO_DIR}/{proto}\n\
         // (protobuf package `{package}`). Do not edit this file: change the\n\
         // .proto file and run `cargo xtask codegen` again.\n\
         \n\
         {body}",
        proto = api.proto,
        package = api.package,
    ))
}

/// Writes the generated files that changed and removes `.rs` files that no
/// longer belong in `out_dir`.
fn write_generated(out_dir: &Path, generated: &BTreeMap<&str, String>) -> Result<()> {
    fs::create_dir_all(out_dir).with_context(|| format!("creating {}", out_dir.display()))?;

    for (name, source) in generated {
        let path = out_dir.join(name);
        let current = read_if_exists(&path)?;
        if current.as_deref() == Some(source.as_str()) {
            println!("unchanged {OUT_DIR}/{name}");
            continue;
        }
        fs::write(&path, source).with_context(|| format!("writing {}", path.display()))?;
        println!("wrote     {OUT_DIR}/{name}");
    }

    for stale in stale_files(out_dir, generated)? {
        let path = out_dir.join(&stale);
        fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))?;
        println!("removed   {OUT_DIR}/{stale}");
    }
    Ok(())
}

/// Fails, naming every offending file, unless `out_dir` holds exactly the
/// generated files with exactly the generated contents.
fn check_committed(out_dir: &Path, generated: &BTreeMap<&str, String>) -> Result<()> {
    let mut problems = Vec::new();

    for (name, source) in generated {
        let path = out_dir.join(name);
        match read_if_exists(&path)? {
            None => problems.push(format!("{OUT_DIR}/{name} is missing")),
            Some(committed) if committed != *source => problems.push(format!(
                "{OUT_DIR}/{name} differs from the generated code ({})",
                first_difference(&committed, source)
            )),
            Some(_) => {}
        }
    }
    if out_dir.is_dir() {
        for stale in stale_files(out_dir, generated)? {
            problems.push(format!(
                "{OUT_DIR}/{stale} is not generated from any .proto file"
            ));
        }
    }

    if problems.is_empty() {
        println!("{OUT_DIR} is up to date ({} files)", generated.len());
        return Ok(());
    }
    for problem in &problems {
        eprintln!("{problem}");
    }
    bail!(
        "{} of the committed gRPC bindings in {OUT_DIR} are out of date (listed above); run `cargo xtask codegen`",
        problems.len()
    )
}

/// Describes where two texts first differ, by line.
fn first_difference(committed: &str, generated: &str) -> String {
    let mut committed_lines = committed.lines();
    let mut generated_lines = generated.lines();
    let mut number = 1usize;
    loop {
        match (committed_lines.next(), generated_lines.next()) {
            (Some(c), Some(g)) if c == g => number += 1,
            (Some(c), Some(g)) => {
                return format!("line {number}: committed {c:?}, generated {g:?}");
            }
            (Some(_), None) => return format!("committed file has extra lines from line {number}"),
            (None, Some(_)) => return format!("committed file ends before line {number}"),
            (None, None) => return "line endings or the final newline differ".to_owned(),
        }
    }
}

/// The `.rs` files in `out_dir` that are not among the generated ones.
fn stale_files(out_dir: &Path, generated: &BTreeMap<&str, String>) -> Result<Vec<String>> {
    Ok(list_files(out_dir)?
        .into_iter()
        .filter(|name| name.ends_with(".rs") && !generated.contains_key(name.as_str()))
        .collect())
}

/// The sorted names of the regular files directly in `dir`.
fn list_files(dir: &Path) -> Result<Vec<String>> {
    let mut names = Vec::new();
    for entry in fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        let entry = entry.with_context(|| format!("listing {}", dir.display()))?;
        let path: PathBuf = entry.path();
        if !entry
            .file_type()
            .with_context(|| format!("inspecting {}", path.display()))?
            .is_file()
        {
            continue;
        }
        match entry.file_name().into_string() {
            Ok(name) => names.push(name),
            Err(name) => bail!("file name {name:?} in {} is not UTF-8", dir.display()),
        }
    }
    names.sort();
    Ok(names)
}

/// Reads a file, or returns `None` when it does not exist.
fn read_if_exists(path: &Path) -> Result<Option<String>> {
    match fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
    }
}
