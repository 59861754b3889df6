//! Prints one table: scenario, kubedev's median CPU time per allocation (warm caches) and per
//! build + allocation, the upstream reference from the scenarios' README, and the ratios.
//!
//! `cargo run --release -p kubedev-allocator --example bench_table [-- DIR [RUNS]]`
//! (DIR defaults to `../shared/bench-scenarios`, RUNS to 2000).

use std::collections::HashMap;
use std::path::PathBuf;

use kubedev_allocator::{Scenario, SimulateOptions, simulate_here};

/// A figure of the README: `20.5`, `10,694`, or a range `378–387` (its midpoint).
fn parse_micros(s: &str) -> Option<f64> {
    let s = s.trim().replace(',', "");
    match s.split_once(['–', '-']) {
        Some((low, high)) => {
            Some((low.trim().parse::<f64>().ok()? + high.trim().parse::<f64>().ok()?) / 2.0)
        }
        None => s.parse().ok(),
    }
}

/// `name -> (allocate µs, build + allocate µs)` from the README's markdown table.
fn upstream(readme: &str) -> HashMap<String, (f64, f64)> {
    let mut out = HashMap::new();
    for line in readme.lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        if cells.len() >= 7
            && let (Some(a), Some(b)) = (parse_micros(cells[4]), parse_micros(cells[5]))
            && let Some(name) = cells[1].split_whitespace().next()
        {
            out.insert(name.to_string(), (a, b));
        }
    }
    out
}

fn main() {
    let mut args = std::env::args().skip(1);
    let dir = args.next().map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/bench-scenarios")
    });
    let runs: usize = args.next().and_then(|n| n.parse().ok()).unwrap_or(2000);
    let reference = upstream(&std::fs::read_to_string(dir.join("README.md")).unwrap_or_default());
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map(|e| e.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    files.retain(|p| p.extension().is_some_and(|x| x == "yaml"));
    files.sort();
    println!(
        "{:<22} {:>12} {:>12} {:>9} | {:>14} {:>12} {:>9} | outcome",
        "scenario", "kubedev µs", "upstream µs", "ratio", "build+alloc µs", "upstream µs", "ratio"
    );
    for f in files {
        let name = f
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or_default()
            .to_string();
        let scenario = match Scenario::from_path(&f) {
            Ok(s) => s,
            Err(e) => {
                println!("{name:<22} {e}");
                continue;
            }
        };
        let runs = if scenario.resource_slices.len() > 100 {
            runs / 10
        } else {
            runs
        }
        .max(1);
        let out = simulate_here(&scenario, &SimulateOptions::default().with_repeat(runs));
        let Some(t) = out.timing else { continue };
        let ours = t.allocate_cpu_ns as f64 / 1000.0;
        let ours_b = t.build_allocate_cpu_ns as f64 / 1000.0;
        let (up, up_b) = reference
            .get(&name)
            .copied()
            .unwrap_or((f64::NAN, f64::NAN));
        let outcome = match (&out.error, out.allocatable) {
            (Some(e), _) => format!("error: {e}"),
            (None, true) => "allocated".to_string(),
            (None, false) => "not allocatable".to_string(),
        };
        println!(
            "{name:<22} {ours:>12.2} {up:>12.1} {:>8.1}x | {ours_b:>14.2} {up_b:>12.1} {:>8.1}x | {outcome}",
            up / ours,
            up_b / ours_b
        );
    }
}
