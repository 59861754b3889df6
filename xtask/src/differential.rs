//! `cargo xtask differential`: kubedev's allocator and upstream's (the Kubernetes structured
//! allocator, `k8s.io/dynamic-resource-allocation`, run by `tools/allocsim` as the scheduler's
//! DynamicResources plugin calls it) on every conformance scenario and on seeded random
//! scenarios; any difference in outcome, devices, order, node selector, configuration or error
//! class fails, with the scenario (shrunk, for random ones) written to
//! `target/differential/`.

mod generate;
mod peer;
mod speed;

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context as _, ensure};
use kubedev_allocator::{AllocateOptions, Allocator, Features, Scenario};
use serde_json::Value;

pub(crate) use peer::{DEFAULT_RELEASE, Upstream};
pub(crate) use speed::{Figures, side_by_side, table};

/// What `cargo xtask differential` takes.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct Args {
    /// Random scenarios to compare after the conformance scenarios.
    #[arg(long, default_value_t = 2000)]
    pub(crate) random: u64,
    /// The first random scenario's seed (each next one adds one); default: from the clock.
    #[arg(long)]
    pub(crate) seed: Option<u64>,
    /// The Kubernetes release whose allocator is the peer (a `tools/allocsim` build of it).
    #[arg(long, default_value = peer::DEFAULT_RELEASE)]
    pub(crate) release: String,
    /// Run only the conformance scenarios whose file name contains this.
    #[arg(long)]
    pub(crate) only: Option<String>,
    /// Also write every random scenario to target/differential/random-SEED.yaml.
    #[arg(long)]
    pub(crate) keep: bool,
    /// Instead of comparing answers, time both allocators on ../shared/bench-scenarios and
    /// print the figures side by side (what `cargo xtask bench` reports), upstream's of
    /// `--release`.
    #[arg(long)]
    pub(crate) speed: bool,
}

impl Args {
    /// What CI runs.
    pub(crate) fn ci() -> Args {
        Args {
            random: 2000,
            seed: None,
            release: peer::DEFAULT_RELEASE.to_string(),
            only: None,
            keep: false,
            speed: false,
        }
    }
}

/// One allocator's answer, in the scheduler's classes.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Outcome {
    /// Every claim got an allocation: `status.allocation` per claim, normalised.
    Allocated(Vec<Value>),
    /// The claims do not fit on the node.
    Unsatisfiable,
    /// An error that rules out only this node (upstream's `ErrFailedAllocationOnNode`).
    FailedOnNode(String),
    /// An error that aborts the scheduling attempt (a broken selector, a missing class ...).
    Error(String),
    /// Upstream's allocator panicked (on input the API server's validation would refuse).
    Panic(String),
}

impl Outcome {
    fn class(&self) -> &'static str {
        match self {
            Outcome::Allocated(_) => "allocated",
            Outcome::Unsatisfiable => "unsatisfiable",
            Outcome::FailedOnNode(_) => "failed on node",
            Outcome::Error(_) => "error",
            Outcome::Panic(_) => "panic",
        }
    }

    fn describe(&self) -> String {
        match self {
            Outcome::Allocated(a) => {
                format!("allocated {}", serde_json::to_string(a).unwrap_or_default())
            }
            Outcome::Unsatisfiable => "unsatisfiable".into(),
            Outcome::FailedOnNode(e) => format!("failed on node: {e}"),
            Outcome::Error(e) => format!("error: {e}"),
            Outcome::Panic(e) => format!("panic: {e}"),
        }
    }
}

/// A way upstream's release answers that its own later release fixed, and kubedev answers as
/// the fix does: differences it explains are accepted for that release.
struct KnownDifference {
    /// The releases that answer the old way (a prefix: `1.37.`).
    releases: &'static str,
    /// Whether a scenario and a pair of answers (kubedev's, upstream's) are this difference.
    matches: fn(&Scenario, &Outcome, &Outcome) -> bool,
    /// The upstream change that fixed it.
    fixed_by: &'static str,
}

const KNOWN: &[KnownDifference] = &[
    KnownDifference {
        releases: "1.37.",
        // An `All` request over an incomplete or invalid pool aborted the scheduling attempt
        // instead of ruling out only the node.
        matches: |_, ours, upstream| match (ours, upstream) {
            (Outcome::FailedOnNode(a), Outcome::Error(b)) => {
                let all = "asks for all devices, but resource pool";
                a.contains(all) && b.contains(all)
            }
            _ => false,
        },
        fixed_by: "kubernetes/kubernetes#141898 (1.38)",
    },
    KnownDifference {
        releases: "1.37.",
        // A capacity requested as `<driver>/<name>` did not match the device's capacity
        // `<name>` (nor the other way round): the names were compared as written. Any
        // difference in a scenario that qualifies a capacity name is taken for this one on
        // 1.37; the 1.38 peer judges those scenarios in full.
        matches: |scenario, _, _| qualifies_capacity_names(scenario),
        fixed_by: "kubernetes/kubernetes#142202 (1.38)",
    },
    KnownDifference {
        releases: "1.37.",
        // A device that no longer allows multiple allocations but still has a share could be
        // allocated exclusively. Any difference in a scenario with such a share is taken for
        // this one on 1.37; the 1.38 peer judges those scenarios in full.
        matches: |scenario, _, _| shares_exclusive_device(scenario),
        fixed_by: "kubernetes/kubernetes#140798 (1.38)",
    },
];

/// Whether the scenario has a share of a device that does not allow multiple allocations.
fn shares_exclusive_device(scenario: &Scenario) -> bool {
    scenario.allocated_shares.iter().any(|share| {
        scenario.resource_slices.iter().any(|s| {
            s.spec.devices.iter().any(|d| {
                !d.allow_multiple_allocations.unwrap_or(false)
                    && share.device == format!("{}/{}/{}", s.spec.driver, s.spec.pool.name, d.name)
            })
        })
    })
}

/// Whether a request of the scenario names a capacity with a driver's domain.
fn qualifies_capacity_names(scenario: &Scenario) -> bool {
    let drivers: Vec<&str> = scenario
        .resource_slices
        .iter()
        .map(|s| s.spec.driver.as_str())
        .collect();
    scenario
        .claims
        .iter()
        .flat_map(|c| &c.spec.devices.requests)
        .flat_map(|r| {
            r.exactly
                .iter()
                .map(|e| &e.capacity)
                .chain(r.first_available.iter().map(|s| &s.capacity))
        })
        .flatten()
        .flat_map(|c| c.requests.keys())
        .any(|name| {
            name.split_once('/')
                .is_some_and(|(domain, _)| drivers.contains(&domain))
        })
}

/// The upstream fix that explains a difference on `release`, if one does.
fn known_difference(
    release: &str,
    scenario: &Scenario,
    ours: &Outcome,
    upstream: &Outcome,
) -> Option<&'static str> {
    KNOWN
        .iter()
        .find(|k| release.starts_with(k.releases) && (k.matches)(scenario, ours, upstream))
        .map(|k| k.fixed_by)
}

/// Why two answers differ, or `None` when they agree: the same class, and for allocations the
/// same results in the same order (share IDs aside, which each side draws at random); a
/// difference `release` has that a later upstream release fixed (see [`KNOWN`]) is agreement.
pub(crate) fn difference(
    release: &str,
    scenario: &Scenario,
    ours: &Outcome,
    upstream: &Outcome,
) -> Option<String> {
    let same = match (ours, upstream) {
        (Outcome::Allocated(a), Outcome::Allocated(b)) => a == b,
        (a, b) => a.class() == b.class(),
    } || known_difference(release, scenario, ours, upstream).is_some();
    (!same).then(|| {
        format!(
            "kubedev:  {}\nupstream: {}",
            ours.describe(),
            upstream.describe()
        )
    })
}

/// kubedev's answer for a scenario, allocated as `kubedev simulate` does.
pub(crate) fn ours(scenario: &Scenario) -> Outcome {
    let shares = scenario.consumed_capacity();
    let slices = scenario.slices_as_scheduled();
    let mut allocator = Allocator::new(
        &slices,
        &scenario.device_classes,
        &scenario.allocated_devices,
    )
    .with_consumed_capacity(&shares)
    .with_features(Features::from_gates(&scenario.features));
    match allocator.allocate(
        &scenario.node,
        &scenario.claims,
        &AllocateOptions::default(),
    ) {
        Ok(Some(results)) => Outcome::Allocated(
            results
                .iter()
                .map(|r| normalise(serde_json::to_value(r).unwrap_or(Value::Null)))
                .collect(),
        ),
        Ok(None) => Outcome::Unsatisfiable,
        Err(e) if e.only_this_node() => Outcome::FailedOnNode(kubedev_core::echo::chain(&e)),
        Err(e) => Outcome::Error(kubedev_core::echo::chain(&e)),
    }
}

/// An allocation as JSON with what the two encoders differ in removed: absent, null and empty
/// fields are one, and share IDs (random on both sides) are one placeholder.
pub(crate) fn normalise(value: Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.into_iter()
                .filter_map(|(k, v)| {
                    let v = if k == "shareID" {
                        Value::String("<share>".into())
                    } else {
                        normalise(v)
                    };
                    let empty = match &v {
                        Value::Null => true,
                        Value::Array(a) => a.is_empty(),
                        Value::Object(o) => o.is_empty(),
                        _ => false,
                    };
                    (!empty).then_some((k, v))
                })
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.into_iter().map(normalise).collect()),
        other => other,
    }
}

/// The conformance scenarios (`crates/allocator/tests/conformance/*.yaml`), sorted.
fn conformance_files(root: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let dir = root.join("crates/allocator/tests/conformance");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    Ok(files)
}

/// Runs the differential test; fails on the first random mismatch (after shrinking it) or on
/// any conformance mismatch (after running them all).
pub(crate) fn differential(root: &Path, args: &Args) -> anyhow::Result<()> {
    if args.speed {
        print!(
            "{}",
            table(&side_by_side(root, &args.release)?, &args.release)
        );
        return Ok(());
    }
    let out_dir = crate::commands::target_dir(root).join("differential");
    std::fs::create_dir_all(&out_dir)?;
    let mut upstream = Upstream::start(root, &args.release)?;
    eprintln!("peer: {}", upstream.describe());

    let started = Instant::now();
    let mut mismatches = Vec::new();
    let mut counts = std::collections::BTreeMap::<&str, usize>::new();
    let files = conformance_files(root)?;
    let mut ran = 0;
    for file in &files {
        let name = file
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or_default()
            .to_string();
        if args.only.as_deref().is_some_and(|o| !name.contains(o)) {
            continue;
        }
        ran += 1;
        let text = std::fs::read_to_string(file)?;
        let scenario = kubedev_inputs::scenario_from_text(&text)
            .map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
        let theirs = upstream.allocate(&scenario)?;
        let mine = ours(&scenario);
        *counts.entry(mine.class()).or_default() += 1;
        if let Some(diff) = difference(&args.release, &scenario, &mine, &theirs) {
            eprintln!("MISMATCH {name}\n{}", indent(&diff));
            mismatches.push(name);
        } else if let Some(fix) = known_difference(&args.release, &scenario, &mine, &theirs) {
            eprintln!("known difference {name}: kubedev answers as fixed by {fix}");
        }
    }
    eprintln!(
        "conformance: {ran} scenarios, {} agree, {} differ ({:.1?}; kubedev's outcomes: {counts:?})",
        ran - mismatches.len(),
        mismatches.len(),
        started.elapsed()
    );
    ensure!(
        args.only.is_some() || ran >= 100,
        "only {ran} conformance scenarios found"
    );
    ensure!(
        mismatches.is_empty(),
        "kubedev and upstream {} differ on {} conformance scenarios: {}",
        args.release,
        mismatches.len(),
        mismatches.join(", ")
    );
    if args.random > 0 {
        generate::random_cases(&mut upstream, args, &out_dir)?;
    }
    upstream.finish()
}

fn indent(text: &str) -> String {
    text.lines()
        .map(|l| format!("    {l}\n"))
        .collect::<String>()
}
