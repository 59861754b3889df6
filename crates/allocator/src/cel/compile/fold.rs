//! What the compiler works out before any device is seen: literals, direct device entry
//! lookups and calls on literals.

use std::sync::Arc;

use cel::common::ast::LiteralValue;

use crate::cel::CompileError;
use crate::cel::library::Func;
use crate::cel::meter::build_regex;
use crate::cel::numeric::{Quantity, Version};
use crate::cel::tree::{DeviceField, Node};
use crate::cel::value::Value;

/// The value a literal is.
pub(super) fn literal(l: &LiteralValue) -> Value {
    match l {
        LiteralValue::Boolean(b) => Value::Bool(*b.inner()),
        LiteralValue::Bytes(b) => Value::Bytes(Arc::from(b.inner())),
        LiteralValue::Double(d) => Value::Double(*d.inner()),
        LiteralValue::Int(i) => Value::Int(*i.inner()),
        LiteralValue::Null => Value::Null,
        LiteralValue::String(s) => Value::str(s.inner()),
        LiteralValue::UInt(u) => Value::Uint(*u.inner()),
    }
}

/// `device.attributes["d"]["id"]`, `device.attributes["d"].id` (and capacity) become one
/// direct lookup.
pub(super) fn fold_device_entry(node: Node) -> Node {
    let (outer, id) = match node {
        Node::Select(operand, field) => (*operand, field),
        Node::Index(operand, index) => match *index {
            Node::Lit(Value::String(s)) => (*operand, s),
            index => return Node::Index(operand, Box::new(index)),
        },
        other => return other,
    };
    match outer {
        Node::Index(inner, domain) => match (*inner, *domain) {
            (
                Node::Device(field @ (DeviceField::Attributes | DeviceField::Capacity)),
                Node::Lit(Value::String(domain)),
            ) => Node::DeviceEntry { field, domain, id },
            (inner, domain) => rebuild(Node::Index(Box::new(inner), Box::new(domain)), id),
        },
        other => rebuild(other, id),
    }
}

/// `outer[id]`, as written.
fn rebuild(outer: Node, id: Arc<str>) -> Node {
    Node::Index(Box::new(outer), Box::new(Node::Lit(Value::String(id))))
}

/// Precomputes calls on literals whose result cannot fail or depend on the device:
/// `quantity("40Gi")`, `semver("1.2.3")`. Invalid literals stay calls, so they fail at
/// evaluation time as in the scheduler. A literal regular expression that does not compile is
/// an error, as it is for the API server.
pub(super) fn fold_call(func: Func, args: Vec<Node>) -> Result<Node, CompileError> {
    if let (Func::Matches | Func::Find | Func::FindAll, Some(Node::Lit(Value::String(pattern)))) =
        (func, args.get(1))
    {
        build_regex(pattern).map_err(|message| CompileError::Regex {
            pattern: pattern.to_string(),
            message,
        })?;
    }
    Ok(match (func, args.as_slice()) {
        (Func::Quantity, [Node::Lit(Value::String(s))]) => match Quantity::parse(s) {
            Ok(q) => Node::Lit(Value::Quantity(Arc::new(q))),
            Err(_) => Node::Call(func, args),
        },
        (Func::Semver, [Node::Lit(Value::String(s))]) => match Version::parse(s) {
            Ok(v) => Node::Lit(Value::Semver(Arc::new(v))),
            Err(_) => Node::Call(func, args),
        },
        _ => Node::Call(func, args),
    })
}
