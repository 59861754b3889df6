//! CEL optional values: `optional.of`, `optional.none`, `optional.ofNonZeroValue`, `hasValue`,
//! `value`, `orValue` and `or`.

use std::sync::Arc;

use super::{Func, no_overload};
use crate::cel::meter::EvalError;
use crate::cel::value::Value;

/// Optional values.
pub(super) fn call(f: Func, args: &[Value]) -> Result<Value, EvalError> {
    use Func::*;
    let bad = |args: &[Value]| no_overload(f, args);
    let v = match (f, args) {
        (OptionalOf, [v]) => Value::Optional(Some(Arc::new(v.clone()))),
        (OptionalNone, []) => Value::Optional(None),
        (OptionalOfNonZero, [v]) => {
            if is_zero_value(v) {
                Value::Optional(None)
            } else {
                Value::Optional(Some(Arc::new(v.clone())))
            }
        }
        (HasValue, [Value::Optional(o)]) => Value::Bool(o.is_some()),
        (OptValue, [Value::Optional(o)]) => match o {
            Some(v) => (**v).clone(),
            None => return Err(EvalError::msg("optional.none() dereference")),
        },
        (OrValue, [Value::Optional(o), other]) => match o {
            Some(v) => (**v).clone(),
            None => other.clone(),
        },
        (OptOr, [Value::Optional(o), other @ Value::Optional(_)]) => match o {
            Some(_) => args[0].clone(),
            None => other.clone(),
        },
        _ => return Err(bad(args)),
    };
    Ok(v)
}

fn is_zero_value(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Bool(b) => !b,
        Value::Int(i) => *i == 0,
        Value::Uint(u) => *u == 0,
        Value::Double(d) => *d == 0.0,
        Value::String(s) => s.is_empty(),
        Value::Bytes(b) => b.is_empty(),
        Value::List(l) => l.is_empty(),
        Value::Map(m) => m.entries.is_empty(),
        _ => false,
    }
}
