//! A device attribute as a CEL value: what `device.attributes[...]` reads, for selectors and
//! for the attributes constraints compare.

use crate::api::DeviceAttribute;
use crate::cel::{Interner, Value};

/// An attribute as the `device` variable has it: the first set field of int, bool, string,
/// version, then of the list fields (which the scheduler converts whether or not
/// `DRAListTypeAttributes` is on, from Kubernetes 1.37); none set or an invalid version is an
/// error.
pub(super) fn attribute_value(
    name: &str,
    a: &DeviceAttribute,
    interner: &mut Interner,
) -> Result<Value, String> {
    Ok(if let Some(i) = a.int {
        Value::Int(i)
    } else if let Some(b) = a.bool {
        Value::Bool(b)
    } else if let Some(s) = &a.string {
        Value::String(interner.str(s))
    } else if let Some(v) = &a.version {
        interner
            .version(v)
            .map_err(|e| format!("attribute {name}: parse semantic version: {e}"))?
    } else if let Some(list) = list_value(a, interner) {
        list.map_err(|e| format!("attribute {name}: parse semantic version: {e}"))?
    } else {
        return Err(format!("attribute {name}: unsupported attribute value"));
    })
}

/// A list-type attribute as a CEL list (`None` when it has no list value).
fn list_value(a: &DeviceAttribute, interner: &mut Interner) -> Option<Result<Value, String>> {
    let list = |items: Vec<Value>| Value::List(std::sync::Arc::new(items));
    Some(Ok(if let Some(l) = &a.ints {
        list(l.iter().map(|&i| Value::Int(i)).collect())
    } else if let Some(l) = &a.bools {
        list(l.iter().map(|&b| Value::Bool(b)).collect())
    } else if let Some(l) = &a.strings {
        list(l.iter().map(|s| Value::String(interner.str(s))).collect())
    } else if let Some(l) = &a.versions {
        let mut items = Vec::with_capacity(l.len());
        for v in l {
            match interner.version(v) {
                Ok(v) => items.push(v),
                Err(e) => return Some(Err(e)),
            }
        }
        list(items)
    } else {
        return None;
    }))
}
