//! Speed side by side: kubedev's allocator and upstream's on every scenario of
//! `../shared/bench-scenarios`, both measured in the same run on this machine (process CPU,
//! medians over batches; kubedev just before and just after upstream on each scenario, so that
//! both sides of a ratio are seconds apart; then medians over rounds): a warm `Allocate`, and
//! a fresh allocator plus one `Allocate` as the scheduler makes one per pod.

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

/// Rounds of both sides' measurements: each figure is the median of its rounds, so a slow
/// spell of the machine during one scenario's turn does not make a ratio.
const ROUNDS: usize = 3;

/// Measures both allocators on the shared scenarios, [`ROUNDS`] times, upstream's of
/// Kubernetes `release`; the figures (medians of the rounds) by scenario name.
pub(crate) fn side_by_side(
    root: &Path,
    release: &str,
) -> anyhow::Result<BTreeMap<String, Figures>> {
    let dir = root.join("../shared/bench-scenarios");
    let mut up = Upstream::start(root, release)?;
    // Per scenario: each round's four timings, and what the first round found.
    let mut rounds: BTreeMap<String, (Vec<[f64; 4]>, Figures)> = BTreeMap::new();
    let mut paths: Vec<std::path::PathBuf> = std::fs::read_dir(&dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    paths.sort();
    for _ in 0..ROUNDS {
        for path in &paths {
            let scenario = kubedev_inputs::read_scenario(path)
                .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
            let runs = if scenario.resource_slices.len() > 100 {
                UPSTREAM_RUNS / 10
            } else {
                UPSTREAM_RUNS
            };
            let before = ours(root, path)?;
            let (theirs, steps, timing) = up.time(&scenario, runs)?;
            let after = ours(root, path)?;
            let name = before.name;
            let outcome = before.outcome;
            let times = [
                (before.allocate_us + after.allocate_us) / 2.0,
                (before.build_us + after.build_us) / 2.0,
                timing.allocate_cpu_ns as f64 / 1000.0,
                timing.build_allocate_cpu_ns as f64 / 1000.0,
            ];
            let entry = rounds.entry(name).or_insert_with(|| {
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
                        outcome,
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

/// kubedev's timing of one scenario, as `bench_table` prints it.
#[derive(Debug, PartialEq)]
struct Ours {
    name: String,
    allocate_us: f64,
    build_us: f64,
    outcome: String,
}

/// Times kubedev on the scenario file `path` (the `bench_table` example, [`OUR_RUNS`] runs).
fn ours(root: &Path, path: &Path) -> anyhow::Result<Ours> {
    let printed = crate::commands::run_example(
        root,
        "kubedev-inputs",
        "bench_table",
        &[&path.display().to_string(), &OUR_RUNS.to_string()],
    )?;
    parse_ours(&printed)
}

/// The one line `bench_table` prints for a scenario: name, warm and build + `Allocate` ns, and
/// the outcome, tab-separated.
fn parse_ours(printed: &str) -> anyhow::Result<Ours> {
    let mut lines = printed.lines();
    let (Some(line), None) = (lines.next(), lines.next()) else {
        bail!("bench_table printed {printed:?}, not one scenario's line");
    };
    let cols: Vec<&str> = line.split('\t').collect();
    let [name, alloc, build, outcome] = cols[..] else {
        bail!("bench_table printed {line:?}");
    };
    let us = |s: &str| {
        s.parse::<f64>()
            .map(|n| n / 1000.0)
            .map_err(|e| anyhow::anyhow!("bench_table printed {line:?}: {s:?}: {e}"))
    };
    Ok(Ours {
        name: name.to_string(),
        allocate_us: us(alloc)?,
        build_us: us(build)?,
        outcome: outcome.to_string(),
    })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_scenarios_line_of_bench_table_is_read_in_microseconds() {
        let ours = parse_ours("gpu8-c1\t480\t1460\tallocated\n").expect("one line");
        assert_eq!(
            ours,
            Ours {
                name: "gpu8-c1".to_string(),
                allocate_us: 0.48,
                build_us: 1.46,
                outcome: "allocated".to_string(),
            }
        );
    }

    #[test]
    fn anything_but_one_well_formed_line_is_refused_with_what_was_printed() {
        let two = parse_ours("a\t1\t2\tallocated\nb\t1\t2\tallocated\n")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(two.contains("not one scenario's line"), "{two}");
        let none = parse_ours("")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(none.contains("not one scenario's line"), "{none}");
        let bad = parse_ours("a\tfast\t2\tallocated\n")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(bad.contains("\"fast\""), "{bad}");
    }
}
