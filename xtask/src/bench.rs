//! `cargo xtask bench`: runs every crate's benchmarks and writes one table of medians.
//!
//! The table goes to `target/bench.md`. Rows whose name contains an allocator scenario of
//! `../shared/bench-scenarios` carry the upstream allocator's time and our speed-up. The daemon's
//! idle memory and the release binary's size are measured here too.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context as _, bail};

struct Row {
    name: String,
    median_ns: f64,
}

fn collect(criterion_dir: &Path, out: &mut Vec<Row>) -> anyhow::Result<()> {
    if !criterion_dir.is_dir() {
        return Ok(());
    }
    for entry in std::fs::read_dir(criterion_dir)? {
        let path = entry?.path();
        if !path.is_dir() {
            continue;
        }
        let bench = path.join("new").join("benchmark.json");
        let est = path.join("new").join("estimates.json");
        if bench.is_file() && est.is_file() {
            let b: serde_json::Value = serde_json::from_slice(&std::fs::read(&bench)?)?;
            let e: serde_json::Value = serde_json::from_slice(&std::fs::read(&est)?)?;
            let name = b["full_id"].as_str().unwrap_or_default().to_string();
            if let Some(m) = e["median"]["point_estimate"].as_f64() {
                out.push(Row { name, median_ns: m });
            }
        } else {
            collect(&path, out)?;
        }
    }
    Ok(())
}

/// Upstream allocator CPU µs per Allocate, by scenario, from the bench-scenarios README.
fn upstream(root: &Path) -> BTreeMap<String, f64> {
    let readme = root.join("../shared/bench-scenarios/README.md");
    let text = std::fs::read_to_string(readme).unwrap_or_default();
    let mut map = BTreeMap::new();
    for line in text.lines() {
        let cols: Vec<&str> = line.split('|').map(str::trim).collect();
        if cols.len() > 5
            && let Ok(us) = cols[4].replace(',', "").parse::<f64>()
        {
            map.insert(cols[1].to_string(), us);
        }
    }
    map
}

fn human(ns: f64) -> String {
    if ns >= 1e9 {
        format!("{:.2} s", ns / 1e9)
    } else if ns >= 1e6 {
        format!("{:.2} ms", ns / 1e6)
    } else if ns >= 1e3 {
        format!("{:.2} µs", ns / 1e3)
    } else {
        format!("{ns:.0} ns")
    }
}

fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
}

/// Starts the release daemon with a small static config and reads its resident memory when idle.
fn daemon_idle_rss(root: &Path, bin: &Path) -> anyhow::Result<u64> {
    let tmp = tempfile::tempdir()?;
    let dp = tmp.path().join("dp");
    std::fs::create_dir_all(&dp)?;
    let config = tmp.path().join("kubedev.yaml");
    std::fs::write(
        &config,
        format!(
            "devicePlugin:\n  directory: {}\n  resources:\n    - name: example.com/dev\nbackends:\n  static:\n    pool: node\n    devices:\n      - name: dev-0\n      - name: dev-1\n",
            dp.display()
        ),
    )?;
    let mut child = Command::new(bin)
        .args(["run", "--config"])
        .arg(&config)
        .env("RUST_LOG", "off")
        .current_dir(root)
        .stdin(Stdio::null())
        .spawn()?;
    std::thread::sleep(Duration::from_millis(1500));
    let rss = rss_kib(child.id());
    let _ = child.kill();
    let _ = child.wait();
    rss.context("could not read the daemon's VmRSS")
}

/// Runs the benchmarks and writes the table.
pub(crate) fn bench(root: &Path) -> anyhow::Result<()> {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    // What the benchmarks load: the policies, and the NVML stand-in built as they are.
    crate::plugins::build_plugins(root)?;
    crate::ci::run(
        root,
        "cargo",
        &["build", "--release", "-p", "kubedev-nvml-mock"],
    )?;
    crate::ci::run(
        root,
        "cargo",
        &[
            "bench",
            "--workspace",
            "--benches",
            "--",
            "--warm-up-time",
            "1",
            "--measurement-time",
            "3",
        ],
    )?;
    crate::ci::run(root, "cargo", &["build", "--release", "-p", "kubedev"])?;
    let bin = target.join("release").join("kubedev");
    if !bin.exists() {
        bail!("release binary missing at {}", bin.display());
    }

    let mut rows = Vec::new();
    collect(&target.join("criterion"), &mut rows)?;
    rows.sort_by(|a, b| a.name.cmp(&b.name));
    let reference = upstream(root);
    let mut md = String::from(
        "# kubedev benchmark medians\n\n| benchmark | median | upstream | ratio |\n|---|---|---|---|\n",
    );
    for r in &rows {
        let scenario = reference
            .iter()
            .filter(|(name, _)| r.name.split(['/', ' ']).any(|part| part == name.as_str()))
            .max_by_key(|(name, _)| name.len());
        let (up, ratio) = match scenario {
            Some((_, us)) => (
                format!("{us} µs"),
                format!("{:.1}×", us * 1e3 / r.median_ns),
            ),
            None => (String::new(), String::new()),
        };
        md.push_str(&format!(
            "| {} | {} | {up} | {ratio} |\n",
            r.name,
            human(r.median_ns)
        ));
    }
    let size = std::fs::metadata(&bin)?.len();
    md.push_str(&format!(
        "\n| measure | value |\n|---|---|\n| release binary size (default features) | {:.1} MiB |\n",
        size as f64 / (1024.0 * 1024.0)
    ));
    match daemon_idle_rss(root, &bin) {
        Ok(kib) => md.push_str(&format!(
            "| daemon RSS idle (static backend) | {:.1} MiB |\n",
            kib as f64 / 1024.0
        )),
        Err(e) => md.push_str(&format!("| daemon RSS idle | not measured: {e} |\n")),
    }
    let out = target.join("bench.md");
    std::fs::write(&out, &md).with_context(|| format!("writing {}", out.display()))?;
    println!("{md}\nwritten to {}", out.display());
    Ok(())
}
