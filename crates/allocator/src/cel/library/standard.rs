//! The CEL standard functions selectors use: `size`, the type conversions, `dyn` and the string
//! tests (`contains`, `startsWith`, `endsWith`, `matches`).

use std::sync::Arc;

use super::{Func, char_count, no_overload, regex_for, tenth};
use crate::cel::meter::{EvalError, Meter};
use crate::cel::value::Value;

/// `size`, conversions, `dyn` and the string tests.
pub(super) fn call(f: Func, args: &[Value], meter: &mut Meter) -> Result<Value, EvalError> {
    use Func::*;
    let bad = |args: &[Value]| no_overload(f, args);
    let v = match (f, args) {
        (Size, [Value::String(s)]) => Value::Int(char_count(s) as i64),
        (Size, [Value::Bytes(b)]) => Value::Int(b.len() as i64),
        (Size, [Value::List(l)]) => Value::Int(l.len() as i64),
        (Size, [Value::Map(m)]) => Value::Int(m.entries.len() as i64),

        (ToInt, [Value::Int(i)]) => Value::Int(*i),
        (ToInt, [Value::Uint(u)]) => {
            Value::Int(i64::try_from(*u).map_err(|_| EvalError::msg("integer overflow"))?)
        }
        (ToInt, [Value::Double(d)]) => {
            if !d.is_finite() || *d <= -9.223_372_036_854_776e18 || *d >= 9.223_372_036_854_776e18 {
                return Err(EvalError::msg("integer overflow"));
            }
            Value::Int(d.trunc() as i64)
        }
        (ToInt, [Value::String(s)]) => Value::Int(
            s.parse()
                .map_err(|_| EvalError::msg(format!("cannot convert {s:?} to int")))?,
        ),
        (ToUint, [Value::Uint(u)]) => Value::Uint(*u),
        (ToUint, [Value::Int(i)]) => {
            Value::Uint(u64::try_from(*i).map_err(|_| EvalError::msg("unsigned integer overflow"))?)
        }
        (ToUint, [Value::Double(d)]) => {
            if !d.is_finite() || *d < 0.0 || *d >= 1.844_674_407_370_955_2e19 {
                return Err(EvalError::msg("unsigned integer overflow"));
            }
            Value::Uint(d.trunc() as u64)
        }
        (ToUint, [Value::String(s)]) => Value::Uint(
            s.parse()
                .map_err(|_| EvalError::msg(format!("cannot convert {s:?} to uint")))?,
        ),
        (ToDouble, [Value::Double(d)]) => Value::Double(*d),
        (ToDouble, [Value::Int(i)]) => Value::Double(*i as f64),
        (ToDouble, [Value::Uint(u)]) => Value::Double(*u as f64),
        (ToDouble, [Value::String(s)]) => Value::Double(
            s.parse()
                .map_err(|_| EvalError::msg(format!("cannot convert {s:?} to double")))?,
        ),
        (ToString, [Value::String(s)]) => Value::String(s.clone()),
        (ToString, [Value::Int(i)]) => Value::str(&i.to_string()),
        (ToString, [Value::Uint(u)]) => Value::str(&u.to_string()),
        (ToString, [Value::Double(d)]) => Value::str(&format_double(*d)),
        (ToString, [Value::Bool(b)]) => Value::str(if *b { "true" } else { "false" }),
        (ToString, [Value::Bytes(b)]) => Value::str(
            std::str::from_utf8(b).map_err(|_| EvalError::msg("invalid UTF-8 in bytes"))?,
        ),
        (ToString, [Value::Quantity(q)]) => Value::str(&q.to_string()),
        (ToString, [Value::Semver(v)]) => Value::str(&v.to_string()),
        (ToBytes, [Value::Bytes(b)]) => Value::Bytes(b.clone()),
        (ToBytes, [Value::String(s)]) => Value::Bytes(Arc::from(s.as_bytes())),
        (ToBool, [Value::Bool(b)]) => Value::Bool(*b),
        (ToBool, [Value::String(s)]) => Value::Bool(match &**s {
            "1" | "t" | "true" | "TRUE" | "True" => true,
            "0" | "f" | "false" | "FALSE" | "False" => false,
            _ => return Err(EvalError::msg(format!("cannot convert {s:?} to bool"))),
        }),
        (Dyn, [v]) => v.clone(),

        (Contains, [Value::String(s), Value::String(t)]) => {
            meter.charge(tenth(s.len()))?;
            Value::Bool(s.contains(&**t))
        }
        (StartsWith, [Value::String(s), Value::String(t)]) => {
            meter.charge(tenth(t.len()))?;
            Value::Bool(s.starts_with(&**t))
        }
        (EndsWith, [Value::String(s), Value::String(t)]) => {
            meter.charge(tenth(t.len()))?;
            Value::Bool(s.ends_with(&**t))
        }
        (Matches, [Value::String(s), Value::String(p)]) => {
            meter.charge(tenth(s.len()) * tenth(p.len()).max(1))?;
            Value::Bool(regex_for(p, meter)?.is_match(s))
        }
        _ => return Err(bad(args)),
    };
    Ok(v)
}

/// Doubles print as CEL prints them: integral values without a fraction keep no ".0"
/// only when they came from an integer; here we follow Go's `%v` shortest form.
fn format_double(d: f64) -> String {
    if d.is_nan() {
        "NaN".into()
    } else if d.is_infinite() {
        if d > 0.0 {
            "+Inf".into()
        } else {
            "-Inf".into()
        }
    } else {
        let s = format!("{d}");
        if s.contains('e') {
            s
        } else if d.abs() >= 1e21 {
            format!("{d:e}")
        } else {
            s
        }
    }
}
