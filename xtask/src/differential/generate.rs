//! Seeded random scenarios for the differential test, and the shrinking of one both allocators
//! answer differently.
//!
//! A scenario has one or two drivers with one or two pools each (on the node, on another node,
//! on all nodes or on nodes chosen by a label), pools split over slices and sometimes
//! incomplete, devices with attributes of every type (lists when `DRAListTypeAttributes` is
//! drawn), capacities, counter sets consumed by a parent device and its partitions, taints,
//! binding conditions, consumable capacity with request policies, devices already allocated
//! and shares already allocated with the capacity they consumed; DeviceTaintRules;
//! and one or two claims whose requests are exact or first-available lists, by count or all,
//! with selectors drawn from a grammar of the DRA CEL environment's functions, tolerations,
//! admin access, capacity requests, configuration and matchAttribute / distinctAttribute
//! constraints.

use std::path::Path;

use anyhow::{Context as _, bail};
use kubedev_allocator::Scenario;
use serde_json::{Map, Value, json};

use super::peer::Upstream;
use super::{Args, Outcome, difference, ours};

/// The most allocations a shrink tries.
const SHRINK_TRIES: usize = 3000;

/// Compares `args.random` random scenarios, seeds `seed`, `seed + 1`, ...; fails on the first
/// that differs, after writing it (and its shrunk form) under `out`.
pub(super) fn random_cases(up: &mut Upstream, args: &Args, out: &Path) -> anyhow::Result<()> {
    let first = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_secs())
    });
    let started = std::time::Instant::now();
    let mut classes = std::collections::BTreeMap::<&str, usize>::new();
    for seed in first..first + args.random {
        let value = scenario(seed);
        let scenario = parse(&value).with_context(|| format!("random scenario, seed {seed}"))?;
        if args.keep {
            write_scenario(&out.join(format!("random-{seed}.yaml")), &value, seed, "")?;
        }
        let mine = ours(&scenario);
        let theirs = up.allocate(&scenario)?;
        *classes.entry(mine.class()).or_default() += 1;
        if let Some(diff) = difference(&args.release, &scenario, &mine, &theirs) {
            let full = out.join(format!("random-{seed}.yaml"));
            write_scenario(&full, &value, seed, &diff)?;
            let shrunk = shrink(up, &args.release, value)?;
            let small = out.join(format!("random-{seed}-shrunk.yaml"));
            let shrunk_scenario = parse(&shrunk)?;
            let shrunk_diff = difference(
                &args.release,
                &shrunk_scenario,
                &ours(&shrunk_scenario),
                &up.allocate(&shrunk_scenario)?,
            )
            .unwrap_or_default();
            write_scenario(&small, &shrunk, seed, &shrunk_diff)?;
            bail!(
                "kubedev and upstream {} differ on random scenario seed {seed} \
                 (cargo xtask differential --seed {seed} --random 1):\n{}\nthe scenario: {}\n\
                 shrunk: {}\n{}",
                args.release,
                super::indent(&diff),
                full.display(),
                small.display(),
                super::indent(&shrunk_diff)
            );
        }
    }
    eprintln!(
        "random: {} scenarios from seed {first}, all agree ({:.1?}; outcomes: {classes:?})",
        args.random,
        started.elapsed()
    );
    Ok(())
}

fn parse(value: &Value) -> anyhow::Result<Scenario> {
    serde_json::from_value(value.clone()).context("the generated scenario does not load")
}

fn write_scenario(path: &Path, value: &Value, seed: u64, diff: &str) -> anyhow::Result<()> {
    let mut text = if diff.is_empty() {
        format!("# Random scenario, seed {seed}.\n")
    } else {
        format!(
            "# Random scenario, seed {seed}, on which kubedev and upstream differ:\n{}",
            diff.lines().map(|l| format!("# {l}\n")).collect::<String>()
        )
    };
    text.push_str(&serde_saphyr::to_string(value).context("writing the scenario as YAML")?);
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

/// Removes array items and object fields one at a time while the two allocators still differ.
fn shrink(up: &mut Upstream, release: &str, mut value: Value) -> anyhow::Result<Value> {
    let mut tries = 0;
    loop {
        let mut progressed = false;
        let mut path_index = 0;
        while let Some(candidate) = without_nth(&value, path_index) {
            path_index += 1;
            if tries >= SHRINK_TRIES {
                return Ok(value);
            }
            let Ok(scenario) = parse(&candidate) else {
                continue;
            };
            tries += 1;
            let theirs = up.allocate(&scenario)?;
            // A removal the API server would refuse (upstream panics on some) is no smaller case.
            if !matches!(theirs, Outcome::Panic(_))
                && difference(release, &scenario, &ours(&scenario), &theirs).is_some()
            {
                value = candidate;
                progressed = true;
                path_index -= 1;
            }
        }
        if !progressed {
            return Ok(value);
        }
    }
}

/// `value` with its `n`th removable part removed (array items and object fields, depth first),
/// or `None` when it has fewer.
fn without_nth(value: &Value, n: usize) -> Option<Value> {
    let mut out = value.clone();
    let mut left = n;
    remove_nth(&mut out, &mut left).then_some(out)
}

/// Fields without which an object is not one the API server would store: never removed.
const REQUIRED: &[&str] = &[
    "apiVersion",
    "kind",
    "metadata",
    "spec",
    "name",
    "driver",
    "device",
    "pool",
    "generation",
    "resourceSliceCount",
    "deviceClassName",
    "cel",
    "expression",
    "node",
    "counterSet",
    "value",
    "key",
    "effect",
    "taint",
    "exactly",
    "firstAvailable",
    "opaque",
    "parameters",
];

fn remove_nth(value: &mut Value, left: &mut usize) -> bool {
    match value {
        Value::Array(items) => {
            for i in 0..items.len() {
                if *left == 0 {
                    items.remove(i);
                    return true;
                }
                *left -= 1;
                if remove_nth(&mut items[i], left) {
                    return true;
                }
            }
            false
        }
        Value::Object(map) => {
            let keys: Vec<String> = map.keys().cloned().collect();
            for k in keys {
                if !REQUIRED.contains(&k.as_str()) {
                    if *left == 0 {
                        map.remove(&k);
                        return true;
                    }
                    *left -= 1;
                }
                if let Some(v) = map.get_mut(&k)
                    && remove_nth(v, left)
                {
                    return true;
                }
            }
            false
        }
        _ => false,
    }
}

/// What the drawn scenario has, for the parts drawn later.
struct Draw {
    rng: fastrand::Rng,
    lists: bool,
    drivers: Vec<&'static str>,
    /// Every device on the node (or reachable from it): `driver/pool/device`.
    devices: Vec<String>,
    /// Those of them that allow multiple allocations.
    shareable: Vec<String>,
}

impl Draw {
    fn chance(&mut self, p: f64) -> bool {
        self.rng.f64() < p
    }

    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.rng.usize(..items.len())]
    }

    fn driver(&mut self) -> &'static str {
        let drivers = self.drivers.clone();
        self.pick(&drivers)
    }
}

const MODELS: &[&str] = &["a100", "h100", "l4"];
const PORTS: &[&str] = &["p0", "p1", "p2", "p3"];
const PCIE: &[&str] = &["pci0", "pci1"];
const STANDARD: &str = "resource.kubernetes.io";

/// The random scenario of `seed`, as a scenario file's JSON.
pub(crate) fn scenario(seed: u64) -> Value {
    let mut d = Draw {
        rng: fastrand::Rng::with_seed(seed),
        lists: false,
        drivers: vec!["driver-a"],
        devices: Vec::new(),
        shareable: Vec::new(),
    };
    d.lists = d.chance(0.3);
    let node_operations = d.chance(0.3);
    if d.chance(0.4) {
        d.drivers.push("driver-b");
    }
    let mut slices = Vec::new();
    for driver in d.drivers.clone() {
        for p in 0..d.rng.usize(1..=2) {
            pool_slices(&mut d, driver, &format!("pool-{p}"), &mut slices);
        }
    }
    let allocated: Vec<String> = d
        .devices
        .clone()
        .into_iter()
        .filter(|_| d.chance(0.12))
        .collect();
    let shares = shares(&mut d);
    let rules = taint_rules(&mut d);
    let classes = classes(&mut d);
    let claims: Vec<Value> = (0..if d.chance(0.6) { 1 } else { 2 })
        .map(|i| claim(&mut d, i))
        .collect();
    let mut features = Vec::new();
    if d.lists {
        features.push("DRAListTypeAttributes");
    }
    if node_operations {
        features.push("DRAOptionalNodeOperations");
    }
    let mut node = json!({"name": "node-1", "labels": {"zone": d.pick(&["a", "b"])}});
    if d.chance(0.5) {
        node["declaredFeatures"] = json!(["DRAOptionalNodeOperations"]);
    }
    json!({
        "node": node,
        "deviceClasses": classes,
        "resourceSlices": slices,
        "deviceTaintRules": rules,
        "allocatedDevices": allocated,
        "allocatedShares": shares,
        "claims": claims,
        "features": features,
    })
}

/// The slices of one pool: devices over one or two slices, sometimes a slice of counter sets
/// consumed by a parent device and its partitions, sometimes one slice too few.
fn pool_slices(d: &mut Draw, driver: &str, pool: &str, out: &mut Vec<Value>) {
    let placement = match d.rng.u32(..10) {
        0 => json!({"nodeName": "node-2"}),
        1 => json!({"allNodes": true}),
        2 => json!({"nodeSelector": {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": "zone", "operator": "In", "values": ["a"]}]}]}}),
        _ => json!({"nodeName": "node-1"}),
    };
    let on_node = placement.get("nodeName").is_none_or(|n| n == "node-1");
    let mut specs: Vec<Map<String, Value>> = Vec::new();
    let device_slices = d.rng.usize(1..=2);
    for s in 0..device_slices {
        let devices: Vec<Value> = (0..d.rng.usize(1..=4))
            .map(|i| device(d, driver, &format!("dev-{s}-{i}")))
            .collect();
        let mut spec = Map::new();
        spec.insert("devices".into(), Value::Array(devices));
        specs.push(spec);
    }
    if d.chance(0.25) {
        // A parent device and its partitions, consuming one counter set.
        let set = "gpu-counters";
        let counters = |mem: u32, parts: u32| {
            json!([{"counterSet": set, "counters": {
                "memory": {"value": format!("{mem}Gi")},
                "slices": {"value": parts.to_string()},
            }}])
        };
        let mut devices = vec![json!({
            "name": "gpu-whole",
            "attributes": {"model": {"string": d.pick(MODELS)}, "mem": {"int": 40}},
            "capacity": {"memory": {"value": "40Gi"}},
            "consumesCounters": counters(40, 4),
        })];
        for (i, (mem, parts)) in [(10, 1), (10, 1), (20, 2), (20, 2)].into_iter().enumerate() {
            if d.chance(0.8) {
                devices.push(json!({
                    "name": format!("gpu-part-{i}"),
                    "attributes": {"model": {"string": "a100"}, "mem": {"int": mem}},
                    "capacity": {"memory": {"value": format!("{mem}Gi")}},
                    "consumesCounters": counters(mem, parts),
                }));
            }
        }
        // Partitions that are shared: their counters are consumed once, however many shares.
        for dev in &mut devices {
            if d.chance(0.2) {
                dev["allowMultipleAllocations"] = json!(true);
            }
        }
        if let Some(Value::Array(all)) = specs[0].get_mut("devices") {
            all.extend(devices);
        }
        let mut counters_slice = Map::new();
        counters_slice.insert(
            "sharedCounters".into(),
            json!([{"name": set, "counters": {
                "memory": {"value": "40Gi"},
                "slices": {"value": if d.chance(0.8) { "4" } else { "3" }},
            }}]),
        );
        specs.push(counters_slice);
    }
    // Node operations the kubelet skips for the pool's devices, and the attribute naming a
    // partition's type (which allocation does not read).
    let skip = match d.rng.u32(..12) {
        0 => Some(json!(["*"])),
        1 => Some(json!(["NodePrepareResources", "NodeUnprepareResources"])),
        2 => Some(json!(["NodeUnprepareResources"])),
        _ => None,
    };
    let partition_type = d.chance(0.1);
    let count = specs.len() + usize::from(d.chance(0.05));
    for (s, mut spec) in specs.into_iter().enumerate() {
        if on_node {
            for dev in spec
                .get("devices")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                if let Some(name) = dev.get("name").and_then(Value::as_str) {
                    let id = format!("{driver}/{pool}/{name}");
                    if dev.get("allowMultipleAllocations") == Some(&json!(true)) {
                        d.shareable.push(id.clone());
                    }
                    d.devices.push(id);
                }
            }
        }
        spec.insert("driver".into(), json!(driver));
        spec.insert(
            "pool".into(),
            json!({"name": pool, "generation": 1, "resourceSliceCount": count}),
        );
        if let Value::Object(p) = &placement {
            spec.extend(p.clone());
        }
        if let Some(skip) = &skip
            && spec.contains_key("devices")
        {
            spec.insert("skipNodeOperations".into(), skip.clone());
        }
        if partition_type {
            spec.insert(
                "partitionTypeAttribute".into(),
                json!(format!("{driver}/model")),
            );
        }
        out.push(json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": format!("{driver}-{pool}-{s}")},
            "spec": spec,
        }));
    }
}

/// Shares already allocated: none, one or two of some shareable devices, consuming some of
/// their capacities (or none, or a capacity the device does not have); rarely one of a device
/// that does not allow multiple allocations (its driver republished it so).
fn shares(d: &mut Draw) -> Vec<Value> {
    let mut out = Vec::new();
    let mut share = |d: &mut Draw, device: &str| {
        let mut consumed = Map::new();
        if d.chance(0.6) {
            consumed.insert(
                "memory".into(),
                json!(d.pick(&["1Gi", "8Gi", "16Gi", "40Gi"])),
            );
        }
        if d.chance(0.6) {
            consumed.insert(
                "bandwidth".into(),
                json!(d.pick(&["1", "2", "5", "10", "500m"])),
            );
        }
        if d.chance(0.05) {
            consumed.insert("other".into(), json!("1"));
        }
        let mut entry = Map::new();
        entry.insert("device".into(), json!(device));
        if !consumed.is_empty() || d.chance(0.5) {
            entry.insert("consumedCapacity".into(), Value::Object(consumed));
        }
        out.push(Value::Object(entry));
    };
    for device in d.shareable.clone() {
        if d.chance(0.4) {
            for _ in 0..d.rng.usize(1..=2) {
                share(d, &device);
            }
        }
    }
    if !d.devices.is_empty() && d.chance(0.03) {
        let device = d.devices[d.rng.usize(..d.devices.len())].clone();
        share(d, &device);
    }
    out
}

/// Usually none; sometimes one or two DeviceTaintRules selecting a driver, a pool or one
/// device (or nothing at all), with an effect that blocks allocation or not.
fn taint_rules(d: &mut Draw) -> Vec<Value> {
    if !d.chance(0.15) {
        return Vec::new();
    }
    (0..d.rng.usize(1..=2))
        .map(|i| {
            let mut selector = Map::new();
            if d.chance(0.8) {
                let driver = if d.chance(0.9) {
                    d.driver()
                } else {
                    "driver-c"
                };
                selector.insert("driver".into(), json!(driver));
            }
            if d.chance(0.5) {
                selector.insert("pool".into(), json!(d.pick(&["pool-0", "pool-1"])));
            }
            if d.chance(0.4) && !d.devices.is_empty() {
                let id = &d.devices[d.rng.usize(..d.devices.len())];
                let name = id.rsplit('/').next().unwrap_or_default().to_string();
                selector.insert("device".into(), json!(name));
            }
            let mut spec = Map::new();
            if d.chance(0.95) {
                spec.insert("deviceSelector".into(), Value::Object(selector));
            }
            spec.insert(
                "taint".into(),
                json!({"key": d.pick(&["k1", "k2", "k3"]), "value": "v",
                       "effect": d.pick(&["NoSchedule", "NoExecute", "None"])}),
            );
            json!({
                "apiVersion": "resource.k8s.io/v1",
                "kind": "DeviceTaintRule",
                "metadata": {"name": format!("rule-{i}")},
                "spec": spec,
            })
        })
        .collect()
}

fn device(d: &mut Draw, driver: &str, name: &str) -> Value {
    let mut attrs = Map::new();
    if d.chance(0.9) {
        attrs.insert("model".into(), json!({"string": d.pick(MODELS)}));
    }
    if d.chance(0.9) {
        attrs.insert("mem".into(), json!({"int": d.pick(&[16, 40, 80])}));
    }
    if d.chance(0.5) {
        attrs.insert("healthy".into(), json!({"bool": d.chance(0.8)}));
    }
    if d.chance(0.5) {
        attrs.insert(
            "version".into(),
            json!({"version": d.pick(&["1.2.0", "2.0.0", "2.1.0-rc.1"])}),
        );
    }
    if d.chance(0.6) {
        attrs.insert(
            format!("{STANDARD}/pcieRoot"),
            json!({"string": d.pick(PCIE)}),
        );
    }
    if d.chance(0.3) {
        attrs.insert(format!("{driver}/numa"), json!({"int": d.pick(&[0, 1])}));
    }
    if d.lists {
        if d.chance(0.6) {
            let ports: Vec<&str> = PORTS.iter().copied().filter(|_| d.chance(0.5)).collect();
            let ports = if ports.is_empty() { vec!["p0"] } else { ports };
            attrs.insert("ports".into(), json!({"strings": ports}));
        }
        if d.chance(0.3) {
            attrs.insert("lanes".into(), json!({"ints": [d.pick(&[4, 8]), 16]}));
        }
    }
    let mut dev = Map::new();
    dev.insert("name".into(), json!(name));
    dev.insert("attributes".into(), Value::Object(attrs));
    let mut capacity = Map::new();
    capacity.insert(
        "memory".into(),
        json!({"value": d.pick(&["16Gi", "40Gi", "80Gi"])}),
    );
    if d.chance(0.15) {
        dev.insert("allowMultipleAllocations".into(), json!(true));
        let policy = match d.rng.u32(..4) {
            0 => json!({"default": "2", "validRange": {"min": "1", "max": "10", "step": "1"}}),
            1 => json!({"default": "5", "validValues": ["2", "5", "10"]}),
            // A fractional range (DRAFractionalCapacityRange, on by default from 1.37).
            2 => {
                json!({"default": "500m", "validRange": {"min": "250m", "max": "4", "step": "250m"}})
            }
            _ => Value::Null,
        };
        let mut bw = Map::new();
        bw.insert("value".into(), json!("10"));
        if !policy.is_null() {
            bw.insert("requestPolicy".into(), policy);
        }
        capacity.insert("bandwidth".into(), Value::Object(bw));
    }
    dev.insert("capacity".into(), Value::Object(capacity));
    if d.chance(0.1) {
        dev.insert(
            "taints".into(),
            json!([{"key": d.pick(&["k1", "k2"]), "value": "v",
                    "effect": d.pick(&["NoSchedule", "NoExecute"])}]),
        );
    }
    if d.chance(0.05) {
        dev.insert("bindingConditions".into(), json!(["ready"]));
        dev.insert("bindingFailureConditions".into(), json!(["failed"]));
        if d.chance(0.5) {
            dev.insert("bindsToNode".into(), json!(true));
        }
    }
    Value::Object(dev)
}

fn classes(d: &mut Draw) -> Vec<Value> {
    let mut out = Vec::new();
    for driver in d.drivers.clone() {
        let letter = &driver["driver-".len()..];
        let mut spec = json!({"selectors": [{"cel": {"expression":
            format!("device.driver == \"{driver}\"")}}]});
        if d.chance(0.2) {
            spec["config"] = json!([{"opaque": {"driver": driver,
                "parameters": {"from": format!("class-{letter}")}}}]);
        }
        out.push(class(&format!("class-{letter}"), spec));
    }
    out.push(class("class-any", json!({})));
    let expr = format!("device.driver == \"driver-a\" && {}", atom(d, "driver-a"));
    out.push(class(
        "class-picky",
        json!({"selectors": [{"cel": {"expression": expr}}]}),
    ));
    out
}

fn class(name: &str, spec: Value) -> Value {
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
           "metadata": {"name": name}, "spec": spec})
}

/// A class for a request, and the driver whose devices it selects.
fn class_name(d: &mut Draw) -> (String, &'static str) {
    match d.rng.u32(..10) {
        0 => ("class-any".into(), d.driver()),
        1 => ("class-picky".into(), "driver-a"),
        _ => {
            let driver = d.driver();
            (format!("class-{}", &driver["driver-".len()..]), driver)
        }
    }
}

/// One request body (exact or a first-available subrequest).
fn request_body(d: &mut Draw, top: bool) -> Value {
    let mut r = Map::new();
    let (class, driver) = class_name(d);
    r.insert("deviceClassName".into(), json!(class));
    if d.chance(0.1) {
        r.insert("allocationMode".into(), json!("All"));
    } else {
        if d.chance(0.5) {
            r.insert("allocationMode".into(), json!("ExactCount"));
        }
        r.insert("count".into(), json!(if d.chance(0.75) { 1 } else { 2 }));
    }
    let n = match d.rng.u32(..20) {
        0..10 => 0,
        10..17 => 1,
        _ => 2,
    };
    let selectors: Vec<Value> = (0..n)
        .map(|_| json!({"cel": {"expression": selector(d, driver)}}))
        .collect();
    if !selectors.is_empty() {
        r.insert("selectors".into(), Value::Array(selectors));
    }
    if d.chance(0.15) {
        let mut t = json!({"key": d.pick(&["k1", "k2"])});
        if d.chance(0.5) {
            t["operator"] = json!("Exists");
        } else {
            t["value"] = json!("v");
        }
        if d.chance(0.5) {
            t["effect"] = json!(d.pick(&["NoSchedule", "NoExecute"]));
        }
        r.insert("tolerations".into(), json!([t]));
    }
    if d.chance(0.15) {
        r.insert(
            "capacity".into(),
            json!({"requests": {
                // Bare, or qualified with the driver's domain (which results name as the
                // device does).
                d.pick(&["bandwidth", "bandwidth", "driver-a/bandwidth", "driver-b/bandwidth"]):
                    d.pick(&["1", "3", "5", "11", "700m", "1300m"])
            }}),
        );
    }
    if top && d.chance(0.05) {
        r.insert("adminAccess".into(), json!(true));
    }
    Value::Object(r)
}

fn claim(d: &mut Draw, index: usize) -> Value {
    let names: Vec<String> = (0..d.rng.usize(1..=2))
        .map(|i| format!("req-{i}"))
        .collect();
    let requests: Vec<Value> = names
        .iter()
        .map(|name| {
            if d.chance(0.2) {
                let subs: Vec<Value> = (0..d.rng.usize(2..=3))
                    .map(|s| {
                        let mut body = request_body(d, false);
                        body["name"] = json!(format!("sub-{s}"));
                        body
                    })
                    .collect();
                json!({"name": name, "firstAvailable": subs})
            } else {
                json!({"name": name, "exactly": request_body(d, true)})
            }
        })
        .collect();
    let mut devices = json!({"requests": requests});
    let mut constraints = Vec::new();
    if d.chance(0.3) {
        let attribute = match d.rng.u32(..4) {
            0 => format!("{STANDARD}/pcieRoot"),
            1 => "driver-a/numa".to_string(),
            2 if d.lists => "driver-a/ports".to_string(),
            _ => "driver-a/model".to_string(),
        };
        let kind = if d.chance(0.3) {
            "distinctAttribute"
        } else {
            "matchAttribute"
        };
        let mut c = json!({ kind: attribute });
        if names.len() > 1 && d.chance(0.5) {
            c["requests"] = json!([names[0]]);
        }
        constraints.push(c);
    }
    if !constraints.is_empty() {
        devices["constraints"] = Value::Array(constraints);
    }
    if d.chance(0.1) {
        let mut c = json!({"opaque": {"driver": "driver-a", "parameters": {"from": "claim"}}});
        if d.chance(0.5) {
            c["requests"] = json!([names[0]]);
        }
        devices["config"] = json!([c]);
    }
    json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": format!("claim-{index}"), "namespace": "default"},
        "spec": {"devices": devices},
    })
}

/// A selector: atoms joined by `&&`, `||`, `!` and `?:`, most about the devices of the
/// request's class (`driver`) and guarded by a test of the driver they read.
fn selector(d: &mut Draw, driver: &'static str) -> String {
    expr(d, driver, 2)
}

fn expr(d: &mut Draw, class_driver: &'static str, depth: u32) -> String {
    if depth == 0 || d.chance(0.5) {
        let driver = if d.chance(0.85) {
            class_driver
        } else {
            d.driver()
        };
        let a = atom(d, driver);
        return if d.chance(0.8) {
            format!("(device.driver == \"{driver}\" && {a})")
        } else {
            a
        };
    }
    let sub = |d: &mut Draw| expr(d, class_driver, depth - 1);
    match d.rng.u32(..4) {
        0 => format!("({} && {})", sub(d), sub(d)),
        1 => format!("({} || {})", sub(d), sub(d)),
        2 => format!("!{}", sub(d)),
        _ => format!("({} ? {} : {})", sub(d), sub(d), sub(d)),
    }
}

/// One comparison over the `device` variable of `driver`'s devices; most that read an
/// attribute first ask whether the device has it (reading a missing one is an error, which
/// ends the whole allocation).
fn atom(d: &mut Draw, driver: &str) -> String {
    let attrs = format!("device.attributes[\"{driver}\"]");
    let model = d.pick(MODELS);
    let n = if d.lists { 17 } else { 13 };
    let (key, text) = match d.rng.u32(..n) {
        0 => ("model", format!("{attrs}.model == \"{model}\"")),
        1 => ("mem", format!("{attrs}.mem >= {}", d.pick(&[16, 40, 80]))),
        2 => ("model", format!("{attrs}.model in [\"a100\", \"{model}\"]")),
        3 => (
            "model",
            format!(
                "{attrs}.model.startsWith(\"{}\")",
                d.pick(&["a", "h", "l4"])
            ),
        ),
        4 => ("model", format!("{attrs}.model.matches(\"^[ah]\")")),
        5 => return format!("\"model\" in {attrs}"),
        6 => (
            "",
            format!(
                "device.capacity[\"{driver}\"].memory.compareTo(quantity(\"{}\")) >= 0",
                d.pick(&["16Gi", "40Gi", "41Gi"])
            ),
        ),
        7 => (
            "",
            format!("device.capacity[\"{driver}\"].memory.isGreaterThan(quantity(\"20Gi\"))"),
        ),
        8 => (
            "version",
            format!(
                "{attrs}.version.isGreaterThan(semver(\"{}\"))",
                d.pick(&["1.5.0", "2.0.0"])
            ),
        ),
        9 => {
            return format!(
                "(\"pcieRoot\" in device.attributes[\"{STANDARD}\"] && \
                 device.attributes[\"{STANDARD}\"].pcieRoot == \"{}\")",
                d.pick(PCIE)
            );
        }
        10 => return "device.allowMultipleAllocations".to_string(),
        11 => ("healthy", format!("{attrs}.healthy")),
        12 => {
            return format!(
                "cel.bind(a, {attrs}, has(a.mem) && a.mem > {})",
                d.pick(&[16, 40])
            );
        }
        13 => (
            "ports",
            format!("{attrs}.ports.includes(\"{}\")", d.pick(PORTS)),
        ),
        14 => (
            "ports",
            format!("{attrs}.ports.exists(p, p == \"{}\")", d.pick(PORTS)),
        ),
        15 => ("lanes", format!("size({attrs}.lanes) > 1")),
        _ => ("ports", format!("\"{}\" in {attrs}.ports", d.pick(PORTS))),
    };
    if !key.is_empty() && d.chance(0.85) {
        format!("(\"{key}\" in {attrs} && {text})")
    } else {
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_drawn_scenario_loads_and_a_seed_draws_the_same_one() {
        for seed in 0..300 {
            let value = scenario(seed);
            assert_eq!(value, scenario(seed), "seed {seed}");
            if let Err(e) = parse(&value) {
                panic!("seed {seed}: {e:#}\n{value}");
            }
        }
    }

    #[test]
    fn shrinking_removes_one_part_at_a_time() {
        let v = json!({"a": [1, 2], "b": {"c": 3, "name": "x"}});
        let b = json!({"c": 3, "name": "x"});
        assert_eq!(without_nth(&v, 0), Some(json!({"b": b})));
        assert_eq!(without_nth(&v, 1), Some(json!({"a": [2], "b": b})));
        assert_eq!(without_nth(&v, 2), Some(json!({"a": [1], "b": b})));
        assert_eq!(without_nth(&v, 3), Some(json!({"a": [1, 2]})));
        assert_eq!(
            without_nth(&v, 4),
            Some(json!({"a": [1, 2], "b": {"name": "x"}}))
        );
        assert_eq!(without_nth(&v, 5), None, "a required field stays");
    }
}
