//! Property tests: for random scenarios, every allocation returned satisfies every selector,
//! constraint, counter, capacity and taint rule, never uses a device twice (except admin
//! access and shareable devices), asks for no device in use, and is reproducible.

use std::collections::{BTreeMap, HashMap};

use kubedev_allocator::api::*;
use kubedev_allocator::cel::{self, AttributeValue, DeviceContext};
use std::time::Duration;

use kubedev_allocator::{AllocateOptions, AllocationError, Allocator, MAX_DEVICES_PER_CLAIM};
use kubedev_core::{Quantity, Version};
use proptest::prelude::*;

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

fn context(d: &Device) -> DeviceContext {
    let attrs = d.attributes.iter().map(|(k, a)| {
        let v = if let Some(i) = a.int {
            AttributeValue::Int(i)
        } else if let Some(b) = a.bool {
            AttributeValue::Bool(b)
        } else if let Some(s) = &a.string {
            AttributeValue::String(s.clone())
        } else {
            AttributeValue::Version(
                Version::parse(a.version.as_deref().unwrap_or("")).expect("version"),
            )
        };
        (k.clone(), v)
    });
    let caps = d.capacity.iter().map(|(k, c)| {
        (
            k.clone(),
            Quantity::parse(c.value.as_str()).expect("quantity"),
        )
    });
    DeviceContext::new(
        DRIVER,
        attrs,
        caps,
        d.allow_multiple_allocations.unwrap_or(false),
    )
}

fn attr_key(d: &Device, name: &str) -> Option<String> {
    let id = name.strip_prefix(&format!("{DRIVER}/"))?;
    let a = d.attributes.get(id)?;
    Some(format!(
        "{:?}/{:?}/{:?}/{:?}",
        a.int, a.bool, a.string, a.version
    ))
}

/// Every device of the scenario by `(pool, device)`, with its slice.
type DeviceIndex<'g> = HashMap<(String, String), (&'g ResourceSlice, &'g Device)>;

/// How the allocated devices are used across all claims: exclusively (how often) or as
/// shares (how much memory together).
#[derive(Default)]
struct Usage {
    exclusive: HashMap<(String, String), usize>,
    shared: HashMap<(String, String), Quantity>,
}

/// The selectors, tolerations, admin access and capacity of the request a result names.
type RequestRules<'c> = (
    &'c Vec<DeviceSelector>,
    &'c Vec<DeviceToleration>,
    bool,
    &'c Option<CapacityRequirements>,
);

/// Checks that `results` (one per claim) satisfy every rule of the scenario.
fn check(g: &Generated, results: &[AllocationResult]) -> Result<(), String> {
    let mut devices: DeviceIndex<'_> = HashMap::new();
    for s in &g.slices {
        for d in &s.spec.devices {
            devices.insert((s.spec.pool.name.clone(), d.name.clone()), (s, d));
        }
    }
    let mut usage = Usage::default();
    if results.len() != g.claims.len() {
        return Err("one result per claim expected".into());
    }
    for (claim, result) in g.claims.iter().zip(results) {
        check_claim(g, &devices, claim, result, &mut usage)?;
    }
    check_usage(&devices, &usage)?;
    check_counters(g, &devices, &usage)
}

/// Checks the result of one claim: each device against its request, then the counts and
/// the constraints; records the use of each device in `usage`.
fn check_claim(
    g: &Generated,
    devices: &DeviceIndex<'_>,
    claim: &ResourceClaim,
    result: &AllocationResult,
    usage: &mut Usage,
) -> Result<(), String> {
    if result.devices.results.len() > MAX_DEVICES_PER_CLAIM {
        return Err(format!(
            "{} devices for one claim",
            result.devices.results.len()
        ));
    }
    let mut per_request: BTreeMap<&str, usize> = BTreeMap::new();
    for r in &result.devices.results {
        check_device_result(g, devices, claim, r, usage)?;
        *per_request.entry(r.request.as_str()).or_default() += 1;
    }
    check_counts(claim, &per_request)?;
    check_constraints(devices, claim, result)
}

/// Checks one allocated device: known, on the node, for a known request, satisfying its
/// selectors and taints, not in use unless admin access; records its exclusive or shared use.
fn check_device_result(
    g: &Generated,
    devices: &DeviceIndex<'_>,
    claim: &ResourceClaim,
    r: &DeviceRequestAllocationResult,
    usage: &mut Usage,
) -> Result<(), String> {
    let key = (r.pool.clone(), r.device.clone());
    let (slice, dev) = devices
        .get(&key)
        .ok_or_else(|| format!("unknown device {}/{}", r.pool, r.device))?;
    if slice
        .spec
        .node_name
        .as_deref()
        .is_some_and(|n| n != "node-1")
    {
        return Err(format!("device {} is on another node", r.device));
    }
    let (selectors, tolerations, admin, capacity) = request_rules(claim, r)?;
    let ctx = context(dev);
    for sel in g.classes[0].spec.selectors.iter().chain(selectors) {
        let expr = &sel.cel.as_ref().expect("cel").expression;
        let p = cel::compile(expr).map_err(|e| e.to_string())?;
        if cel::evaluate(&p, &ctx) != Ok(true) {
            return Err(format!("device {} does not satisfy {expr}", r.device));
        }
    }
    for t in &dev.taints {
        if (t.effect == "NoSchedule" || t.effect == "NoExecute") && tolerations.is_empty() {
            return Err(format!("device {} has an untolerated taint", r.device));
        }
    }
    let multi = dev.allow_multiple_allocations.unwrap_or(false);
    let in_use = g
        .allocated
        .contains(&format!("{DRIVER}/{}/{}", r.pool, r.device));
    if in_use && !admin {
        return Err(format!("device {} is in use", r.device));
    }
    if admin {
        return Ok(());
    }
    if multi {
        let consumed = r
            .consumed_capacity
            .get("memory")
            .ok_or_else(|| format!("shared device {} without consumed capacity", r.device))?;
        let consumed = Quantity::parse(consumed).map_err(|e| e.to_string())?;
        if let Some(cap) = capacity
            && let Some(want) = cap.requests.get("memory")
            && consumed < Quantity::parse(want.as_str()).expect("quantity")
        {
            return Err(format!("share of {} smaller than requested", r.device));
        }
        let total = usage.shared.entry(key.clone()).or_default();
        *total = total.checked_add(&consumed).expect("sum");
    } else {
        *usage.exclusive.entry(key.clone()).or_default() += 1;
    }
    Ok(())
}

/// The rules of the request (or subrequest) that result `r` names.
fn request_rules<'c>(
    claim: &'c ResourceClaim,
    r: &DeviceRequestAllocationResult,
) -> Result<RequestRules<'c>, String> {
    let (base, sub) = match r.request.split_once('/') {
        Some((b, s)) => (b, Some(s)),
        None => (r.request.as_str(), None),
    };
    let req = claim
        .spec
        .devices
        .requests
        .iter()
        .find(|x| x.name == base)
        .ok_or_else(|| format!("unknown request {}", r.request))?;
    match (sub, &req.exactly) {
        (None, Some(e)) => Ok((
            &e.selectors,
            &e.tolerations,
            e.admin_access.unwrap_or(false),
            &e.capacity,
        )),
        (Some(s), _) => {
            let sr = req
                .first_available
                .iter()
                .find(|x| x.name == s)
                .ok_or_else(|| format!("unknown subrequest {}", r.request))?;
            Ok((&sr.selectors, &sr.tolerations, false, &sr.capacity))
        }
        _ => Err("request shape".into()),
    }
}

/// Every exact request that is not `All` got exactly its count of devices.
fn check_counts(claim: &ResourceClaim, per_request: &BTreeMap<&str, usize>) -> Result<(), String> {
    for req in &claim.spec.devices.requests {
        if let Some(e) = &req.exactly
            && e.allocation_mode.as_deref() != Some("All")
        {
            let want = e.count.unwrap_or(1) as usize;
            let got = per_request.get(req.name.as_str()).copied().unwrap_or(0);
            if got != want {
                return Err(format!(
                    "request {} got {got} devices, wants {want}",
                    req.name
                ));
            }
        }
    }
    Ok(())
}

/// The devices a constraint of the claim applies to all have its attribute, share it
/// (matchAttribute) or all differ (distinctAttribute).
fn check_constraints(
    devices: &DeviceIndex<'_>,
    claim: &ResourceClaim,
    result: &AllocationResult,
) -> Result<(), String> {
    for c in &claim.spec.devices.constraints {
        let applies = |r: &str| {
            c.requests.is_empty()
                || c.requests
                    .iter()
                    .any(|x| x == r || r.split('/').next() == Some(x.as_str()))
        };
        let values: Vec<Option<String>> = result
            .devices
            .results
            .iter()
            .filter(|r| applies(&r.request))
            .map(|r| {
                let (_, dev) = devices[&(r.pool.clone(), r.device.clone())];
                attr_key(
                    dev,
                    c.match_attribute
                        .as_deref()
                        .or(c.distinct_attribute.as_deref())
                        .unwrap_or(""),
                )
            })
            .collect();
        if values.iter().any(Option::is_none) {
            return Err("a constrained device lacks the attribute".into());
        }
        if c.match_attribute.is_some() && values.windows(2).any(|w| w[0] != w[1]) {
            return Err("matchAttribute violated".into());
        }
        if c.distinct_attribute.is_some() {
            let mut v = values.clone();
            v.sort();
            v.dedup();
            if v.len() != values.len() {
                return Err("distinctAttribute violated".into());
            }
        }
    }
    Ok(())
}

/// No device is used exclusively twice, or both exclusively and shared, and the shares of a
/// device fit its memory.
fn check_usage(devices: &DeviceIndex<'_>, usage: &Usage) -> Result<(), String> {
    for (key, n) in &usage.exclusive {
        if *n > 1 {
            return Err(format!("device {}/{} used {n} times", key.0, key.1));
        }
        if usage.shared.contains_key(key) {
            return Err(format!("device {}/{} shared and exclusive", key.0, key.1));
        }
    }
    for (key, total) in &usage.shared {
        let (_, dev) = devices[key];
        let cap = Quantity::parse(dev.capacity["memory"].value.as_str()).expect("quantity");
        if *total > cap {
            return Err(format!(
                "device {}/{} shares exceed its capacity",
                key.0, key.1
            ));
        }
    }
    Ok(())
}

/// The counters of each pool cover the devices chosen and already allocated (allocated
/// devices may overdraw on their own; then nothing new may consume).
fn check_counters(g: &Generated, devices: &DeviceIndex<'_>, usage: &Usage) -> Result<(), String> {
    let mut pool_use: HashMap<String, Quantity> = HashMap::new();
    let mut counted: Vec<(String, String)> = Vec::new();
    let mut chosen: Vec<(String, String)> = usage.exclusive.keys().cloned().collect();
    chosen.extend(usage.shared.keys().cloned());
    for a in &g.allocated {
        let parts: Vec<&str> = a.splitn(3, '/').collect();
        chosen.push((parts[1].to_string(), parts[2].to_string()));
    }
    for key in chosen {
        if counted.contains(&key) {
            continue;
        }
        counted.push(key.clone());
        let (_, dev) = devices[&key];
        for cc in &dev.consumes_counters {
            let amount = Quantity::parse(cc.counters["mem"].value.as_str()).expect("quantity");
            let e = pool_use.entry(key.0.clone()).or_default();
            *e = e.checked_add(&amount).expect("sum");
        }
    }
    for s in &g.slices {
        for set in &s.spec.shared_counters {
            let avail = Quantity::parse(set.counters["mem"].value.as_str()).expect("quantity");
            let used = pool_use.get(&s.spec.pool.name).copied().unwrap_or_default();
            // Allocated devices may overdraw on their own; then nothing new may consume.
            let allocated_only: Quantity = g
                .allocated
                .iter()
                .filter(|a| a.split('/').nth(1) == Some(s.spec.pool.name.as_str()))
                .filter_map(|a| {
                    let parts: Vec<&str> = a.splitn(3, '/').collect();
                    devices.get(&(parts[1].to_string(), parts[2].to_string()))
                })
                .flat_map(|(_, d)| d.consumes_counters.iter())
                .map(|cc| Quantity::parse(cc.counters["mem"].value.as_str()).expect("quantity"))
                .fold(Quantity::default(), |a, b| a.checked_add(&b).expect("sum"));
            if used > avail && used != allocated_only {
                return Err(format!("counters of pool {} overdrawn", s.spec.pool.name));
            }
        }
    }
    Ok(())
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
