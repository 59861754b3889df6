//! Policy call latency with 8 and 64 candidates, module compile time, and memory per loaded
//! policy. Needs the example policies: run `cargo xtask build-plugins` first.
//!
//! `cargo bench -p kubedev-sandbox -- --warm-up-time 1 --measurement-time 3`
//!
//! Calls are measured twice: `call/…` in wall time, `call-cpu/…` in the calling thread's
//! CPU time, which a busy machine disturbs much less (time the thread waits for a core is
//! not counted). `keep` is a module that answers at once and reads every input: the cost
//! of a call with nothing declared; `keep-declared` declares that it reads nothing: the
//! fixed cost every policy pays.
//!
//! Back-to-back calls keep the caches warm; the daemon's calls come one per container
//! admission. `after_idle` times each example policy's call after 50 ms without calls and
//! writes the rows to `target/bench-figures/policy.md` for `cargo xtask bench`'s report.

use std::collections::BTreeMap;
use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use criterion::measurement::{Measurement, ValueFormatter};
use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use kubedev_allocator::api::{Device, DeviceAttribute, DeviceCapacity, RawQuantity};
use kubedev_sandbox::{Candidate, Limits, PolicyInput, Sandbox};

const DRIVER: &str = "gpu.example.com";

fn plugin_bytes(name: &str) -> Vec<u8> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../target/plugins/wasm")
        .join(format!("{name}.wasm"));
    std::fs::read(&path).unwrap_or_else(|e| {
        panic!(
            "{} is missing ({e}): run `cargo xtask build-plugins` first",
            path.display()
        )
    })
}

fn attr_int(v: i64) -> DeviceAttribute {
    DeviceAttribute {
        int: Some(v),
        ..Default::default()
    }
}

fn attr_string(v: String) -> DeviceAttribute {
    DeviceAttribute {
        string: Some(v),
        ..Default::default()
    }
}

/// GPUs as a DRA driver publishes them: six attributes and one capacity each.
fn gpus(n: usize) -> Vec<Device> {
    (0..n)
        .map(|i| {
            let mut attributes = BTreeMap::new();
            attributes.insert("index".into(), attr_int(i as i64));
            attributes.insert("model".into(), attr_string("X100-SXM".into()));
            attributes.insert(
                "driverVersion".into(),
                DeviceAttribute {
                    version: Some("550.54.15".into()),
                    ..Default::default()
                },
            );
            attributes.insert("linkGroup".into(), attr_int((i / 8) as i64));
            attributes.insert(
                "resource.kubernetes.io/numaNode".into(),
                attr_int((i % 8) as i64),
            );
            attributes.insert(
                "resource.kubernetes.io/pcieRoot".into(),
                attr_string(format!("pci0000:{:02x}", i / 4)),
            );
            let mut capacity = BTreeMap::new();
            capacity.insert(
                "memory".into(),
                DeviceCapacity {
                    value: RawQuantity::from("80Gi"),
                    request_policy: None,
                },
            );
            Device {
                name: format!("gpu-{i}"),
                attributes,
                capacity,
                ..Default::default()
            }
        })
        .collect()
}

fn input(devices: &[Device], count: usize) -> PolicyInput<'_> {
    let candidates = devices
        .iter()
        .map(|d| Candidate::published(DRIVER, "node-1", d))
        .collect();
    PolicyInput::new("default/job", "gpus", count, candidates)
}

/// A module that keeps the contract and answers "keep" at once; with `declared`, it also
/// declares that it reads no attribute, capacity or counter.
fn keep_policy(declared: bool) -> Vec<u8> {
    let declaration = if declared {
        r#"(func (export "kubedev_policy_inputs") (result i64) (i64.const 0x0000080000000000))"#
    } else {
        ""
    };
    wat::parse_str(format!(
        r#"(module
          (memory (export "memory") 1)
          (func (export "kubedev_policy_abi_version") (result i32) (i32.const 1))
          (func (export "kubedev_alloc") (param i32) (result i32) (i32.const 4096))
          (func (export "kubedev_select") (param i32 i32) (result i64)
            (i64.or (i64.shl (i64.const 1024) (i64.const 32)) (i64.const 13)))
          {declaration}
          (data (i32.const 1024) "KDPO\01\00\00\00\00\00\00\00\00"))"#
    ))
    .expect("wat")
}

/// The calling thread's CPU time, for criterion.
struct ThreadCpu;

fn thread_cpu_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    (t.tv_sec as u64).saturating_mul(1_000_000_000) + t.tv_nsec as u64
}

impl Measurement for ThreadCpu {
    type Intermediate = u64;
    type Value = u64;

    fn start(&self) -> u64 {
        thread_cpu_ns()
    }
    fn end(&self, start: u64) -> u64 {
        thread_cpu_ns().saturating_sub(start)
    }
    fn add(&self, a: &u64, b: &u64) -> u64 {
        a + b
    }
    fn zero(&self) -> u64 {
        0
    }
    fn to_f64(&self, v: &u64) -> f64 {
        *v as f64
    }
    fn formatter(&self) -> &dyn ValueFormatter {
        &CpuFormatter
    }
}

/// Prints nanoseconds of CPU time as `µs cpu`.
struct CpuFormatter;

impl ValueFormatter for CpuFormatter {
    fn scale_values(&self, _typical: f64, values: &mut [f64]) -> &'static str {
        for v in values {
            *v /= 1000.0;
        }
        "µs cpu"
    }
    fn scale_throughputs(
        &self,
        _typical: f64,
        _t: &Throughput,
        _values: &mut [f64],
    ) -> &'static str {
        "-"
    }
    fn scale_for_machines(&self, _values: &mut [f64]) -> &'static str {
        "ns"
    }
}

fn calls<M: Measurement>(c: &mut Criterion<M>, group_name: &str) {
    let sb = Sandbox::new(Limits::default()).expect("sandbox");
    let mut group = c.benchmark_group(group_name);
    for n in [8usize, 64] {
        let devices = gpus(n);
        for (name, declared) in [("keep", false), ("keep-declared", true)] {
            let keep = sb.load(name, &keep_policy(declared)).expect("load");
            group.bench_function(format!("{name}/{n}"), |b| {
                b.iter(|| {
                    keep.evaluate(black_box(&input(&devices, n / 8)))
                        .expect("call")
                })
            });
        }
        for name in ["numa-pack", "nvlink-pack", "spread", "binpack"] {
            let policy = sb.load(name, &plugin_bytes(name)).expect("load");
            group.bench_function(format!("{name}/{n}"), |b| {
                b.iter(|| {
                    policy
                        .evaluate(black_box(&input(&devices, n / 8)))
                        .expect("call")
                })
            });
        }
    }
    group.finish();
}

fn calls_wall(c: &mut Criterion) {
    calls(c, "call");
}

fn calls_cpu(c: &mut Criterion<ThreadCpu>) {
    calls(c, "call-cpu");
}

fn compile(c: &mut Criterion) {
    let bytes = plugin_bytes("numa-pack");
    let mut group = c.benchmark_group("compile");
    group.sample_size(10);
    group.bench_function("numa-pack", |b| {
        b.iter_batched(
            || Sandbox::new(Limits::default()).expect("sandbox"),
            |sb| sb.load("numa-pack", black_box(&bytes)).expect("load"),
            BatchSize::PerIteration,
        )
    });
    let sb = Sandbox::new(Limits::default()).expect("sandbox");
    let _held = sb.load("numa-pack", &bytes).expect("load");
    group.bench_function("numa-pack-cached", |b| {
        b.iter(|| sb.load("numa-pack", black_box(&bytes)).expect("load"))
    });
    group.finish();
}

fn rss_bytes() -> usize {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<usize>().ok())
        .map_or(0, |pages| pages * 4096)
}

/// Not a timing: resident memory added per loaded (compiled, distinct) policy.
fn memory_per_policy(_: &mut Criterion) {
    let sb = Sandbox::new(Limits::default()).expect("sandbox");
    let base = plugin_bytes("spread");
    let devices = gpus(8);
    let n = 40;
    let before = rss_bytes();
    let mut held = Vec::new();
    for i in 0..n {
        // A custom section makes each module distinct, so each is compiled and kept.
        let mut bytes = base.clone();
        let name = format!("copy-{i}");
        bytes.push(0);
        bytes.push((1 + name.len()) as u8);
        bytes.push(name.len() as u8);
        bytes.extend_from_slice(name.as_bytes());
        let p = sb.load(&name, &bytes).expect("load");
        p.evaluate(&input(&devices, 1)).expect("call");
        held.push(p);
    }
    let after = rss_bytes();
    println!(
        "memory per loaded policy (spread, {} KiB module): {:.0} KiB resident ({} policies, {} modules cached)",
        base.len() / 1024,
        after.saturating_sub(before) as f64 / n as f64 / 1024.0,
        n,
        sb.cached_modules()
    );
}

/// How long each call timed by [`after_idle`] follows the previous one.
const IDLE_GAP: Duration = Duration::from_millis(50);
/// Calls timed after idle, per policy.
const IDLE_CALLS: usize = 40;

/// Not a criterion timing: each example policy's call on 8 candidates, made after
/// [`IDLE_GAP`] without calls; median and 90th percentile as report rows.
fn after_idle(_: &mut Criterion) {
    let sb = Sandbox::new(Limits::default()).expect("sandbox");
    let devices = gpus(8);
    let mut rows = String::new();
    for name in ["numa-pack", "nvlink-pack", "spread", "binpack"] {
        let policy = sb.load(name, &plugin_bytes(name)).expect("load");
        let mut times: Vec<Duration> = (0..IDLE_CALLS)
            .map(|_| {
                std::thread::sleep(IDLE_GAP);
                let started = Instant::now();
                policy.evaluate(&input(&devices, 1)).expect("call");
                started.elapsed()
            })
            .collect();
        times.sort();
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        rows.push_str(&format!(
            "| policy call, 8 candidates, each after {} ms without calls, {name} | {:.1} µs (p90 {:.1} µs) |\n",
            IDLE_GAP.as_millis(),
            us(times[times.len() / 2]),
            us(times[times.len() * 9 / 10]),
        ));
    }
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("../bench-figures");
    std::fs::create_dir_all(&dir).expect("figures directory");
    std::fs::write(dir.join("policy.md"), &rows).expect("figures");
    print!("{rows}");
}

criterion_group!(benches, calls_wall, compile, memory_per_policy, after_idle);
criterion_group! {
    name = cpu;
    config = Criterion::default().with_measurement(ThreadCpu);
    targets = calls_cpu
}
criterion_main!(benches, cpu);
