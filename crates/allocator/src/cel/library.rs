//! The functions selectors may call: the CEL standard library subset that applies to device
//! data, the Kubernetes `quantity`, `semver`, `regex` and `lists` libraries, the string and
//! set extensions, and optional values.

use std::cmp::Ordering;
use std::sync::Arc;

use super::eval::{EvalError, Meter};
use super::numeric::{Quantity, Version};
use super::value::Value;

/// A resolved function.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Func {
    // standard
    Size,
    ToInt,
    ToUint,
    ToDouble,
    ToString,
    ToBytes,
    ToBool,
    Dyn,
    Contains,
    StartsWith,
    EndsWith,
    Matches,
    // Kubernetes quantity and semver
    Quantity,
    IsQuantity,
    Semver,
    IsSemver,
    CompareTo,
    IsGreaterThan,
    IsLessThan,
    QAdd,
    QSub,
    AsInteger,
    AsApproximateFloat,
    Sign,
    IsInteger,
    Major,
    Minor,
    Patch,
    // Kubernetes regex
    Find,
    FindAll,
    // strings extension
    CharAt,
    IndexOf,
    LastIndexOf,
    LowerAscii,
    UpperAscii,
    Replace,
    Split,
    Substring,
    Trim,
    Join,
    Reverse,
    StringsQuote,
    // lists
    IsSorted,
    Sum,
    Min,
    Max,
    Slice,
    Flatten,
    Distinct,
    Sort,
    // sets
    SetsContains,
    SetsEquivalent,
    SetsIntersects,
    // optional
    OptionalOf,
    OptionalNone,
    OptionalOfNonZero,
    HasValue,
    OptValue,
    OrValue,
    OptOr,
}

impl Func {
    /// Finds the function called `name` as a global (`member == false`) or member function
    /// with `argc` arguments (not counting the receiver).
    pub(crate) fn resolve(name: &str, member: bool, argc: usize) -> Option<Func> {
        use Func::*;
        let f = match (member, name, argc) {
            (false, "size", 1) | (true, "size", 0) => Size,
            (false, "int", 1) => ToInt,
            (false, "uint", 1) => ToUint,
            (false, "double", 1) => ToDouble,
            (false, "string", 1) => ToString,
            (false, "bytes", 1) => ToBytes,
            (false, "bool", 1) => ToBool,
            (false, "dyn", 1) => Dyn,
            (true, "contains", 1) => Contains,
            (true, "startsWith", 1) => StartsWith,
            (true, "endsWith", 1) => EndsWith,
            (false, "matches", 2) | (true, "matches", 1) => Matches,
            (false, "quantity", 1) => Quantity,
            (false, "isQuantity", 1) => IsQuantity,
            (false, "semver", 1 | 2) => Semver,
            (false, "isSemver", 1 | 2) => IsSemver,
            (true, "compareTo", 1) => CompareTo,
            (true, "isGreaterThan", 1) => IsGreaterThan,
            (true, "isLessThan", 1) => IsLessThan,
            (true, "add", 1) => QAdd,
            (true, "sub", 1) => QSub,
            (true, "asInteger", 0) => AsInteger,
            (true, "asApproximateFloat", 0) => AsApproximateFloat,
            (true, "sign", 0) => Sign,
            (true, "isInteger", 0) => IsInteger,
            (true, "major", 0) => Major,
            (true, "minor", 0) => Minor,
            (true, "patch", 0) => Patch,
            (true, "find", 1) => Find,
            (true, "findAll", 1 | 2) => FindAll,
            (true, "charAt", 1) => CharAt,
            (true, "indexOf", 1 | 2) => IndexOf,
            (true, "lastIndexOf", 1 | 2) => LastIndexOf,
            (true, "lowerAscii", 0) => LowerAscii,
            (true, "upperAscii", 0) => UpperAscii,
            (true, "replace", 2 | 3) => Replace,
            (true, "split", 1 | 2) => Split,
            (true, "substring", 1 | 2) => Substring,
            (true, "trim", 0) => Trim,
            (true, "join", 0 | 1) => Join,
            (true, "reverse", 0) => Reverse,
            (false, "strings.quote", 1) => StringsQuote,
            (true, "isSorted", 0) => IsSorted,
            (true, "sum", 0) => Sum,
            (true, "min", 0) => Min,
            (true, "max", 0) => Max,
            (true, "slice", 2) => Slice,
            (true, "flatten", 0 | 1) => Flatten,
            (true, "distinct", 0) => Distinct,
            (true, "sort", 0) => Sort,
            (false, "sets.contains", 2) => SetsContains,
            (false, "sets.equivalent", 2) => SetsEquivalent,
            (false, "sets.intersects", 2) => SetsIntersects,
            (false, "optional.of", 1) => OptionalOf,
            (false, "optional.none", 0) => OptionalNone,
            (false, "optional.ofNonZeroValue", 1) => OptionalOfNonZero,
            (true, "hasValue", 0) => HasValue,
            (true, "value", 0) => OptValue,
            (true, "orValue", 1) => OrValue,
            (true, "or", 1) => OptOr,
            _ => return None,
        };
        Some(f)
    }

    /// The static result type when it does not depend on the arguments.
    pub(crate) fn result_type(self) -> Option<&'static str> {
        use Func::*;
        Some(match self {
            Size | ToInt | CompareTo | Sign | AsInteger | CharAt | IndexOf | LastIndexOf
            | Major | Minor | Patch => match self {
                CharAt => "string",
                _ => "int",
            },
            ToUint => "uint",
            ToDouble | AsApproximateFloat => "double",
            ToString | LowerAscii | UpperAscii | Replace | Substring | Trim | Join
            | StringsQuote => "string",
            ToBytes => "bytes",
            ToBool | Contains | StartsWith | EndsWith | Matches | IsQuantity | IsSemver
            | IsGreaterThan | IsLessThan | IsInteger | IsSorted | SetsContains | SetsEquivalent
            | SetsIntersects | HasValue => "bool",
            Quantity | QAdd | QSub => "quantity",
            Semver => "semver",
            Split | FindAll | Flatten | Distinct | Sort | Slice => "list",
            OptionalOf | OptionalNone | OptionalOfNonZero | OptOr => "optional",
            _ => return None,
        })
    }

    /// The CEL name, for error messages.
    pub(crate) fn name(self) -> &'static str {
        use Func::*;
        match self {
            Size => "size",
            ToInt => "int",
            ToUint => "uint",
            ToDouble => "double",
            ToString => "string",
            ToBytes => "bytes",
            ToBool => "bool",
            Dyn => "dyn",
            Contains => "contains",
            StartsWith => "startsWith",
            EndsWith => "endsWith",
            Matches => "matches",
            Quantity => "quantity",
            IsQuantity => "isQuantity",
            Semver => "semver",
            IsSemver => "isSemver",
            CompareTo => "compareTo",
            IsGreaterThan => "isGreaterThan",
            IsLessThan => "isLessThan",
            QAdd => "add",
            QSub => "sub",
            AsInteger => "asInteger",
            AsApproximateFloat => "asApproximateFloat",
            Sign => "sign",
            IsInteger => "isInteger",
            Major => "major",
            Minor => "minor",
            Patch => "patch",
            Find => "find",
            FindAll => "findAll",
            CharAt => "charAt",
            IndexOf => "indexOf",
            LastIndexOf => "lastIndexOf",
            LowerAscii => "lowerAscii",
            UpperAscii => "upperAscii",
            Replace => "replace",
            Split => "split",
            Substring => "substring",
            Trim => "trim",
            Join => "join",
            Reverse => "reverse",
            StringsQuote => "strings.quote",
            IsSorted => "isSorted",
            Sum => "sum",
            Min => "min",
            Max => "max",
            Slice => "slice",
            Flatten => "flatten",
            Distinct => "distinct",
            Sort => "sort",
            SetsContains => "sets.contains",
            SetsEquivalent => "sets.equivalent",
            SetsIntersects => "sets.intersects",
            OptionalOf => "optional.of",
            OptionalNone => "optional.none",
            OptionalOfNonZero => "optional.ofNonZeroValue",
            HasValue => "hasValue",
            OptValue => "value",
            OrValue => "orValue",
            OptOr => "or",
        }
    }
}

fn no_overload(f: Func, args: &[Value]) -> EvalError {
    let types: Vec<&str> = args.iter().map(Value::type_name).collect();
    EvalError::msg(format!(
        "no such overload: {}({})",
        f.name(),
        types.join(", ")
    ))
}

/// One tenth of a length, rounded up: the cost of scanning text, as CEL charges it.
fn tenth(n: usize) -> u64 {
    (n as u64).div_ceil(10)
}

fn regex_for(pattern: &str, meter: &mut Meter) -> Result<Arc<regex::Regex>, EvalError> {
    meter.charge(tenth(pattern.len()))?;
    meter.regex(pattern)
}

fn int_arg(v: &Value) -> Option<i64> {
    match v {
        Value::Int(i) => Some(*i),
        _ => None,
    }
}

fn char_count(s: &str) -> usize {
    s.chars().count()
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

fn list_value(items: Vec<Value>) -> Value {
    Value::List(Arc::new(items))
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
        return Version::parse(s).map_err(|e| e.to_string());
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
    Version::parse(&format!("{}{rest}", parts.join("."))).map_err(|e| e.to_string())
}

/// Calls `f` with evaluated arguments (receiver first for member functions).
pub(crate) fn call(f: Func, args: Vec<Value>, meter: &mut Meter) -> Result<Value, EvalError> {
    use Func::*;
    meter.charge(1)?;
    let bad = |args: &[Value]| no_overload(f, args);
    let v = match (f, args.as_slice()) {
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
                _ => return Err(bad(&args)),
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

        (Quantity, [Value::String(s)]) => {
            meter.charge(tenth(s.len()))?;
            Value::Quantity(Arc::new(super::numeric::Quantity::parse(s).map_err(
                |e| EvalError::msg(format!("quantity({s:?}): invalid quantity: {e}")),
            )?))
        }
        (IsQuantity, [Value::String(s)]) => {
            meter.charge(tenth(s.len()))?;
            Value::Bool(super::numeric::Quantity::parse(s).is_ok())
        }
        (Semver, [Value::String(s), rest @ ..]) => {
            meter.charge(tenth(s.len()))?;
            let normalize = match rest {
                [] => false,
                [Value::Bool(b)] => *b,
                _ => return Err(bad(&args)),
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
                _ => return Err(bad(&args)),
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
            let b = quantity_operand(a, b).ok_or_else(|| bad(&args))?;
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
            let limit = match rest {
                [] => -1,
                [Value::Int(n)] => *n,
                _ => return Err(bad(&args)),
            };
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
            let limit = match rest {
                [] => -1,
                [Value::Int(n)] => *n,
                _ => return Err(bad(&args)),
            };
            let parts: Vec<Value> = match limit {
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
                        s.splitn(n as usize, &**sep).map(Value::str).collect()
                    }
                }
            };
            meter.charge(parts.len() as u64)?;
            list_value(parts)
        }
        (Substring, [Value::String(s), Value::Int(start), rest @ ..]) => {
            meter.charge(tenth(s.len()))?;
            let n = char_count(s) as i64;
            let end = match rest {
                [] => n,
                [Value::Int(e)] => *e,
                _ => return Err(bad(&args)),
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
        (Trim, [Value::String(s)]) => {
            meter.charge(tenth(s.len()))?;
            Value::str(s.trim())
        }
        (Join, [Value::List(l), rest @ ..]) => {
            let sep = match rest {
                [] => "",
                [Value::String(s)] => s,
                _ => return Err(bad(&args)),
            };
            let mut out = String::new();
            for (i, v) in l.iter().enumerate() {
                let Value::String(s) = v else {
                    return Err(bad(&args));
                };
                if i > 0 {
                    out.push_str(sep);
                }
                out.push_str(s);
            }
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

        (IsSorted, [Value::List(l)]) => {
            meter.charge(l.len() as u64)?;
            let mut sorted = true;
            for w in l.windows(2) {
                match w[0].compare(&w[1]) {
                    Some(Ordering::Greater) => sorted = false,
                    Some(_) => {}
                    None => return Err(bad(&args)),
                }
            }
            Value::Bool(sorted)
        }
        (Sum, [Value::List(l)]) => {
            meter.charge(l.len() as u64)?;
            list_sum(l).ok_or_else(|| bad(&args))??
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
                        (None, _) => return Err(bad(&args)),
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
                _ => return Err(bad(&args)),
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
                return Err(bad(&args));
            }
            list_value(out)
        }

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
        _ => return Err(bad(&args)),
    };
    Ok(v)
}

fn ordering_result(f: Func, o: Ordering) -> Value {
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
