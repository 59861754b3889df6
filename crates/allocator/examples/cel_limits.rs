//! Measures how the CEL bounds behave: the time to hit the cost limit with a hostile
//! selector, and the stack the deepest accepted expression needs.
//! `cargo run --release -p kubedev-allocator --example cel_limits`.

use std::time::Instant;

use kubedev_allocator::cel::{self, AttributeValue, DeviceContext, MAX_AST_DEPTH};

fn device() -> DeviceContext {
    DeviceContext::new(
        "gpu.example.com",
        vec![("model".to_string(), AttributeValue::String("h100".into()))],
        Vec::new(),
        false,
    )
}

fn main() {
    let ctx = device();
    // Cost limit: nested comprehensions over 100-element lists.
    let range = format!(
        "[{}]",
        (0..100)
            .map(|i| i.to_string())
            .collect::<Vec<_>>()
            .join(",")
    );
    let bomb = format!(
        "{r}.all(a, {r}.all(b, {r}.all(c, a + b + c >= 0)))",
        r = range
    );
    let p = cel::compile(&bomb).expect("compiles");
    let t = Instant::now();
    let r = cel::evaluate(&p, &ctx);
    println!(
        "cost-limit bomb: stopped after {:?} with {:?}",
        t.elapsed(),
        r.map_err(|e| e.is_cost_limit())
    );
    // The deepest accepted expression: a left-deep chain just under the depth limit.
    let depth: usize = std::env::args()
        .nth(2)
        .and_then(|a| a.parse().ok())
        .unwrap_or(MAX_AST_DEPTH - 3);
    let chain = format!("{} >= 0", vec!["1"; depth].join(" + "));
    let p = cel::compile(&chain).expect("compiles");
    // A stack overflow aborts the process, so this runs once on the size given (KiB).
    let kib: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(256);
    let ok = std::thread::Builder::new()
        .stack_size(kib << 10)
        .spawn(move || cel::evaluate(&p, &device()).is_ok())
        .expect("thread")
        .join()
        .unwrap_or(false);
    println!("depth {depth} chain on a {kib} KiB stack: evaluated={ok}");
    // Compiling the longest accepted expression.
    let long = format!("{} == 0", vec!["1"; 2500].join("+"));
    let t = Instant::now();
    let r = cel::compile_uncached(&long);
    println!(
        "compile of a {}-byte chain: {:?} ({})",
        long.len(),
        t.elapsed(),
        r.err().map(|e| e.to_string()).unwrap_or_default()
    );
}
