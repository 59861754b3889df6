//! Prints kubedev's timings of each scenario of a directory, one line each, tab-separated:
//! scenario, median process CPU ns of a warm allocation, of building the allocator plus one
//! allocation, and the outcome. `cargo xtask bench` puts them beside upstream's, measured in
//! the same run.
//!
//! `cargo run --release -p kubedev-inputs --example bench_table [-- DIR|FILE [RUNS]]`
//! (DIR defaults to `../shared/bench-scenarios`, RUNS to 2000; a FILE times that scenario
//! alone).

use std::path::PathBuf;

use kubedev_allocator::{SimulateOptions, simulate_here};

fn main() {
    let mut args = std::env::args().skip(1);
    let dir = args.next().map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/bench-scenarios")
    });
    let runs: usize = args.next().and_then(|n| n.parse().ok()).unwrap_or(2000);
    let mut files: Vec<PathBuf> = if dir.is_file() {
        vec![dir.clone()]
    } else {
        std::fs::read_dir(&dir)
            .map(|e| e.filter_map(|e| e.ok().map(|e| e.path())).collect())
            .unwrap_or_default()
    };
    files.retain(|p| p.extension().is_some_and(|x| x == "yaml"));
    files.sort();
    for f in files {
        let name = f
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or_default()
            .to_string();
        let scenario = match kubedev_inputs::read_scenario(&f) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("{name}: {e}");
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
        let outcome = match (&out.error, out.allocatable) {
            (Some(e), _) => format!("error: {e}"),
            (None, true) => "allocated".to_string(),
            (None, false) => "not allocatable".to_string(),
        };
        println!(
            "{name}\t{}\t{}\t{outcome}",
            t.allocate_cpu_ns, t.build_allocate_cpu_ns
        );
    }
}
