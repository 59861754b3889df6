//! Property tests: for random scenarios, every allocation returned satisfies every selector,
//! constraint, counter, capacity and taint rule, never uses a device twice (except admin
//! access and shareable devices), asks for no device in use, and is reproducible.
//!
//! The random scenario generator and the property are here; the checker of the results, rule by
//! rule, is in `check`.

use std::time::Duration;

use kubedev_allocator::api::*;
use kubedev_allocator::{AllocateOptions, AllocationError, Allocator};
use proptest::prelude::*;

mod check;

use check::check;

/// A small deterministic generator, so one seed describes one scenario.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
    fn word(&mut self, items: &[&'static str]) -> &'static str {
        items[self.below(items.len() as u64) as usize]
    }
    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }
}

const DRIVER: &str = "gpu.example.com";
const SELECTORS: &[&str] = &[
    r#"device.attributes["gpu.example.com"].model == "a""#,
    r#"device.attributes["gpu.example.com"].numa == 1"#,
    r#"device.capacity["gpu.example.com"].memory.compareTo(quantity("2Gi")) >= 0"#,
    r#"device.attributes["gpu.example.com"].fast"#,
    r#"device.attributes["gpu.example.com"].driverVersion.isGreaterThan(semver("1.0.0"))"#,
    r#"device.attributes["gpu.example.com"].model in ["a", "b"] || device.attributes["gpu.example.com"].numa == 0"#,
];

fn q(s: &str) -> RawQuantity {
    RawQuantity(s.to_string())
}

struct Generated {
    slices: Vec<ResourceSlice>,
    classes: Vec<DeviceClass>,
    allocated: Vec<String>,
    claims: Vec<ResourceClaim>,
    node: Node,
}

/// One random scenario from `seed`: one to three pools of one node, one device class, and
/// one or two claims.
fn generate(seed: u64) -> Generated {
    let mut r = Rng(seed | 1);
    let node = Node {
        name: "node-1".into(),
        labels: [("zone".to_string(), "z1".to_string())]
            .into_iter()
            .collect(),
        ..Node::default()
    };
    let mut slices = Vec::new();
    let mut allocated = Vec::new();
    let pools = 1 + r.below(3);
    for p in 0..pools {
        generate_pool(&mut r, p, &mut slices, &mut allocated);
    }
    let classes = vec![gpu_class()];
    let mut claims = Vec::new();
    for c in 0..(1 + r.below(2)) {
        claims.push(generate_claim(&mut r, c));
    }
    Generated {
        slices,
        classes,
        allocated,
        claims,
        node,
    }
}

/// The slices of pool `p`: one or two device slices, plus a counter slice when the pool
/// shares counters; allocated devices are added to `allocated`.
fn generate_pool(
    r: &mut Rng,
    p: u64,
    slices: &mut Vec<ResourceSlice>,
    allocated: &mut Vec<String>,
) {
    let pool = format!("pool-{p}");
    let with_counters = r.chance(40);
    let nslices = 1 + r.below(2);
    let total = nslices + u64::from(with_counters);
    for s in 0..nslices {
        let mut devices = Vec::new();
        for d in 0..(1 + r.below(4)) {
            devices.push(generate_device(r, &pool, s, d, with_counters, allocated));
        }
        slices.push(device_slice(r, &pool, s, total, devices));
    }
    if with_counters {
        slices.push(counter_slice(r, &pool, total));
    }
}

/// Builds a device attribute of one type.
fn attr(i: Option<i64>, b: Option<bool>, st: Option<&str>, v: Option<&str>) -> DeviceAttribute {
    DeviceAttribute {
        int: i,
        bool: b,
        string: st.map(str::to_string),
        version: v.map(str::to_string),
        ..Default::default()
    }
}

/// Device `d` of slice `s` of `pool`: random attributes and memory (shareable at times),
/// counter consumption, a taint, and at times listed in `allocated`.
fn generate_device(
    r: &mut Rng,
    pool: &str,
    s: u64,
    d: u64,
    with_counters: bool,
    allocated: &mut Vec<String>,
) -> Device {
    let name = format!("dev-{s}-{d}");
    let mut dev = Device {
        name: name.clone(),
        ..Device::default()
    };
    dev.attributes.insert(
        "numa".into(),
        attr(Some(r.below(3) as i64), None, None, None),
    );
    dev.attributes.insert(
        "model".into(),
        attr(None, None, Some(*r.pick(&["a", "b", "c"])), None),
    );
    dev.attributes
        .insert("fast".into(), attr(None, Some(r.chance(50)), None, None));
    dev.attributes.insert(
        "driverVersion".into(),
        attr(
            None,
            None,
            None,
            Some(*r.pick(&["1.0.0", "1.1.0", "2.0.0-rc.1"])),
        ),
    );
    let memory = *r.pick(&["1Gi", "2Gi", "4Gi"]);
    let multi = r.chance(20);
    dev.capacity.insert(
        "memory".into(),
        DeviceCapacity {
            value: q(memory),
            request_policy: multi.then(|| CapacityRequestPolicy {
                default: Some(q("1Gi")),
                valid_range: Some(CapacityRequestPolicyRange {
                    min: Some(q("1Gi")),
                    step: Some(q("1Gi")),
                    max: None,
                }),
                ..Default::default()
            }),
        },
    );
    if multi {
        dev.allow_multiple_allocations = Some(true);
    }
    if with_counters && r.chance(70) {
        dev.consumes_counters.push(DeviceCounterConsumption {
            counter_set: "set-0".into(),
            counters: [(
                "mem".to_string(),
                Counter {
                    value: q(r.word(&["2Gi", "4Gi", "6Gi"])),
                },
            )]
            .into_iter()
            .collect(),
        });
    }
    if r.chance(15) {
        dev.taints.push(DeviceTaint {
            key: "maintenance".into(),
            value: String::new(),
            effect: r.pick(&["NoSchedule", "NoExecute", "None"]).to_string(),
        });
    }
    if r.chance(15) {
        allocated.push(format!("{DRIVER}/{pool}/{name}"));
    }
    dev
}

/// Device slice `s` of `pool` (one of `total`), on node-1 or on all nodes.
fn device_slice(
    r: &mut Rng,
    pool: &str,
    s: u64,
    total: u64,
    devices: Vec<Device>,
) -> ResourceSlice {
    let mut slice = ResourceSlice {
        metadata: ObjectMeta {
            name: format!("{pool}-slice-{s}"),
            ..Default::default()
        },
        spec: ResourceSliceSpec {
            driver: DRIVER.into(),
            pool: ResourcePool {
                name: pool.to_string(),
                generation: 1,
                resource_slice_count: total as i64,
            },
            node_name: if r.chance(80) {
                Some("node-1".into())
            } else {
                None
            },
            all_nodes: None,
            devices,
            ..Default::default()
        },
    };
    if slice.spec.node_name.is_none() {
        slice.spec.all_nodes = Some(true);
    }
    slice
}

/// The counter slice of `pool` (one of `total`): counter set `set-0` with a random `mem`.
fn counter_slice(r: &mut Rng, pool: &str, total: u64) -> ResourceSlice {
    ResourceSlice {
        metadata: ObjectMeta {
            name: format!("{pool}-counters"),
            ..Default::default()
        },
        spec: ResourceSliceSpec {
            driver: DRIVER.into(),
            pool: ResourcePool {
                name: pool.to_string(),
                generation: 1,
                resource_slice_count: total as i64,
            },
            node_name: Some("node-1".into()),
            shared_counters: vec![CounterSet {
                name: "set-0".into(),
                counters: [(
                    "mem".to_string(),
                    Counter {
                        value: q(r.word(&["6Gi", "8Gi", "12Gi"])),
                    },
                )]
                .into_iter()
                .collect(),
            }],
            ..Default::default()
        },
    }
}

/// Device class `gpu`: every device of the driver.
fn gpu_class() -> DeviceClass {
    DeviceClass {
        metadata: ObjectMeta {
            name: "gpu".into(),
            ..Default::default()
        },
        spec: DeviceClassSpec {
            selectors: vec![DeviceSelector {
                cel: Some(CelDeviceSelector {
                    expression: format!("device.driver == \"{DRIVER}\""),
                }),
            }],
            config: Vec::new(),
        },
    }
}

/// Claim `c`: one to three requests and at times a matchAttribute and a distinctAttribute
/// constraint.
fn generate_claim(r: &mut Rng, c: u64) -> ResourceClaim {
    let mut requests = Vec::new();
    let nreq = 1 + r.below(3);
    for i in 0..nreq {
        requests.push(generate_request(r, i));
    }
    let constraints = generate_constraints(r);
    ResourceClaim {
        metadata: ObjectMeta {
            name: format!("claim-{c}"),
            namespace: "default".into(),
            ..Default::default()
        },
        spec: ResourceClaimSpec {
            devices: DeviceClaim {
                requests,
                constraints,
                config: Vec::new(),
            },
        },
    }
}

/// Request `r{i}`: random selectors, toleration and capacity; at times a `firstAvailable`
/// request of two subrequests, else an exact request (count, All, admin access).
fn generate_request(r: &mut Rng, i: u64) -> DeviceRequest {
    let selectors: Vec<DeviceSelector> = (0..r.below(2))
        .map(|_| DeviceSelector {
            cel: Some(CelDeviceSelector {
                expression: r.pick(SELECTORS).to_string(),
            }),
        })
        .collect();
    let tolerations = if r.chance(30) {
        vec![DeviceToleration {
            key: "maintenance".into(),
            operator: "Exists".into(),
            ..Default::default()
        }]
    } else {
        Vec::new()
    };
    let capacity = r.chance(20).then(|| CapacityRequirements {
        requests: [("memory".to_string(), q(r.word(&["1Gi", "2Gi"])))]
            .into_iter()
            .collect(),
    });
    if r.chance(20) {
        let subs = (0..2)
            .map(|k| DeviceSubRequest {
                name: format!("s{k}"),
                device_class_name: "gpu".into(),
                selectors: selectors.clone(),
                allocation_mode: Some("ExactCount".into()),
                count: Some(2 - k as i64),
                tolerations: tolerations.clone(),
                capacity: capacity.clone(),
            })
            .collect();
        DeviceRequest {
            name: format!("r{i}"),
            exactly: None,
            first_available: subs,
        }
    } else {
        let all = r.chance(10);
        DeviceRequest {
            name: format!("r{i}"),
            exactly: Some(ExactDeviceRequest {
                device_class_name: "gpu".into(),
                selectors,
                allocation_mode: Some(if all { "All" } else { "ExactCount" }.into()),
                count: if all {
                    None
                } else {
                    Some(1 + r.below(3) as i64)
                },
                admin_access: r.chance(10).then_some(true),
                tolerations,
                capacity,
            }),
            first_available: Vec::new(),
        }
    }
}

/// At times a claim-wide matchAttribute on numa, at times a distinctAttribute on model for r0.
fn generate_constraints(r: &mut Rng) -> Vec<DeviceConstraint> {
    let mut constraints = Vec::new();
    if r.chance(40) {
        constraints.push(DeviceConstraint {
            requests: Vec::new(),
            match_attribute: Some(format!("{DRIVER}/numa")),
            distinct_attribute: None,
        });
    }
    if r.chance(25) {
        constraints.push(DeviceConstraint {
            requests: vec!["r0".into()],
            match_attribute: None,
            distinct_attribute: Some(format!("{DRIVER}/model")),
        });
    }
    constraints
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn allocations_satisfy_every_rule(seed in any::<u64>()) {
        let g = generate(seed);
        let mut allocator = Allocator::new(&g.slices, &g.classes, &g.allocated);
        // Some random claims are exponentially hard to refute; the deadline bounds them.
        let options = AllocateOptions::default().with_deadline(Duration::from_millis(250));
        let first = allocator.allocate(&g.node, &g.claims, &options);
        // Same answer again with warm caches, and from a fresh allocator.
        let again = allocator.allocate(&g.node, &g.claims, &options);
        let mut fresh = Allocator::new(&g.slices, &g.classes, &g.allocated);
        let third = fresh.allocate(&g.node, &g.claims, &options);
        let deadline = |r: &Result<_, AllocationError>| matches!(r, Err(AllocationError::Deadline { .. }));
        if deadline(&first) || deadline(&again) || deadline(&third) {
            return Ok(());
        }
        prop_assert_eq!(&first, &again);
        prop_assert_eq!(&first, &third);
        if let Ok(Some(results)) = &first
            && let Err(e) = check(&g, results)
        {
            return Err(TestCaseError::fail(format!("seed {seed}: {e}")));
        }
        // Explaining never fails where allocating did not.
        if first.is_ok() {
            prop_assert!(allocator.explain(&g.node, &g.claims).is_ok());
        }
    }
}
