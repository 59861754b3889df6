//! `cargo xtask build-plugins`: builds the policy SDK's example policies in `plugins/` for
//! `wasm32-unknown-unknown` (release) and copies the modules to `target/plugins/wasm/`,
//! where the sandbox's tests and benches look for them.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, bail};

const TARGET: &str = "wasm32-unknown-unknown";

/// Where the built modules go, relative to the repository root.
pub(crate) const WASM_DIR: &str = "target/plugins/wasm";

/// The policy crates: every directory of `plugins/` with a `Cargo.toml`, except the SDK.
fn policies(plugins: &Path) -> anyhow::Result<Vec<String>> {
    let mut names = Vec::new();
    for entry in
        std::fs::read_dir(plugins).with_context(|| format!("read {}", plugins.display()))?
    {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name != "sdk" && entry.path().join("Cargo.toml").is_file() {
            names.push(name);
        }
    }
    names.sort();
    Ok(names)
}

/// Adds the wasm32 target with rustup when it is not installed.
fn ensure_target(root: &Path) -> anyhow::Result<()> {
    let out = Command::new("rustup")
        .args(["target", "list", "--installed"])
        .current_dir(root)
        .output()
        .context("run `rustup target list --installed` (is rustup installed?)")?;
    if !out.status.success() {
        bail!(
            "`rustup target list --installed` failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    if String::from_utf8_lossy(&out.stdout)
        .lines()
        .any(|l| l.trim() == TARGET)
    {
        return Ok(());
    }
    crate::commands::run(root, "rustup", &["target", "add", TARGET])
}

/// Builds every policy and returns the paths of the copied modules.
pub(crate) fn build_plugins(root: &Path) -> anyhow::Result<Vec<PathBuf>> {
    ensure_target(root)?;
    let plugins = root.join("plugins");
    let target_dir = root.join("target/plugins");
    eprintln!("$ cargo build --release --target {TARGET} (in plugins/, target dir target/plugins)");
    let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args(["build", "--release", "--target", TARGET])
        .current_dir(&plugins)
        .env("CARGO_TARGET_DIR", &target_dir)
        .status()
        .context("run cargo build for the plugins")?;
    if !status.success() {
        bail!("building the plugins failed ({status})");
    }
    let out_dir = root.join(WASM_DIR);
    std::fs::create_dir_all(&out_dir).with_context(|| format!("create {}", out_dir.display()))?;
    let mut built = Vec::new();
    for name in policies(&plugins)? {
        let artifact = target_dir
            .join(TARGET)
            .join("release")
            .join(format!("{}.wasm", name.replace('-', "_")));
        let dest = out_dir.join(format!("{name}.wasm"));
        std::fs::copy(&artifact, &dest)
            .with_context(|| format!("copy {} to {}", artifact.display(), dest.display()))?;
        let size = std::fs::metadata(&dest)?.len();
        println!(
            "{:>8.1} KiB  {}",
            size as f64 / 1024.0,
            dest.strip_prefix(root).unwrap_or(&dest).display()
        );
        built.push(dest);
    }
    Ok(built)
}
