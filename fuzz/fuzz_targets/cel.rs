//! Device selectors: arbitrary CEL source is compiled, and what compiles is evaluated against a
//! device with attributes of every type and capacities, under the cost limit. Never panics,
//! never overflows the stack, and the cost stays within the limit.
#![no_main]

use kubedev_allocator::cel::{DeviceContext, compile_uncached, evaluate_with_limit};
use kubedev_core::{AttributeValue, Quantity, Version};
use libfuzzer_sys::fuzz_target;

const LIMIT: u64 = 1_000_000;

fn device() -> &'static DeviceContext {
    static D: std::sync::OnceLock<DeviceContext> = std::sync::OnceLock::new();
    D.get_or_init(|| {
        DeviceContext::new(
            "gpu.example.com",
            [
                ("model".to_string(), AttributeValue::String("x1".into())),
                ("index".to_string(), AttributeValue::Int(3)),
                ("mig".to_string(), AttributeValue::Bool(true)),
                (
                    "driverVersion".to_string(),
                    AttributeValue::Version(Version::parse("550.54.15").expect("version")),
                ),
                (
                    "resource.kubernetes.io/numaNode".to_string(),
                    AttributeValue::Int(1),
                ),
            ],
            [
                ("memory".to_string(), Quantity::parse("80Gi").expect("qty")),
                ("cores".to_string(), Quantity::parse("1500m").expect("qty")),
            ],
            false,
        )
    })
}

fuzz_target!(|data: &[u8]| {
    let Ok(source) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(program) = compile_uncached(source) else {
        return;
    };
    if let Ok((_, cost)) = evaluate_with_limit(&program, device(), LIMIT) {
        assert!(cost <= LIMIT, "cost {cost} over the limit");
    }
});
