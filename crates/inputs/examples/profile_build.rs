//! Repeats build + allocate (or, with `warm`, only allocate) on one scenario, for profiling:
//! `cargo run --release -p kubedev-inputs --example profile_build -- FILE [N] [warm]`.

use kubedev_allocator::{AllocateOptions, Allocator};

fn main() {
    let mut args = std::env::args().skip(1);
    let path = args.next().unwrap_or_default();
    let n: usize = args.next().and_then(|n| n.parse().ok()).unwrap_or(2000);
    let s = match kubedev_inputs::read_scenario(&path) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    };
    let options = AllocateOptions::default();
    if args.next().as_deref() == Some("warm") {
        let mut a = Allocator::new(&s.resource_slices, &s.device_classes, &s.allocated_devices);
        for _ in 0..n {
            std::hint::black_box(a.allocate(&s.node, &s.claims, &options).ok());
        }
        return;
    }
    for _ in 0..n {
        let mut a = Allocator::new(&s.resource_slices, &s.device_classes, &s.allocated_devices);
        std::hint::black_box(a.allocate(&s.node, &s.claims, &options).ok());
    }
}
