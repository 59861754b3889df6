//! Allocator benchmarks over `../shared/bench-scenarios` (override with
//! `KUBEDEV_BENCH_SCENARIOS=DIR`), read as YAML into the scenario type `kubedev simulate` reads
//! them into (with room for cluster-sized files):
//!
//! - `allocate/NAME`: one allocation with warm caches (the allocator is built once and has
//!   allocated once, as in a long-running scheduler);
//! - `build_allocate/NAME`: building the allocator over all slices plus one allocation;
//! - `selector/eval`: one selector evaluation with a prebuilt device context.
//!
//! Run: `cargo bench -p kubedev-allocator -- --warm-up-time 1 --measurement-time 3`.

use std::hint::black_box;
use std::path::{Path, PathBuf};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use kubedev_allocator::cel::{self, AttributeValue, DeviceContext};
use kubedev_allocator::{AllocateOptions, Allocator, Scenario};
use kubedev_core::{Quantity, Version};

fn scenario_dir() -> PathBuf {
    std::env::var_os("KUBEDEV_BENCH_SCENARIOS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/bench-scenarios")
        })
}

/// A scenario file, as YAML with budgets for thousands of slices.
fn read(path: &Path) -> Result<Scenario, String> {
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    let mut budget = serde_saphyr::Budget::default();
    budget.max_events = 50_000_000;
    budget.max_nodes = 20_000_000;
    budget.max_total_scalar_bytes = 256 << 20;
    let mut options = serde_saphyr::Options::default();
    options.budget = Some(budget);
    serde_saphyr::from_str_with_options(&text, options).map_err(|e| e.to_string())
}

fn scenarios() -> Vec<(String, Scenario)> {
    let dir = scenario_dir();
    let Ok(entries) = std::fs::read_dir(&dir) else {
        eprintln!("no scenarios in {}", dir.display());
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    files
        .into_iter()
        .filter_map(|p| {
            let name = p.file_stem()?.to_str()?.to_string();
            match read(&p) {
                Ok(s) => Some((name, s)),
                Err(e) => {
                    eprintln!("{}: {e}", p.display());
                    None
                }
            }
        })
        .collect()
}

fn allocate(c: &mut Criterion) {
    let options = AllocateOptions::default();
    let all = scenarios();
    let mut group = c.benchmark_group("allocate");
    for (name, s) in &all {
        let mut allocator =
            Allocator::new(&s.resource_slices, &s.device_classes, &s.allocated_devices);
        let first = allocator.allocate(&s.node, &s.claims, &options);
        assert!(first.is_ok(), "{name}: {first:?}");
        group.bench_function(name.as_str(), |b| {
            b.iter(|| black_box(allocator.allocate(&s.node, &s.claims, &options)))
        });
    }
    group.finish();
    let mut group = c.benchmark_group("build_allocate");
    for (name, s) in &all {
        group.bench_function(name.as_str(), |b| {
            b.iter(|| {
                let mut allocator =
                    Allocator::new(&s.resource_slices, &s.device_classes, &s.allocated_devices);
                black_box(allocator.allocate(&s.node, &s.claims, &options))
            })
        });
    }
    group.finish();
}

fn selector(c: &mut Criterion) {
    let ctx = DeviceContext::new(
        "gpu.example.com",
        vec![
            ("model".to_string(), AttributeValue::String("h100".into())),
            ("numa".to_string(), AttributeValue::Int(1)),
            (
                "driverVersion".to_string(),
                AttributeValue::Version(Version::parse("560.35.3").expect("version")),
            ),
        ],
        vec![(
            "memory".to_string(),
            Quantity::parse("80Gi").expect("quantity"),
        )],
        false,
    );
    let program = cel::compile(
        r#"device.attributes["gpu.example.com"].model == "h100" && device.capacity["gpu.example.com"].memory.compareTo(quantity("40Gi")) >= 0"#,
    )
    .expect("compiles");
    let mut group = c.benchmark_group("selector");
    group.throughput(Throughput::Elements(1));
    group.bench_function("eval", |b| {
        b.iter(|| black_box(cel::evaluate(&program, &ctx)))
    });
    let driver = cel::compile(r#"device.driver == "gpu.example.com""#).expect("compiles");
    group.bench_function("eval_driver", |b| {
        b.iter(|| black_box(cel::evaluate(&driver, &ctx)))
    });
    group.finish();
}

criterion_group!(benches, selector, allocate);
criterion_main!(benches);
