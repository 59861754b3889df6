//! The CEL strings extension: `charAt`, `indexOf`, `lastIndexOf`, case, `replace`, `split`,
//! `substring`, `trim`, `join`, `reverse` and `strings.quote` (with the list overloads of
//! `indexOf`, `lastIndexOf` and `reverse`).

use super::{Func, char_count, list_value, no_overload, tenth};
use crate::cel::meter::{EvalError, Meter};
use crate::cel::value::Value;

/// `charAt`, `indexOf`, `lastIndexOf` (strings and lists) and `substring`: code-point positions.
pub(super) fn positions(f: Func, args: &[Value], meter: &mut Meter) -> Result<Value, EvalError> {
    use Func::*;
    let bad = |args: &[Value]| no_overload(f, args);
    let v = match (f, args) {
        (CharAt, [Value::String(s), Value::Int(i)]) => {
            meter.charge(tenth(s.len()))?;
            let n = char_count(s) as i64;
            if *i < 0 || *i > n {
                return Err(EvalError::msg(format!("index out of range: {i}")));
            }
            Value::str(
                &s.chars()
                    .nth(*i as usize)
                    .map(String::from)
                    .unwrap_or_default(),
            )
        }
        (IndexOf | LastIndexOf, [Value::String(s), Value::String(t), rest @ ..]) => {
            meter.charge(tenth(s.len()))?;
            string_index(f, s, t, rest.first().map(int_arg))?
        }
        (IndexOf | LastIndexOf, [Value::List(l), v]) => {
            meter.charge(l.len() as u64)?;
            let pos = if f == IndexOf {
                l.iter().position(|x| x.equals(v))
            } else {
                l.iter().rposition(|x| x.equals(v))
            };
            Value::Int(pos.map(|p| p as i64).unwrap_or(-1))
        }
        (Substring, [Value::String(s), Value::Int(start), rest @ ..]) => {
            meter.charge(tenth(s.len()))?;
            let n = char_count(s) as i64;
            let end = match rest {
                [] => n,
                [Value::Int(e)] => *e,
                _ => return Err(bad(args)),
            };
            if *start < 0 || *start > n || end < *start || end > n {
                return Err(EvalError::msg(format!(
                    "substring index out of range: [{start}:{end}] of length {n}"
                )));
            }
            let (Some(a), Some(b)) = (
                byte_offset(s, *start as usize),
                byte_offset(s, end as usize),
            ) else {
                return Err(EvalError::msg("substring index out of range"));
            };
            Value::str(&s[a..b])
        }
        _ => return Err(bad(args)),
    };
    Ok(v)
}

/// Case, `replace`, `split`, `trim`, `join`, `reverse` (strings and lists) and `strings.quote`.
pub(super) fn transforms(f: Func, args: &[Value], meter: &mut Meter) -> Result<Value, EvalError> {
    use Func::*;
    let bad = |args: &[Value]| no_overload(f, args);
    let v = match (f, args) {
        (LowerAscii, [Value::String(s)]) => {
            meter.charge(tenth(s.len()))?;
            Value::str(&s.to_ascii_lowercase())
        }
        (UpperAscii, [Value::String(s)]) => {
            meter.charge(tenth(s.len()))?;
            Value::str(&s.to_ascii_uppercase())
        }
        (
            Replace,
            [
                Value::String(s),
                Value::String(from),
                Value::String(to),
                rest @ ..,
            ],
        ) => {
            let limit = limit_arg(rest).ok_or_else(|| bad(args))?;
            let r = if limit < 0 {
                s.replace(&**from, to)
            } else {
                s.replacen(&**from, to, limit as usize)
            };
            meter.charge(tenth(s.len()) + tenth(r.len()))?;
            Value::str(&r)
        }
        (Split, [Value::String(s), Value::String(sep), rest @ ..]) => {
            meter.charge(tenth(s.len()))?;
            let limit = limit_arg(rest).ok_or_else(|| bad(args))?;
            let parts = split(s, sep, limit);
            meter.charge(parts.len() as u64)?;
            list_value(parts)
        }
        (Trim, [Value::String(s)]) => {
            meter.charge(tenth(s.len()))?;
            Value::str(s.trim())
        }
        (Join, [Value::List(l), rest @ ..]) => {
            let sep = match rest {
                [] => "",
                [Value::String(s)] => s,
                _ => return Err(bad(args)),
            };
            let out = join(l, sep).ok_or_else(|| bad(args))?;
            meter.charge(tenth(out.len()))?;
            Value::str(&out)
        }
        (Reverse, [Value::String(s)]) => {
            meter.charge(tenth(s.len()))?;
            Value::str(&s.chars().rev().collect::<String>())
        }
        (Reverse, [Value::List(l)]) => {
            meter.charge(l.len() as u64)?;
            list_value(l.iter().rev().cloned().collect())
        }
        (StringsQuote, [Value::String(s)]) => {
            meter.charge(tenth(s.len()))?;
            Value::str(&format!("{s:?}"))
        }
        _ => return Err(bad(args)),
    };
    Ok(v)
}

/// The optional count of `replace` and `split`: -1 (no limit) when absent, `None` when it is
/// not an int.
fn limit_arg(rest: &[Value]) -> Option<i64> {
    match rest {
        [] => Some(-1),
        [Value::Int(n)] => Some(*n),
        _ => None,
    }
}

/// `s.split(sep, limit)`: at most `limit` parts (none for 0, all for a negative limit), the
/// last holding the rest; an empty separator splits into code points.
fn split(s: &str, sep: &str, limit: i64) -> Vec<Value> {
    match limit {
        0 => Vec::new(),
        n if n < 0 => split_all(s, sep),
        n => {
            if sep.is_empty() {
                let mut v: Vec<Value> = Vec::new();
                let chars: Vec<char> = s.chars().collect();
                let n = n as usize;
                for (i, c) in chars.iter().enumerate() {
                    if i + 1 == n {
                        v.push(Value::str(&chars[i..].iter().collect::<String>()));
                        break;
                    }
                    v.push(Value::str(&c.to_string()));
                }
                v
            } else {
                s.splitn(n as usize, sep).map(Value::str).collect()
            }
        }
    }
}

/// The strings of `list` joined with `sep`; `None` when an element is not a string.
fn join(list: &[Value], sep: &str) -> Option<String> {
    let mut out = String::new();
    for (i, v) in list.iter().enumerate() {
        let Value::String(s) = v else {
            return None;
        };
        if i > 0 {
            out.push_str(sep);
        }
        out.push_str(s);
    }
    Some(out)
}

fn int_arg(v: &Value) -> Option<i64> {
    match v {
        Value::Int(i) => Some(*i),
        _ => None,
    }
}

/// Byte offset of the `idx`-th code point (or the end).
fn byte_offset(s: &str, idx: usize) -> Option<usize> {
    if idx == 0 {
        return Some(0);
    }
    let mut count = 0;
    for (b, _) in s.char_indices() {
        if count == idx {
            return Some(b);
        }
        count += 1;
    }
    if count == idx { Some(s.len()) } else { None }
}

fn string_index(f: Func, s: &str, t: &str, start: Option<Option<i64>>) -> Result<Value, EvalError> {
    let chars: Vec<char> = s.chars().collect();
    let needle: Vec<char> = t.chars().collect();
    let n = chars.len() as i64;
    let start = match start {
        None => None,
        Some(Some(i)) => Some(i),
        Some(None) => return Err(EvalError::msg("index must be an int")),
    };
    if let Some(i) = start
        && (i < 0 || i > n)
    {
        return Err(EvalError::msg(format!("index out of range: {i}")));
    }
    let fits =
        |i: usize| i + needle.len() <= chars.len() && chars[i..i + needle.len()] == needle[..];
    let found = if f == Func::IndexOf {
        let from = start.unwrap_or(0) as usize;
        (from..=chars.len()).find(|&i| fits(i))
    } else {
        let from = start.unwrap_or(n) as usize;
        (0..=from.min(chars.len())).rev().find(|&i| fits(i))
    };
    Ok(Value::Int(found.map(|i| i as i64).unwrap_or(-1)))
}

fn split_all(s: &str, sep: &str) -> Vec<Value> {
    if sep.is_empty() {
        s.chars().map(|c| Value::str(&c.to_string())).collect()
    } else {
        s.split(sep).map(Value::str).collect()
    }
}
