//! `cargo xtask fuzz`: runs every cargo-fuzz target in `fuzz/` for a while (installing
//! cargo-fuzz when it is missing). Uses no sanitizer, so it works on the stable toolchain.

use std::path::Path;
use std::process::Command;

use anyhow::{Context as _, bail};

/// The fuzz targets: the `[[bin]]` names in `fuzz/Cargo.toml`.
fn targets(fuzz_dir: &Path) -> anyhow::Result<Vec<String>> {
    let out = Command::new("cargo")
        .args(["fuzz", "list"])
        .current_dir(fuzz_dir)
        .output()
        .context("run `cargo fuzz list`")?;
    if !out.status.success() {
        bail!(
            "`cargo fuzz list` failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect())
}

fn ensure_cargo_fuzz(root: &Path) -> anyhow::Result<()> {
    let installed = Command::new("cargo")
        .args(["fuzz", "--version"])
        .current_dir(root)
        .output()
        .is_ok_and(|o| o.status.success());
    if !installed {
        crate::ci::run(root, "cargo", &["install", "cargo-fuzz", "--locked"])?;
    }
    Ok(())
}

/// Runs each target for `seconds`; fails on the first target that finds a crash.
pub(crate) fn fuzz(root: &Path, seconds: u32) -> anyhow::Result<()> {
    ensure_cargo_fuzz(root)?;
    let dir = root.join("fuzz");
    let max_time = format!("-max_total_time={seconds}");
    for target in targets(&dir)? {
        eprintln!("fuzzing {target} for {seconds} s");
        crate::ci::run(
            &dir,
            "cargo",
            &[
                "fuzz",
                "run",
                "-s",
                "none",
                &target,
                "--",
                &max_time,
                "-print_final_stats=0",
            ],
        )
        .with_context(|| {
            format!("fuzz target {target} (crash input under fuzz/artifacts/{target}/)")
        })?;
    }
    Ok(())
}
