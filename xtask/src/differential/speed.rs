//! Speed side by side: kubedev's allocator and upstream's on every scenario of
//! `../shared/bench-scenarios`, both measured in the same run on this machine (process CPU,
//! medians over batches, then over rounds that take turns): a warm `Allocate`, and a fresh
//! allocator plus one `Allocate` as the scheduler makes one per pod.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::bail;

use super::peer::Upstream;

/// Runs per scenario for kubedev (a tenth for the cluster scenarios).
const OUR_RUNS: usize = 2000;
/// Runs per scenario for upstream, slower by one or two orders of magnitude.
const UPSTREAM_RUNS: u64 = 400;

/// Both allocators' figures for one scenario, in µs.
#[derive(Debug, Clone)]
pub(crate) struct Figures {
    /// kubedev, warm `Allocate`.
    pub(crate) ours_allocate_us: f64,
    /// kubedev, build + `Allocate`.
    pub(crate) ours_build_us: f64,
    /// Upstream, warm `Allocate`.
    pub(crate) upstream_allocate_us: f64,
    /// Upstream, build + `Allocate`.
    pub(crate) upstream_build_us: f64,
    /// Upstream's search steps for one `Allocate`.
    pub(crate) upstream_steps: u64,
    /// kubedev's outcome.
    pub(crate) outcome: String,
    /// Whether both gave the same answer.
    pub(crate) agree: bool,
}

/// Rounds of both sides' measurements, taking turns: each figure is the median of its
/// rounds, so a slow spell of the machine during one side's turn does not make a ratio.
const ROUNDS: usize = 3;

/// Measures both allocators on the shared scenarios, [`ROUNDS`] times in turn, upstream's of
/// Kubernetes `release`; the figures (medians of the rounds) by scenario name.
pub(crate) fn side_by_side(
    root: &Path,
    release: &str,
) -> anyhow::Result<BTreeMap<String, Figures>> {
    let dir = root.join("../shared/bench-scenarios");
    let mut up = Upstream::start(root, release)?;
    // Per scenario: each round's four timings, and what the first round found.
    let mut rounds: BTreeMap<String, (Vec<[f64; 4]>, Figures)> = BTreeMap::new();
    for _ in 0..ROUNDS {
        let printed = crate::commands::run_example(
            root,
            "kubedev-inputs",
            "bench_table",
            &[&dir.display().to_string(), &OUR_RUNS.to_string()],
        )?;
        for line in printed.lines() {
            let cols: Vec<&str> = line.split('\t').collect();
            let [name, alloc, build, outcome] = cols[..] else {
                bail!("bench_table printed {line:?}");
            };
            let path = dir.join(format!("{name}.yaml"));
            let scenario = kubedev_inputs::read_scenario(&path)
                .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
            let runs = if scenario.resource_slices.len() > 100 {
                UPSTREAM_RUNS / 10
            } else {
                UPSTREAM_RUNS
            };
            let (theirs, steps, timing) = up.time(&scenario, runs)?;
            let ns = |s: &str| s.parse::<f64>().map(|n| n / 1000.0);
            let times = [
                ns(alloc)?,
                ns(build)?,
                timing.allocate_cpu_ns as f64 / 1000.0,
                timing.build_allocate_cpu_ns as f64 / 1000.0,
            ];
            let entry = rounds.entry(name.to_string()).or_insert_with(|| {
                let agree = super::difference(release, &scenario, &super::ours(&scenario), &theirs)
                    .is_none();
                (
                    Vec::new(),
                    Figures {
                        ours_allocate_us: 0.0,
                        ours_build_us: 0.0,
                        upstream_allocate_us: 0.0,
                        upstream_build_us: 0.0,
                        upstream_steps: steps,
                        outcome: outcome.to_string(),
                        agree,
                    },
                )
            });
            entry.0.push(times);
        }
    }
    up.finish()?;
    Ok(rounds
        .into_iter()
        .map(|(name, (times, mut f))| {
            let median = |i: usize| {
                let mut v: Vec<f64> = times.iter().map(|t| t[i]).collect();
                v.sort_by(f64::total_cmp);
                v[v.len() / 2]
            };
            f.ours_allocate_us = median(0);
            f.ours_build_us = median(1);
            f.upstream_allocate_us = median(2);
            f.upstream_build_us = median(3);
            (name, f)
        })
        .collect())
}

/// The figures as a markdown table, upstream's being those of Kubernetes `release`.
pub(crate) fn table(figures: &BTreeMap<String, Figures>, release: &str) -> String {
    let mut md = format!(
        "| scenario | kubedev Allocate µs | upstream {release} µs | ratio | kubedev build + Allocate µs | upstream µs | ratio | upstream steps | outcome | same answer |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---|---|\n"
    );
    for (name, f) in figures {
        md.push_str(&format!(
            "| {name} | {:.2} | {:.1} | {:.1}× | {:.2} | {:.1} | {:.1}× | {} | {} | {} |\n",
            f.ours_allocate_us,
            f.upstream_allocate_us,
            f.upstream_allocate_us / f.ours_allocate_us,
            f.ours_build_us,
            f.upstream_build_us,
            f.upstream_build_us / f.ours_build_us,
            f.upstream_steps,
            f.outcome,
            if f.agree { "yes" } else { "NO" },
        ));
    }
    md
}
