//! The Kubernetes `lists` library (`isSorted`, `sum`, `min`, `max`, `slice`, `flatten`,
//! `distinct`, `sort`) and the CEL sets extension.

use std::cmp::Ordering;

use super::{Func, list_value, no_overload};
use crate::cel::meter::{EvalError, Meter};
use crate::cel::value::Value;

/// The lists library.
pub(super) fn call(f: Func, args: &[Value], meter: &mut Meter) -> Result<Value, EvalError> {
    use Func::*;
    let bad = |args: &[Value]| no_overload(f, args);
    let v = match (f, args) {
        (IsSorted, [Value::List(l)]) => {
            meter.charge(l.len() as u64)?;
            let mut sorted = true;
            for w in l.windows(2) {
                match w[0].compare(&w[1]) {
                    Some(Ordering::Greater) => sorted = false,
                    Some(_) => {}
                    None => return Err(bad(args)),
                }
            }
            Value::Bool(sorted)
        }
        (Sum, [Value::List(l)]) => {
            meter.charge(l.len() as u64)?;
            list_sum(l).ok_or_else(|| bad(args))??
        }
        (Min | Max, [Value::List(l)]) => {
            meter.charge(l.len() as u64)?;
            let mut best: Option<&Value> = None;
            for v in l.iter() {
                best = Some(match best {
                    None => v,
                    Some(b) => match (v.compare(b), f) {
                        (Some(Ordering::Less), Min) | (Some(Ordering::Greater), Max) => v,
                        (Some(_), _) => b,
                        (None, _) => return Err(bad(args)),
                    },
                });
            }
            best.cloned()
                .ok_or_else(|| EvalError::msg(format!("{}: list is empty", f.name())))?
        }
        (Slice, [Value::List(l), Value::Int(a), Value::Int(b)]) => {
            if *a < 0 || *b < *a || *b as usize > l.len() {
                return Err(EvalError::msg(format!(
                    "slice index out of range: [{a}:{b}]"
                )));
            }
            meter.charge((*b - *a) as u64)?;
            list_value(l[*a as usize..*b as usize].to_vec())
        }
        (Flatten, [Value::List(l), rest @ ..]) => {
            let depth = match rest {
                [] => 1,
                [Value::Int(d)] if *d >= 0 => *d,
                _ => return Err(bad(args)),
            };
            let mut out = Vec::new();
            flatten_into(l, depth, &mut out, meter)?;
            list_value(out)
        }
        (Distinct, [Value::List(l)]) => {
            meter.charge((l.len() as u64).saturating_mul(l.len() as u64))?;
            let mut out: Vec<Value> = Vec::new();
            for v in l.iter() {
                if !out.iter().any(|x| x.equals(v)) {
                    out.push(v.clone());
                }
            }
            list_value(out)
        }
        (Sort, [Value::List(l)]) => {
            meter.charge(
                (l.len() as u64).saturating_mul(64 - (l.len() as u64).leading_zeros() as u64),
            )?;
            let mut out = l.to_vec();
            let mut failed = false;
            out.sort_by(|a, b| {
                a.compare(b).unwrap_or_else(|| {
                    failed = true;
                    Ordering::Equal
                })
            });
            if failed {
                return Err(bad(args));
            }
            list_value(out)
        }
        _ => return Err(bad(args)),
    };
    Ok(v)
}

/// DRA's `x.includes(v)` (Kubernetes 1.36, for list-type attributes): on a list, whether some
/// item equals `v`; on any other value, whether it equals `v`. Values of different types are
/// unequal, not an error.
pub(super) fn includes(args: &[Value], meter: &mut Meter) -> Result<Value, EvalError> {
    let [target, v] = args else {
        return Err(no_overload(Func::Includes, args));
    };
    Ok(Value::Bool(match target {
        Value::List(items) => {
            meter.charge(items.len() as u64)?;
            items.iter().any(|x| x.equals(v))
        }
        other => other.equals(v),
    }))
}

/// The sets extension: `sets.contains`, `sets.equivalent`, `sets.intersects`.
pub(super) fn sets(f: Func, args: &[Value], meter: &mut Meter) -> Result<Value, EvalError> {
    use Func::*;
    let bad = |args: &[Value]| no_overload(f, args);
    let v = match (f, args) {
        (SetsContains, [Value::List(a), Value::List(b)]) => {
            meter.charge((a.len() as u64).saturating_mul(b.len() as u64))?;
            Value::Bool(b.iter().all(|x| a.iter().any(|y| y.equals(x))))
        }
        (SetsEquivalent, [Value::List(a), Value::List(b)]) => {
            meter.charge((a.len() as u64).saturating_mul(b.len() as u64))?;
            Value::Bool(
                b.iter().all(|x| a.iter().any(|y| y.equals(x)))
                    && a.iter().all(|x| b.iter().any(|y| y.equals(x))),
            )
        }
        (SetsIntersects, [Value::List(a), Value::List(b)]) => {
            meter.charge((a.len() as u64).saturating_mul(b.len() as u64))?;
            Value::Bool(a.iter().any(|x| b.iter().any(|y| y.equals(x))))
        }
        _ => return Err(bad(args)),
    };
    Ok(v)
}

fn flatten_into(
    l: &[Value],
    depth: i64,
    out: &mut Vec<Value>,
    meter: &mut Meter,
) -> Result<(), EvalError> {
    for v in l {
        meter.charge(1)?;
        match v {
            Value::List(inner) if depth > 0 => flatten_into(inner, depth - 1, out, meter)?,
            other => out.push(other.clone()),
        }
    }
    Ok(())
}

fn list_sum(l: &[Value]) -> Option<Result<Value, EvalError>> {
    let mut acc: Option<Value> = None;
    for v in l {
        acc = Some(match (acc, v) {
            (None, Value::Int(_) | Value::Uint(_) | Value::Double(_)) => v.clone(),
            (Some(Value::Int(a)), Value::Int(b)) => match a.checked_add(*b) {
                Some(s) => Value::Int(s),
                None => return Some(Err(EvalError::msg("integer overflow"))),
            },
            (Some(Value::Uint(a)), Value::Uint(b)) => match a.checked_add(*b) {
                Some(s) => Value::Uint(s),
                None => return Some(Err(EvalError::msg("unsigned integer overflow"))),
            },
            (Some(Value::Double(a)), Value::Double(b)) => Value::Double(a + b),
            _ => return None,
        });
    }
    Some(Ok(acc.unwrap_or(Value::Int(0))))
}
