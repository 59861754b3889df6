//! The checker of a scenario's allocation results against every rule: selectors, request
//! counts, constraints, device use (admin access and shareable devices aside), counters and
//! capacity.

use std::collections::{BTreeMap, HashMap};

use kubedev_allocator::MAX_DEVICES_PER_CLAIM;
use kubedev_allocator::api::*;
use kubedev_allocator::cel::{self, AttributeValue, DeviceContext};
use kubedev_core::{Quantity, Version};

use super::{DRIVER, Generated};

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
pub(super) fn check(g: &Generated, results: &[AllocationResult]) -> Result<(), String> {
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
    let key = (r.pool.to_string(), r.device.to_string());
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
                let (_, dev) = devices[&(r.pool.to_string(), r.device.to_string())];
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
