//! Static types, known before any device is seen: a selector must be a bool (or of a type
//! only the device decides), and operands must suit their operator.

use crate::cel::CompileError;
use crate::cel::tree::{BinOp, DeviceField, Node};
use crate::cel::value::Value;

/// The static types, as far as they are known without the device ([`StaticType::Dyn`] where
/// the device decides).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum StaticType {
    Bool,
    Int,
    Uint,
    Double,
    String,
    Bytes,
    List,
    Map,
    Null,
    Quantity,
    Semver,
    Optional,
    Dyn,
}

impl StaticType {
    /// The CEL name of the type, for error messages.
    pub(super) fn name(self) -> &'static str {
        match self {
            StaticType::Bool => "bool",
            StaticType::Int => "int",
            StaticType::Uint => "uint",
            StaticType::Double => "double",
            StaticType::String => "string",
            StaticType::Bytes => "bytes",
            StaticType::List => "list",
            StaticType::Map => "map",
            StaticType::Null => "null_type",
            StaticType::Quantity => "kubernetes.Quantity",
            StaticType::Semver => "kubernetes.Semver",
            StaticType::Optional => "optional_type",
            StaticType::Dyn => "dyn",
        }
    }
}

/// Refuses a binary operator whose operands' static types it never accepts.
pub(super) fn check_binary(op: BinOp, a: &Node, b: &Node) -> Result<(), CompileError> {
    let (ta, tb) = (static_type(a), static_type(b));
    if ta == StaticType::Dyn || tb == StaticType::Dyn {
        return Ok(());
    }
    let numeric =
        |t: StaticType| matches!(t, StaticType::Int | StaticType::Uint | StaticType::Double);
    let ok = match op {
        BinOp::Eq | BinOp::Ne => ta == tb || ta == StaticType::Null || tb == StaticType::Null,
        BinOp::Lt | BinOp::Le | BinOp::Gt | BinOp::Ge => {
            (numeric(ta) && numeric(tb))
                || (ta == tb
                    && matches!(
                        ta,
                        StaticType::String | StaticType::Bytes | StaticType::Bool
                    ))
        }
        BinOp::In => {
            matches!(tb, StaticType::List | StaticType::Map)
                && element_type(b).is_none_or(|t| t == ta || t == StaticType::Dyn)
        }
        BinOp::Add => {
            ta == tb
                && matches!(
                    ta,
                    StaticType::Int
                        | StaticType::Uint
                        | StaticType::Double
                        | StaticType::String
                        | StaticType::Bytes
                        | StaticType::List
                )
        }
        BinOp::Sub | BinOp::Mul | BinOp::Div => ta == tb && numeric(ta),
        BinOp::Mod => ta == tb && matches!(ta, StaticType::Int | StaticType::Uint),
    };
    if ok {
        Ok(())
    } else {
        let tb_name = match (tb, element_type(b)) {
            (StaticType::List, Some(t)) => format!("list({})", t.name()),
            _ => tb.name().to_string(),
        };
        Err(CompileError::Type(format!(
            "found no matching overload for '{}' applied to '({}, {tb_name})'",
            op.name(),
            ta.name(),
        )))
    }
}

/// The one static type of a literal list's items or a literal map's keys (`Dyn` when they
/// differ or one is not known); `None` for anything else.
fn element_type(node: &Node) -> Option<StaticType> {
    let one = |mut types: Box<dyn Iterator<Item = StaticType> + '_>| {
        let first = types.next()?;
        Some(if types.all(|t| t == first) {
            first
        } else {
            StaticType::Dyn
        })
    };
    match node {
        Node::List(items, _) => one(Box::new(items.iter().map(static_type))),
        Node::Map(entries) => one(Box::new(entries.iter().map(|(k, _, _)| static_type(k)))),
        Node::Lit(Value::List(items)) => one(Box::new(
            items.iter().map(|v| static_type(&Node::Lit(v.clone()))),
        )),
        _ => None,
    }
}

/// Refuses a logical operator (`!_`, `_&&_`, `_||_`, and the condition of `_?_:_`) an
/// operand of which has a static type other than bool: `!"a" in m` is `(!"a") in m`.
pub(super) fn check_logical(op: &str, operands: &[&Node]) -> Result<(), CompileError> {
    let types: Vec<StaticType> = operands.iter().map(|n| static_type(n)).collect();
    if types
        .iter()
        .all(|t| matches!(t, StaticType::Bool | StaticType::Dyn))
    {
        return Ok(());
    }
    let names: Vec<&str> = types.iter().map(|t| t.name()).collect();
    Err(CompileError::Type(format!(
        "found no matching overload for '{op}' applied to '({})'",
        names.join(", ")
    )))
}

/// The static type of `node`: [`StaticType::Dyn`] where it depends on the device.
pub(super) fn static_type(node: &Node) -> StaticType {
    match node {
        Node::Lit(v) => match v {
            Value::Null => StaticType::Null,
            Value::Bool(_) => StaticType::Bool,
            Value::Int(_) => StaticType::Int,
            Value::Uint(_) => StaticType::Uint,
            Value::Double(_) => StaticType::Double,
            Value::String(_) => StaticType::String,
            Value::Bytes(_) => StaticType::Bytes,
            Value::List(_) => StaticType::List,
            Value::Map(_) => StaticType::Map,
            Value::Quantity(_) => StaticType::Quantity,
            Value::Semver(_) => StaticType::Semver,
            Value::Optional(_) => StaticType::Optional,
        },
        Node::Device(DeviceField::Driver) => StaticType::String,
        Node::Device(DeviceField::AllowMultipleAllocations) => StaticType::Bool,
        Node::Device(_) | Node::DeviceVar => StaticType::Map,
        Node::DeviceEntry {
            field: DeviceField::Capacity,
            ..
        } => StaticType::Quantity,
        Node::Has(..) | Node::And(..) | Node::Or(..) | Node::Not(_) | Node::NotStrictlyFalse(_) => {
            StaticType::Bool
        }
        Node::OptSelect(..) | Node::OptIndex(..) => StaticType::Optional,
        Node::List(..) => StaticType::List,
        Node::Map(..) => StaticType::Map,
        Node::Binary(op, a, b) => match op {
            BinOp::Eq | BinOp::Ne | BinOp::Lt | BinOp::Le | BinOp::Gt | BinOp::Ge | BinOp::In => {
                StaticType::Bool
            }
            _ => {
                let (ta, tb) = (static_type(a), static_type(b));
                if ta == tb { ta } else { StaticType::Dyn }
            }
        },
        Node::Neg(a) => match static_type(a) {
            t @ (StaticType::Int | StaticType::Double) => t,
            _ => StaticType::Dyn,
        },
        Node::Cond(c) => {
            let (a, b) = (static_type(&c.1), static_type(&c.2));
            if a == b { a } else { StaticType::Dyn }
        }
        Node::Call(f, _) => match f.result_type() {
            Some(t) => match t {
                "bool" => StaticType::Bool,
                "int" => StaticType::Int,
                "uint" => StaticType::Uint,
                "double" => StaticType::Double,
                "string" => StaticType::String,
                "bytes" => StaticType::Bytes,
                "list" => StaticType::List,
                "quantity" => StaticType::Quantity,
                "semver" => StaticType::Semver,
                "optional" => StaticType::Optional,
                _ => StaticType::Dyn,
            },
            None => StaticType::Dyn,
        },
        Node::Comprehension(c) => static_type(&c.result),
        Node::Bind(_, _, body) => static_type(body),
        _ => StaticType::Dyn,
    }
}
