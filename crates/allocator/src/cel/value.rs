//! CEL runtime values.

use std::cmp::Ordering;
use std::fmt;
use std::sync::Arc;

use super::numeric::{Quantity, Version};

/// A CEL value. Strings, lists and maps are shared, so cloning is cheap.
#[derive(Clone, Debug)]
pub(crate) enum Value {
    Null,
    Bool(bool),
    Int(i64),
    Uint(u64),
    Double(f64),
    String(Arc<str>),
    Bytes(Arc<[u8]>),
    List(Arc<Vec<Value>>),
    Map(Arc<MapValue>),
    Quantity(Arc<Quantity>),
    Semver(Arc<Version>),
    Optional(Option<Arc<Value>>),
}

/// A map. Small (device attribute maps have at most 32 entries), so a vector with linear
/// lookup is fastest. `missing_is_empty` gives the DRA behaviour for attribute and capacity
/// domains: looking up a domain the device does not have yields an empty map.
#[derive(Debug, Default)]
pub(crate) struct MapValue {
    pub(crate) entries: Vec<(Value, Value)>,
    pub(crate) missing_is_empty: bool,
}

impl MapValue {
    pub(crate) fn get(&self, key: &Value) -> Option<&Value> {
        self.entries
            .iter()
            .find(|(k, _)| key_equal(k, key))
            .map(|(_, v)| v)
    }

    pub(crate) fn get_str(&self, key: &str) -> Option<&Value> {
        self.entries.iter().find_map(|(k, v)| match k {
            Value::String(s) if &**s == key => Some(v),
            _ => None,
        })
    }
}

/// The empty map returned for unknown attribute / capacity domains.
pub(crate) fn empty_map() -> Value {
    thread_local! {
        static EMPTY: Value = Value::Map(Arc::new(MapValue::default()));
    }
    EMPTY.with(Value::clone)
}

/// Map keys: numbers of different types with the same value are the same key.
fn key_equal(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::String(x), Value::String(y)) => x == y,
        (Value::Bool(x), Value::Bool(y)) => x == y,
        _ => match (numeric(a), numeric(b)) {
            (Some(x), Some(y)) => num_cmp(x, y) == Some(Ordering::Equal),
            _ => false,
        },
    }
}

#[derive(Clone, Copy)]
pub(crate) enum Num {
    I(i64),
    U(u64),
    D(f64),
}

pub(crate) fn numeric(v: &Value) -> Option<Num> {
    match v {
        Value::Int(i) => Some(Num::I(*i)),
        Value::Uint(u) => Some(Num::U(*u)),
        Value::Double(d) => Some(Num::D(*d)),
        _ => None,
    }
}

/// Compares numbers of any CEL numeric type exactly; `None` when a NaN is involved.
pub(crate) fn num_cmp(a: Num, b: Num) -> Option<Ordering> {
    match (a, b) {
        (Num::I(x), Num::I(y)) => Some(x.cmp(&y)),
        (Num::U(x), Num::U(y)) => Some(x.cmp(&y)),
        (Num::I(x), Num::U(y)) => Some(if x < 0 {
            Ordering::Less
        } else {
            (x as u64).cmp(&y)
        }),
        (Num::U(x), Num::I(y)) => Some(if y < 0 {
            Ordering::Greater
        } else {
            x.cmp(&(y as u64))
        }),
        (Num::D(x), Num::D(y)) => x.partial_cmp(&y),
        (Num::I(x), Num::D(y)) => cmp_i_d(x, y),
        (Num::D(x), Num::I(y)) => cmp_i_d(y, x).map(Ordering::reverse),
        (Num::U(x), Num::D(y)) => cmp_u_d(x, y),
        (Num::D(x), Num::U(y)) => cmp_u_d(y, x).map(Ordering::reverse),
    }
}

fn cmp_i_d(i: i64, d: f64) -> Option<Ordering> {
    if d.is_nan() {
        return None;
    }
    // Every i64 lies in [-2^63, 2^63); compare in f64 only when that is exact.
    if d < -9_223_372_036_854_775_808.0 {
        return Some(Ordering::Greater);
    }
    if d >= 9_223_372_036_854_775_808.0 {
        return Some(Ordering::Less);
    }
    let t = d.trunc();
    let ti = t as i64;
    match i.cmp(&ti) {
        Ordering::Equal => 0.0f64.partial_cmp(&(d - t)),
        o => Some(o),
    }
}

fn cmp_u_d(u: u64, d: f64) -> Option<Ordering> {
    if d.is_nan() {
        return None;
    }
    if d < 0.0 {
        return Some(Ordering::Greater);
    }
    if d >= 18_446_744_073_709_551_616.0 {
        return Some(Ordering::Less);
    }
    let t = d.trunc();
    let tu = t as u64;
    match u.cmp(&tu) {
        Ordering::Equal => 0.0f64.partial_cmp(&(d - t)),
        o => Some(o),
    }
}

impl Value {
    /// The CEL type name, as used in error messages.
    pub(crate) fn type_name(&self) -> &'static str {
        match self {
            Value::Null => "null_type",
            Value::Bool(_) => "bool",
            Value::Int(_) => "int",
            Value::Uint(_) => "uint",
            Value::Double(_) => "double",
            Value::String(_) => "string",
            Value::Bytes(_) => "bytes",
            Value::List(_) => "list",
            Value::Map(_) => "map",
            Value::Quantity(_) => "kubernetes.Quantity",
            Value::Semver(_) => "kubernetes.Semver",
            Value::Optional(_) => "optional_type",
        }
    }

    pub(crate) fn str(s: &str) -> Value {
        Value::String(Arc::from(s))
    }

    /// CEL equality (heterogeneous: values of different types are unequal, except numbers,
    /// which compare by value).
    pub(crate) fn equals(&self, other: &Value) -> bool {
        match (self, other) {
            (Value::Null, Value::Null) => true,
            (Value::Bool(a), Value::Bool(b)) => a == b,
            (Value::String(a), Value::String(b)) => a == b,
            (Value::Bytes(a), Value::Bytes(b)) => a == b,
            (Value::List(a), Value::List(b)) => {
                a.len() == b.len() && a.iter().zip(b.iter()).all(|(x, y)| x.equals(y))
            }
            (Value::Map(a), Value::Map(b)) => {
                a.entries.len() == b.entries.len()
                    && a.entries
                        .iter()
                        .all(|(k, v)| b.get(k).is_some_and(|w| v.equals(w)))
            }
            (Value::Quantity(a), Value::Quantity(b)) => a.cmp(b) == Ordering::Equal,
            (Value::Semver(a), Value::Semver(b)) => a.cmp_precedence(b) == Ordering::Equal,
            (Value::Optional(a), Value::Optional(b)) => match (a, b) {
                (None, None) => true,
                (Some(x), Some(y)) => x.equals(y),
                _ => false,
            },
            _ => match (numeric(self), numeric(other)) {
                (Some(x), Some(y)) => num_cmp(x, y) == Some(Ordering::Equal),
                _ => false,
            },
        }
    }

    /// Ordering for `<`, `<=`, `>`, `>=`: numbers across types, strings, bytes, bools.
    /// `None` when the operands cannot be ordered.
    pub(crate) fn compare(&self, other: &Value) -> Option<Ordering> {
        match (self, other) {
            (Value::String(a), Value::String(b)) => Some(a.cmp(b)),
            (Value::Bytes(a), Value::Bytes(b)) => Some(a.cmp(b)),
            (Value::Bool(a), Value::Bool(b)) => Some(a.cmp(b)),
            _ => match (numeric(self), numeric(other)) {
                (Some(x), Some(y)) => num_cmp(x, y),
                _ => None,
            },
        }
    }
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Null => f.write_str("null"),
            Value::Bool(b) => write!(f, "{b}"),
            Value::Int(i) => write!(f, "{i}"),
            Value::Uint(u) => write!(f, "{u}u"),
            Value::Double(d) => write!(f, "{d}"),
            Value::String(s) => write!(f, "{s:?}"),
            Value::Bytes(b) => write!(f, "b{:?}", String::from_utf8_lossy(b)),
            Value::List(l) => {
                f.write_str("[")?;
                for (i, v) in l.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{v}")?;
                }
                f.write_str("]")
            }
            Value::Map(m) => {
                f.write_str("{")?;
                for (i, (k, v)) in m.entries.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{k}: {v}")?;
                }
                f.write_str("}")
            }
            Value::Quantity(q) => write!(f, "quantity({:?})", q.to_string()),
            Value::Semver(v) => write!(f, "semver({:?})", v.to_string()),
            Value::Optional(None) => f.write_str("optional.none()"),
            Value::Optional(Some(v)) => write!(f, "optional.of({v})"),
        }
    }
}
