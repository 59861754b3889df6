//! Whether one device can serve a request: consumable capacity (the request rounded by the
//! device's policy, against what earlier shares took) and taints the request does not tolerate.

use kubedev_core::Quantity;
use smallvec::SmallVec;

use crate::api::DeviceToleration;
use crate::model::NodeDevice;

/// What one allocation consumes of each capacity of a device (same order as
/// `NodeDevice::capacity`); devices mostly have one or two capacities.
pub(crate) type Consumption = SmallVec<[Quantity; 2]>;

/// Whether a capacity request fits a device.
#[derive(Debug)]
pub(crate) enum CapFit {
    /// Consumption per device capacity.
    Fits(Consumption),
    NoFit,
}

fn ceil_int(q: &Quantity) -> Result<i64, String> {
    whole(q, q.value())
}

/// `value`, the whole value of `q` as [`Quantity::value`] gives it, or the error that `q`
/// does not fit an `i64`.
fn whole(q: &Quantity, value: Option<i64>) -> Result<i64, String> {
    value.ok_or_else(|| format!("quantity {q} does not fit an int64"))
}

/// The consumption of one capacity: the request rounded by the policy, or the policy's
/// default, or the whole capacity.
fn consumed_amount(
    requested: Option<&Quantity>,
    total: &Quantity,
    policy: Option<&crate::model::CapacityPolicy>,
) -> Result<Quantity, String> {
    let Some(req) = requested else {
        return Ok(policy.and_then(|p| p.default).unwrap_or(*total));
    };
    let Some(p) = policy else {
        return Ok(*req);
    };
    if let Some(r) = &p.range
        && let Some(min) = &r.min
    {
        if req < min {
            return Ok(*min);
        }
        let Some(step) = &r.step else {
            return Ok(*req);
        };
        if let Some((min_milli, step_milli)) = r.milli {
            return round_up_milli(req, min_milli, step_milli, step.format());
        }
        let (ri, si, mi) = (
            ceil_int(req)?,
            whole(step, r.step_value)?,
            whole(min, r.min_value)?,
        );
        if si <= 0 {
            return Ok(*req);
        }
        let v = round_up_to_step(ri, mi, si).ok_or_else(|| {
            format!("capacity request {req} cannot be rounded up to the next step")
        })?;
        return Ok(Quantity::from_i64(v, step.format()));
    }
    if !p.valid_values.is_empty() {
        for v in &p.valid_values {
            if req <= v {
                return Ok(*v);
            }
        }
    }
    Ok(*req)
}

/// `value` rounded up to `min + n * step` (`step` positive), or `None` past `i64`.
fn round_up_to_step(value: i64, min: i64, step: i64) -> Option<i64> {
    let added = value - min;
    let mut n = added / step;
    if added % step != 0 {
        n += 1;
    }
    n.checked_mul(step)?.checked_add(min)
}

/// [`consumed_amount`]'s rounding up to the next step in thousandths: the value prints as a
/// whole number when it is one, in the step's format.
fn round_up_milli(
    req: &Quantity,
    min: i64,
    step: i64,
    format: kubedev_core::Format,
) -> Result<Quantity, String> {
    let not_representable =
        || format!("capacity request {req} cannot be rounded up to the next step");
    let requested = crate::model::exact_milli(req)
        .ok_or_else(|| format!("capacity request {req} is not a whole number of thousandths"))?;
    let v = round_up_to_step(requested, min, step).ok_or_else(not_representable)?;
    if v % 1000 == 0 {
        Ok(Quantity::from_i64(v / 1000, format))
    } else {
        Quantity::from_scaled(v, -3, format).map_err(|_| not_representable())
    }
}

fn violates_policy(consumed: &Quantity, policy: Option<&crate::model::CapacityPolicy>) -> bool {
    let Some(p) = policy else {
        return false;
    };
    if p.default.as_ref() == Some(consumed) {
        return false;
    }
    if let Some(r) = &p.range {
        if r.max.as_ref().is_some_and(|m| consumed > m) {
            return true;
        }
        if let Some((min, step)) = r.milli {
            return crate::model::exact_milli(consumed).is_none_or(|c| (c - min) % step != 0);
        }
        if r.step.is_some() {
            match (consumed.value(), r.step_value, r.min_value) {
                (Some(c), Some(s), Some(m)) if s != 0 => return (c - m) % s != 0,
                _ => return true,
            }
        }
        return false;
    }
    if !p.valid_values.is_empty() {
        return !p.valid_values.iter().any(|v| v == consumed);
    }
    false
}

/// The scheduler's capacity check for one device: resolves requested names (bare names
/// belong to the driver), computes the consumption of every capacity and checks the policy
/// and what earlier shares (`allocating`) already took.
pub(crate) fn capacity_fit(
    dev: &NodeDevice<'_>,
    requests: Option<&[(&str, Quantity)]>,
    allocating: Option<&[Quantity]>,
) -> Result<CapFit, String> {
    let mut consumed = Consumption::new();
    Ok(
        if fit(
            dev,
            requests,
            allocating,
            &dev.consumed_before,
            &mut consumed,
        )? {
            CapFit::Fits(consumed)
        } else {
            CapFit::NoFit
        },
    )
}

/// [`capacity_fit`] when only whether the request fits matters.
pub(crate) fn capacity_fits(
    dev: &NodeDevice<'_>,
    requests: Option<&[(&str, Quantity)]>,
    allocating: Option<&[Quantity]>,
) -> bool {
    if requests.is_none_or(<[_]>::is_empty)
        && allocating.is_none()
        && dev.consumed_before.is_empty()
        && dev.whole_fits()
    {
        // Each capacity is consumed whole, and nothing else took from it.
        return true;
    }
    matches!(
        fit(
            dev,
            requests,
            allocating,
            &dev.consumed_before,
            &mut Consumption::new()
        ),
        Ok(true)
    )
}

/// Whether the request fits the device's capacities as if nothing had taken from them (how
/// the scheduler picks the devices of an `All` request: one whose capacity existing shares
/// took stays among them, and the request then fails on it).
pub(crate) fn static_capacity_fits(
    dev: &NodeDevice<'_>,
    requests: Option<&[(&str, Quantity)]>,
) -> bool {
    if requests.is_none_or(<[_]>::is_empty) && dev.whole_fits() {
        return true;
    }
    matches!(
        fit(dev, requests, None, &[], &mut Consumption::new()),
        Ok(true)
    )
}

/// The check of [`capacity_fit`], with `earlier` what existing allocations took; the
/// consumption per capacity goes to `consumed` (empty on entry).
fn fit(
    dev: &NodeDevice<'_>,
    requests: Option<&[(&str, Quantity)]>,
    allocating: Option<&[Quantity]>,
    earlier: &[(&str, Quantity)],
    consumed: &mut Consumption,
) -> Result<bool, String> {
    let caps = dev.capacity();
    let requests = requests.unwrap_or(&[]);
    // The request per capacity (none without requests).
    let resolved_len = if requests.is_empty() { 0 } else { caps.len() };
    let mut resolved: SmallVec<[Option<Quantity>; 2]> = SmallVec::from_elem(None, resolved_len);
    for (name, q) in requests {
        let idx = caps
            .iter()
            .position(|c| c.key == *name)
            .or_else(|| match name.split_once('/') {
                Some((domain, id)) if domain == dev.driver() => {
                    caps.iter().position(|c| c.key == id)
                }
                Some(_) => None,
                None => caps.iter().position(|c| {
                    c.key.len() == dev.driver().len() + 1 + name.len()
                        && c.key.starts_with(dev.driver())
                        && c.key.ends_with(name)
                        && c.key.as_bytes()[dev.driver().len()] == b'/'
                }),
            });
        let Some(idx) = idx else {
            return Ok(false);
        };
        if resolved[idx].is_some() {
            return Err(format!("capacity {name} requested twice"));
        }
        resolved[idx] = Some(*q);
    }
    let amount = |i: usize| {
        let cap = &caps[i];
        consumed_amount(
            resolved.get(i).and_then(Option::as_ref),
            &cap.value,
            cap.policy.as_deref(),
        )
    };
    for (i, cap) in caps.iter().enumerate() {
        let c = amount(i)?;
        if c.sign() < 0 {
            return Err(format!("capacity {}: capacity value is negative", cap.key));
        }
        consumed.push(c);
    }
    for (i, (cap, &c)) in caps.iter().zip(consumed.iter()).enumerate() {
        if violates_policy(&c, cap.policy.as_deref()) {
            return Ok(false);
        }
        let mut total = c;
        if let Some(a) = allocating.and_then(|a| a.get(i)) {
            match total.checked_add(a) {
                Some(t) => total = t,
                None => return Ok(false),
            }
        }
        // What existing allocations took (named as the device lists the capacity, or
        // qualified with the driver's domain).
        for (name, q) in earlier {
            let same = *name == cap.key
                || name
                    .strip_prefix(dev.driver())
                    .and_then(|r| r.strip_prefix('/'))
                    .is_some_and(|id| id == cap.key)
                || cap
                    .key
                    .strip_prefix(dev.driver())
                    .and_then(|r| r.strip_prefix('/'))
                    .is_some_and(|id| id == *name);
            if same {
                match total.checked_add(q) {
                    Some(t) => total = t,
                    None => return Ok(false),
                }
            }
        }
        if total > cap.value {
            return Ok(false);
        }
    }
    Ok(true)
}

pub(crate) fn tolerates(t: &DeviceToleration, taint: &crate::api::DeviceTaint) -> bool {
    if !t.effect.is_empty() && t.effect != taint.effect {
        return false;
    }
    if !t.key.is_empty() && t.key != taint.key {
        return false;
    }
    match t.operator.as_str() {
        "" | "Equal" => t.value == taint.value,
        "Exists" => true,
        _ => false,
    }
}

pub(crate) fn taint_blocks(dev: &NodeDevice<'_>, tolerations: &[DeviceToleration]) -> bool {
    dev.taints()
        .any(|taint| !tolerations.iter().any(|t| tolerates(t, taint)))
}
