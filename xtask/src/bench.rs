//! `cargo xtask bench`: runs every crate's benchmarks and writes one table of medians.
//!
//! The table goes to `target/bench.md`. Rows whose name contains an allocator scenario of
//! `../shared/bench-scenarios` carry the upstream allocator's time, measured in the same run
//! (`cargo xtask differential --speed`), and our speed-up. The daemon's
//! idle memory and the release binary's size are measured here too, and the allocator as a
//! scheduler uses it: build + allocate per pod for each shared scenario and per pod over
//! generated clusters of 250 to 5,000 nodes, as whole-process CPU.

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

/// Upstream's CPU µs for one scenario, measured in this run (`cargo xtask differential
/// --speed`).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Upstream {
    /// A warm `Allocate` call.
    allocate_us: f64,
    /// Building the allocator plus one `Allocate`.
    build_allocate_us: f64,
}

/// Upstream's figures by scenario name.
fn upstream(
    figures: &BTreeMap<String, crate::differential::Figures>,
) -> BTreeMap<String, Upstream> {
    figures
        .iter()
        .map(|(name, f)| {
            (
                name.clone(),
                Upstream {
                    allocate_us: f.upstream_allocate_us,
                    build_allocate_us: f.upstream_build_us,
                },
            )
        })
        .collect()
}

/// The upstream figure a benchmark row compares with, and which it is: rows of the
/// `build_allocate` group build an allocator each time, as upstream's build + Allocate figure
/// does; the others compare with a warm `Allocate`.
fn upstream_for(row: &str, reference: &BTreeMap<String, Upstream>) -> Option<(f64, &'static str)> {
    let (_, figures) = reference
        .iter()
        .filter(|(name, _)| row.split(['/', ' ']).any(|part| part == name.as_str()))
        .max_by_key(|(name, _)| name.len())?;
    if row.split('/').next() == Some("build_allocate") {
        Some((figures.build_allocate_us, "build + Allocate"))
    } else {
        Some((figures.allocate_us, "Allocate"))
    }
}

/// The rows benchmarks wrote to `dir` (`| measure | value |` lines, one file per benchmark),
/// in file-name order.
fn bench_figures(dir: &Path) -> anyhow::Result<String> {
    let mut files: Vec<_> = match std::fs::read_dir(dir) {
        Ok(entries) => entries
            .map(|e| e.map(|e| e.path()))
            .collect::<Result<_, _>>()
            .with_context(|| format!("listing {}", dir.display()))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(String::new()),
        Err(e) => return Err(e).with_context(|| format!("listing {}", dir.display())),
    };
    files.retain(|p| p.extension().is_some_and(|x| x == "md"));
    files.sort();
    let mut rows = String::new();
    for file in files {
        let text = std::fs::read_to_string(&file)
            .with_context(|| format!("reading {}", file.display()))?;
        rows.extend(
            text.lines()
                .filter(|l| l.starts_with('|'))
                .map(|l| format!("{l}\n")),
        );
    }
    Ok(rows)
}

/// The `| soak` rows of the soaks run before (`cargo xtask soak`, reports under `dir`), in
/// file-name order.
fn soak_figures(dir: &Path) -> anyhow::Result<String> {
    Ok(bench_figures(dir)?
        .lines()
        .filter(|l| l.starts_with("| soak"))
        .map(|l| format!("{l}\n"))
        .collect())
}

/// The groups of the GetPreferredAllocation benchmark (placed freely, and with the caller and
/// the daemon on one CPU) with how the report names each, and their transport-only row.
const PREFERRED_GROUPS: [(&str, &str); 2] = [
    ("get_preferred_allocation_8_gpus/", ""),
    ("get_preferred_allocation_8_gpus_one_cpu/", "one CPU, "),
];
const PREFERRED_EMPTY: &str = "empty_call_same_connection";

/// For each GetPreferredAllocation row, its median above the empty call on the same
/// connection: what choosing costs beyond the transport (a measure table row each).
fn preferred_above_transport(rows: &[Row]) -> String {
    let mut md = String::new();
    for (group, label) in PREFERRED_GROUPS {
        let in_group = || {
            rows.iter()
                .filter_map(|r| Some((r.name.strip_prefix(group)?, r.median_ns)))
        };
        let Some((_, empty)) = in_group().find(|(name, _)| *name == PREFERRED_EMPTY) else {
            continue;
        };
        for (name, ns) in in_group().filter(|(name, _)| *name != PREFERRED_EMPTY) {
            md.push_str(&format!(
                "| GetPreferredAllocation, 8 GPUs, {label}{name}: above the empty call ({}) | {} |\n",
                human(empty),
                human(ns - empty)
            ));
        }
    }
    md
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

/// The resident KiB of process `pid`'s mappings of an NVML library (the real
/// `libnvidia-ml.so*` or the stand-in), from `/proc/PID/smaps`.
fn nvml_rss_kib(pid: u32) -> Option<u64> {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).ok()?;
    Some(nvml_rss_in(&smaps))
}

fn nvml_rss_in(smaps: &str) -> u64 {
    let mut nvml = false;
    let mut kib = 0;
    for line in smaps.lines() {
        let mut words = line.split_whitespace();
        let first = words.next().unwrap_or_default();
        if first.contains('-') && first.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-') {
            // A mapping's header: range, permissions, offset, device, inode, path.
            let file = words
                .nth(4)
                .and_then(|p| p.rsplit('/').next())
                .unwrap_or("");
            nvml = file.starts_with("libnvidia-ml.so") || file == nvml_mock::LIBRARY_FILE;
        } else if nvml && first == "Rss:" {
            kib += words
                .next()
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0);
        }
    }
    kib
}

/// What one idle daemon holds: all of its resident memory, and the part that is an NVML
/// library's.
struct IdleRss {
    total_kib: u64,
    nvml_kib: u64,
}

/// Starts the release daemon with the config `config` writes for a scratch directory (given its
/// device-plugin directory), with `env` set, and reads its resident memory once idle.
fn daemon_idle_rss(
    root: &Path,
    bin: &Path,
    env: &[(&str, PathBuf)],
    config: impl FnOnce(&Path, &Path) -> String,
) -> anyhow::Result<IdleRss> {
    let tmp = tempfile::tempdir()?;
    let dp = tmp.path().join("dp");
    std::fs::create_dir_all(&dp)?;
    let path = tmp.path().join("kubedev.yaml");
    std::fs::write(&path, config(tmp.path(), &dp))?;
    let mut child = Command::new(bin)
        .args(["run", "--config"])
        .arg(&path)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .env("RUST_LOG", "off")
        .current_dir(root)
        .stdin(Stdio::null())
        .spawn()?;
    std::thread::sleep(Duration::from_millis(1500));
    let rss = rss_kib(child.id()).map(|total_kib| IdleRss {
        total_kib,
        nvml_kib: nvml_rss_kib(child.id()).unwrap_or(0),
    });
    let _ = child.kill();
    let _ = child.wait();
    rss.context("could not read the daemon's VmRSS")
}

/// A device-plugin config with two static devices and, when given, one selection policy.
fn static_config(dp: &Path, policy: Option<&Path>) -> String {
    let policy = policy
        .map(|p| format!("      policy: {}\n", p.display()))
        .unwrap_or_default();
    format!(
        "devicePlugin:\n  directory: {}\n  resources:\n    - name: example.com/dev\n{policy}backends:\n  static:\n    pool: node\n    devices:\n      - name: dev-0\n      - name: dev-1\n",
        dp.display()
    )
}

/// A device-plugin config serving the GPUs of the NVML stand-in at `lib` (release build), so
/// the figure is kubedev's own memory with the NVIDIA backend, without the real library's.
fn nvidia_config(dir: &Path, dp: &Path, lib: &Path) -> String {
    format!(
        "nodeName: node-a\nhostRoot: {r}\nstateDir: {r}/state\ndevicePlugin:\n  directory: {dp}\n  resources:\n    - name: nvidia.com/gpu\nbackends:\n  nvidia:\n    libraryPath: {lib}\n",
        r = dir.display(),
        dp = dp.display(),
        lib = lib.display()
    )
}

/// Release binary size for each backend set, in bytes (the default set last, so the binary left
/// in target/release is the default one).
fn binary_sizes(root: &Path, target: &Path) -> anyhow::Result<Vec<(String, u64)>> {
    let sets: [(&str, &[&str]); 5] = [
        (
            "none (no backends, no policies)",
            &["--no-default-features"],
        ),
        ("vfio", &["--no-default-features", "--features", "vfio"]),
        (
            "usb,host",
            &["--no-default-features", "--features", "usb,host"],
        ),
        ("nvidia", &["--no-default-features", "--features", "nvidia"]),
        ("default (nvidia,vfio,usb,host)", &[]),
    ];
    let mut out = Vec::new();
    for (name, flags) in sets {
        let mut args = vec!["build", "--release", "-p", "kubedev"];
        args.extend_from_slice(flags);
        crate::commands::run(root, "cargo", &args)?;
        let bin = target.join("release").join("kubedev");
        out.push((name.to_string(), std::fs::metadata(&bin)?.len()));
    }
    Ok(out)
}

/// Runs the benchmarks and writes the table.
/// The allocator as a scheduler uses it, whole-process CPU with freeing included: build +
/// allocate per pod for each shared scenario, and per pod over generated clusters (the
/// allocator's `per_pod` example, release build), upstream's allocator beside kubedev's on each
/// shared scenario, both measured in this run;
/// and explaining a pod over generated dumps of 5,000 to 65,000 nodes ([`explain_curve`]).
fn scheduler_figures(
    root: &Path,
    side_by_side: &BTreeMap<String, crate::differential::Figures>,
) -> anyhow::Result<String> {
    let mut md = String::from("\n## The allocator as a scheduler uses it\n");
    md.push_str(&format!(
        "\nShared scenarios, kubedev and upstream's allocator (tools/allocsim) measured in this \
         run, three rounds taking turns, medians: warm Allocate and build + Allocate per pod \
         (µs, process CPU):\n\n{}",
        crate::differential::table(side_by_side, crate::differential::DEFAULT_RELEASE)
    ));
    md.push_str(&format!(
        "\nPer pod over a cluster: a fresh allocator, Allocate on every node (ms, process \
         CPU):\n\n```text\n{}```\n",
        crate::commands::run_example(root, "kubedev-allocator", "per_pod", &["5"])?
    ));
    md.push_str(&explain_curve(root)?);
    Ok(md)
}

/// The dumps `kubedev explain` is timed over: nodes and format.
const EXPLAIN_DUMPS: [(usize, &str); 4] = [
    (5_000, "json"),
    (5_000, "yaml"),
    (20_000, "json"),
    (65_000, "json"),
];

/// `kubedev explain` over generated `kubectl get … -o json|yaml` dumps of 5,000 to 65,000 nodes
/// (the `explain_cluster` example, release build): each dump is written to a file first, then
/// one process reads it and answers, as `kubedev explain -f FILE` does. Wall time is that
/// process's, start to exit; peak memory is its `VmHWM`.
fn explain_curve(root: &Path) -> anyhow::Result<String> {
    crate::commands::run(
        root,
        "cargo",
        &[
            "build",
            "--release",
            "-q",
            "-p",
            "kubedev-inputs",
            "--example",
            "explain_cluster",
        ],
    )?;
    let example = crate::commands::target_dir(root).join("release/examples/explain_cluster");
    let tmp = tempfile::tempdir()?;
    let mut md = String::from(
        "\n`kubedev explain` over a generated dump (one process: reading the file, answering for \
         every node, exiting; reading and answering use every core, so each shows its wall time and \
         its CPU time over all threads):\n\n| nodes | format | dump | read: wall (CPU) | answer: \
         wall (CPU) | wall | peak RSS |\n|---|---|---|---|---|---|---|\n",
    );
    for (nodes, format) in EXPLAIN_DUMPS {
        let file = tmp.path().join(format!("dump-{nodes}.{format}"));
        let status = Command::new(&example)
            .arg("write")
            .arg(nodes.to_string())
            .arg(format)
            .arg(&file)
            .status()
            .context("writing a dump with the explain_cluster example")?;
        if !status.success() {
            bail!("the explain_cluster example could not write a {nodes}-node {format} dump");
        }
        let started = std::time::Instant::now();
        let out = Command::new(&example)
            .arg("read")
            .arg(&file)
            .output()
            .context("running the explain_cluster example")?;
        let wall = started.elapsed();
        if !out.status.success() {
            bail!(
                "explaining the {nodes}-node {format} dump failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let stdout = String::from_utf8_lossy(&out.stdout);
        let figures: BTreeMap<&str, f64> = stdout
            .lines()
            .last()
            .unwrap_or_default()
            .split_whitespace()
            .filter_map(|kv| kv.split_once('='))
            .filter_map(|(k, v)| Some((k, v.parse().ok()?)))
            .collect();
        let figure = |key: &str| {
            figures
                .get(key)
                .copied()
                .with_context(|| format!("the explain_cluster example did not report {key}"))
        };
        md.push_str(&format!(
            "| {nodes} | {format} | {:.0} MB | {:.0} ms ({:.0} ms) | {:.0} ms ({:.0} ms) | {:.2} s | {:.0} MiB |\n",
            figure("bytes")? / 1e6,
            figure("read_wall_ms")?,
            figure("read_ms")?,
            figure("answer_wall_ms")?,
            figure("answer_ms")?,
            wall.as_secs_f64(),
            figure("peak_rss_kib")? / 1024.0,
        ));
        std::fs::remove_file(&file)?;
    }
    Ok(md)
}

pub(crate) fn bench(root: &Path) -> anyhow::Result<()> {
    let target = crate::commands::target_dir(root);
    // What the benchmarks load: the policies, and the NVML stand-in built as they are.
    crate::plugins::build_plugins(root)?;
    crate::commands::run(
        root,
        "cargo",
        &["build", "--release", "-p", "kubedev-nvml-mock"],
    )?;
    // Figures criterion does not keep (throughput, percentiles), written by the benchmarks.
    let figures_dir = target.join("bench-figures");
    if figures_dir.exists() {
        std::fs::remove_dir_all(&figures_dir)
            .with_context(|| format!("removing {}", figures_dir.display()))?;
    }
    crate::commands::run(
        root,
        "cargo",
        &[
            "bench",
            "--workspace",
            // Bench targets only: the libraries' unit tests (also `bench = true`) would get
            // criterion's options and refuse them.
            "--bench",
            "*",
            "--",
            "--warm-up-time",
            "1",
            "--measurement-time",
            "3",
        ],
    )?;
    let sizes = binary_sizes(root, &target)?;
    // The daemon's memory is measured on the binary the image ships: the `dist` profile.
    crate::commands::run(
        root,
        "cargo",
        &[
            "build",
            "--profile",
            "dist",
            "-p",
            "kubedev",
            "--bin",
            "kubedev",
        ],
    )?;
    let bin = target.join("dist").join("kubedev");
    if !bin.exists() {
        bail!("dist binary missing at {}", bin.display());
    }

    let mut rows = Vec::new();
    collect(&target.join("criterion"), &mut rows)?;
    rows.sort_by(|a, b| a.name.cmp(&b.name));
    // Upstream's allocator timed in this run, on this machine, beside kubedev's.
    let side_by_side =
        crate::differential::side_by_side(root, crate::differential::DEFAULT_RELEASE)?;
    let reference = upstream(&side_by_side);
    let mut md = String::from(
        "# kubedev benchmark medians\n\n| benchmark | median | upstream | ratio |\n|---|---|---|---|\n",
    );
    for r in &rows {
        let (up, ratio) = match upstream_for(&r.name, &reference) {
            Some((us, measure)) => (
                format!("{us} µs ({measure})"),
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
    md.push_str("\n| measure | value |\n|---|---|\n");
    md.push_str(&preferred_above_transport(&rows));
    md.push_str(&bench_figures(&figures_dir)?);
    md.push_str(&soak_figures(&target.join(crate::soak::REPORT_DIR))?);
    for (set, bytes) in &sizes {
        md.push_str(&format!(
            "| release binary size, backends: {set} | {:.1} MiB |\n",
            *bytes as f64 / (1024.0 * 1024.0)
        ));
    }
    md.push_str(&format!(
        "| binary size as the image ships it (dist profile), default backends | {:.1} MiB |\n",
        std::fs::metadata(&bin)?.len() as f64 / (1024.0 * 1024.0)
    ));
    let policy = root.join(crate::plugins::WASM_DIR).join("numa-pack.wasm");
    let nvml = target.join("release").join(nvml_mock::LIBRARY_FILE);
    let machine = [("NVML_MOCK_MACHINE", nvml_mock::machine_path("dgx-a100"))];
    let rss = [
        (
            "idle (static backend)",
            daemon_idle_rss(root, &bin, &[], |_, dp| static_config(dp, None)),
        ),
        (
            "with one policy loaded",
            daemon_idle_rss(root, &bin, &[], |_, dp| static_config(dp, Some(&policy))),
        ),
        (
            "with the NVIDIA backend, 8 GPUs (a DGX A100) through the NVML stand-in",
            daemon_idle_rss(root, &bin, &machine, |dir, dp| {
                nvidia_config(dir, dp, &nvml)
            }),
        ),
    ];
    for (what, measured) in rss {
        let mib = |kib: u64| kib as f64 / 1024.0;
        match measured {
            Ok(r) if r.nvml_kib > 0 => md.push_str(&format!(
                "| daemon RSS (dist binary) {what} | {:.1} MiB, of which the NVML library {:.1} MiB: kubedev's own {:.1} MiB |\n",
                mib(r.total_kib),
                mib(r.nvml_kib),
                mib(r.total_kib - r.nvml_kib)
            )),
            Ok(r) => md.push_str(&format!("| daemon RSS (dist binary) {what} | {:.1} MiB |\n", mib(r.total_kib))),
            Err(e) => md.push_str(&format!("| daemon RSS (dist binary) {what} | not measured: {e:#} |\n")),
        }
    }
    md.push_str(&scheduler_figures(root, &side_by_side)?);
    let out = target.join("bench.md");
    std::fs::write(&out, &md).with_context(|| format!("writing {}", out.display()))?;
    println!("{md}\nwritten to {}", out.display());
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// Figures as a run measures them.
    fn reference() -> BTreeMap<String, Upstream> {
        let mut map = BTreeMap::new();
        for (name, allocate_us, build_allocate_us) in [
            ("cluster1000-c1", 26.9, 257.0),
            ("cluster1000-c10", 1.0, 2.0),
        ] {
            map.insert(
                name.to_string(),
                Upstream {
                    allocate_us,
                    build_allocate_us,
                },
            );
        }
        map
    }

    #[test]
    fn build_allocate_rows_compare_with_upstreams_build_and_allocate() {
        let reference = reference();
        assert_eq!(
            upstream_for("build_allocate/cluster1000-c1", &reference),
            Some((257.0, "build + Allocate"))
        );
        assert_eq!(
            upstream_for("allocate/cluster1000-c1", &reference),
            Some((26.9, "Allocate"))
        );
    }

    #[test]
    fn the_nvml_librarys_resident_pages_are_told_apart() {
        let smaps = "\
55d0c0000000-55d0c1000000 r-xp 00000000 fe:01 1234 /usr/bin/kubedev
Rss:                9000 kB
7f0000000000-7f0000100000 r-xp 00000000 fe:01 99 /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.550.54.15
Size:               1024 kB
Rss:                 700 kB
7f0000100000-7f0000200000 rw-p 00100000 fe:01 99 /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.550.54.15
Rss:                  50 kB
7f0000300000-7f0000400000 r-xp 00000000 fe:01 7 /tmp/x/libnvml_mock.so
Rss:                  25 kB
7f0000400000-7f0000500000 rw-p 00000000 00:00 0
Rss:                 400 kB
";
        assert_eq!(nvml_rss_in(smaps), 775);
    }

    #[test]
    fn a_row_compares_with_the_scenario_it_names_whole() {
        let reference = reference();
        assert_eq!(
            upstream_for("allocate/cluster1000-c10", &reference),
            Some((1.0, "Allocate"))
        );
        assert!(upstream_for("selector/eval", &reference).is_none());
    }

    #[test]
    fn benchmarks_figures_join_the_report_in_file_order() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("b.md"), "| prepare p99 | 3.1 ms |\n").unwrap();
        std::fs::write(dir.path().join("a.md"), "| policy calls | 7 |\nnot a row\n").unwrap();
        std::fs::write(dir.path().join("c.txt"), "| ignored | x |\n").unwrap();
        assert_eq!(
            bench_figures(dir.path()).unwrap(),
            "| policy calls | 7 |\n| prepare p99 | 3.1 ms |\n"
        );
        assert_eq!(bench_figures(&dir.path().join("missing")).unwrap(), "");
    }

    #[test]
    fn preferred_rows_are_reported_above_the_empty_call() {
        let row = |name: &str, median_ns: f64| Row {
            name: name.to_string(),
            median_ns,
        };
        let rows = [
            row(
                "get_preferred_allocation_8_gpus/empty_call_same_connection",
                100_000.0,
            ),
            row("get_preferred_allocation_8_gpus/numa-packing", 112_500.0),
            row("get_preferred_allocation_8_gpus/nvlink-pack", 140_000.0),
            row(
                "get_preferred_allocation_8_gpus_one_cpu/empty_call_same_connection",
                50_000.0,
            ),
            row(
                "get_preferred_allocation_8_gpus_one_cpu/nvlink-pack",
                80_000.0,
            ),
            row("call/nvlink-pack/8", 4_000.0),
        ];
        assert_eq!(
            preferred_above_transport(&rows),
            "| GetPreferredAllocation, 8 GPUs, numa-packing: above the empty call (100.00 µs) | 12.50 µs |\n\
             | GetPreferredAllocation, 8 GPUs, nvlink-pack: above the empty call (100.00 µs) | 40.00 µs |\n\
             | GetPreferredAllocation, 8 GPUs, one CPU, nvlink-pack: above the empty call (50.00 µs) | 30.00 µs |\n"
        );
        // A group without its empty call has no rows.
        assert_eq!(preferred_above_transport(&rows[1..3]), "");
    }
}
