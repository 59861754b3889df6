//! The Kubernetes CEL libraries for device data: `quantity` and `semver` (parsing, comparison,
//! arithmetic, accessors) and `regex` (`find`, `findAll`).

use std::cmp::Ordering;
use std::sync::Arc;

use super::{Func, list_value, no_overload, regex_for, tenth};
use crate::cel::meter::{EvalError, Meter};
use crate::cel::numeric::{Quantity, Version};
use crate::cel::value::Value;

/// The quantity and semver libraries: constructors, tests, comparisons, arithmetic, accessors.
pub(super) fn quantity_semver(
    f: Func,
    args: &[Value],
    meter: &mut Meter,
) -> Result<Value, EvalError> {
    use Func::*;
    let bad = |args: &[Value]| no_overload(f, args);
    let v = match (f, args) {
        (Quantity, [Value::String(s)]) => {
            meter.charge(tenth(s.len()))?;
            Value::Quantity(Arc::new(crate::cel::numeric::Quantity::parse(s).map_err(
                |e| {
                    EvalError::msg(format!(
                        "quantity({s:?}): invalid quantity: {}",
                        kubedev_core::echo::chain(&e)
                    ))
                },
            )?))
        }
        (IsQuantity, [Value::String(s)]) => {
            meter.charge(tenth(s.len()))?;
            Value::Bool(crate::cel::numeric::Quantity::parse(s).is_ok())
        }
        (Semver, [Value::String(s), rest @ ..]) => {
            meter.charge(tenth(s.len()))?;
            let normalize = match rest {
                [] => false,
                [Value::Bool(b)] => *b,
                _ => return Err(bad(args)),
            };
            Value::Semver(Arc::new(parse_semver(s, normalize).map_err(|e| {
                EvalError::msg(format!("semver({s:?}): invalid semver: {e}"))
            })?))
        }
        (IsSemver, [Value::String(s), rest @ ..]) => {
            meter.charge(tenth(s.len()))?;
            let normalize = match rest {
                [] => false,
                [Value::Bool(b)] => *b,
                _ => return Err(bad(args)),
            };
            Value::Bool(parse_semver(s, normalize).is_ok())
        }
        (CompareTo | IsGreaterThan | IsLessThan, [Value::Quantity(a), Value::Quantity(b)]) => {
            ordering_result(f, a.cmp(b))
        }
        (CompareTo | IsGreaterThan | IsLessThan, [Value::Semver(a), Value::Semver(b)]) => {
            ordering_result(f, a.cmp_precedence(b))
        }
        (QAdd | QSub, [Value::Quantity(a), b]) => {
            let b = quantity_operand(a, b).ok_or_else(|| bad(args))?;
            let r = if f == QAdd {
                a.checked_add(&b)
            } else {
                a.checked_sub(&b)
            };
            Value::Quantity(Arc::new(
                r.ok_or_else(|| EvalError::msg("quantity arithmetic overflow"))?,
            ))
        }
        (AsInteger, [Value::Quantity(q)]) => Value::Int(q.as_i64().ok_or_else(|| {
            EvalError::msg(format!(
                "cannot convert value to integer: quantity {q} is not an integer or overflows int64"
            ))
        })?),
        (AsApproximateFloat, [Value::Quantity(q)]) => Value::Double(q.as_approximate_f64()),
        (Sign, [Value::Quantity(q)]) => Value::Int(i64::from(q.sign())),
        (IsInteger, [Value::Quantity(q)]) => Value::Bool(q.is_integer()),
        (Major, [Value::Semver(v)]) => Value::Int(v.major() as i64),
        (Minor, [Value::Semver(v)]) => Value::Int(v.minor() as i64),
        (Patch, [Value::Semver(v)]) => Value::Int(v.patch() as i64),
        _ => return Err(bad(args)),
    };
    Ok(v)
}

/// The regex library: `find` and `findAll`.
pub(super) fn regex(f: Func, args: &[Value], meter: &mut Meter) -> Result<Value, EvalError> {
    use Func::*;
    let bad = |args: &[Value]| no_overload(f, args);
    let v = match (f, args) {
        (Find, [Value::String(s), Value::String(p)]) => {
            meter.charge(tenth(s.len()) * tenth(p.len()).max(1))?;
            let re = regex_for(p, meter)?;
            Value::str(re.find(s).map(|m| m.as_str()).unwrap_or(""))
        }
        (FindAll, [Value::String(s), Value::String(p), rest @ ..]) => {
            meter.charge(tenth(s.len()) * tenth(p.len()).max(1))?;
            let limit = match rest {
                [] => -1,
                [Value::Int(n)] => *n,
                _ => return Err(bad(args)),
            };
            let re = regex_for(p, meter)?;
            let mut out = Vec::new();
            for m in re.find_iter(s) {
                if limit >= 0 && out.len() as i64 >= limit {
                    break;
                }
                out.push(Value::str(m.as_str()));
            }
            meter.charge(out.len() as u64)?;
            list_value(out)
        }
        _ => return Err(bad(args)),
    };
    Ok(v)
}

/// The right operand of `add` / `sub`: a quantity, or an integer printed like the receiver.
fn quantity_operand(receiver: &Quantity, v: &Value) -> Option<Quantity> {
    match v {
        Value::Quantity(q) => Some(**q),
        Value::Int(i) => Some(Quantity::from_i64(*i, receiver.format())),
        _ => None,
    }
}

/// Parses a semantic version the way the Kubernetes `semver()` function does; with
/// `normalize`, a leading `v`, missing minor/patch parts and leading zeros are accepted.
fn parse_semver(s: &str, normalize: bool) -> Result<Version, String> {
    if !normalize {
        return Version::parse(s).map_err(|e| kubedev_core::echo::chain(&e));
    }
    let s = s.strip_prefix('v').unwrap_or(s);
    let split = s.find(['-', '+']).unwrap_or(s.len());
    let (core, rest) = s.split_at(split);
    let mut parts: Vec<String> = core
        .split('.')
        .map(|p| {
            let t = p.trim_start_matches('0');
            if t.is_empty() && !p.is_empty() {
                "0".to_string()
            } else {
                t.to_string()
            }
        })
        .collect();
    while parts.len() < 3 {
        parts.push("0".to_string());
    }
    Version::parse(&format!("{}{rest}", parts.join("."))).map_err(|e| kubedev_core::echo::chain(&e))
}

/// What `compareTo`, `isGreaterThan` or `isLessThan` (`f`) answers for ordering `o`.
pub(crate) fn ordering_result(f: Func, o: Ordering) -> Value {
    match f {
        Func::IsGreaterThan => Value::Bool(o == Ordering::Greater),
        Func::IsLessThan => Value::Bool(o == Ordering::Less),
        _ => Value::Int(match o {
            Ordering::Less => -1,
            Ordering::Equal => 0,
            Ordering::Greater => 1,
        }),
    }
}
