//! The evaluation tree a compiled [`Program`] holds: what the compiler builds and the
//! evaluator walks.

use std::sync::Arc;

use super::library::Func;
use super::value::{MapValue, Value};

/// Binary operators.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BinOp {
    Add,
    Sub,
    Mul,
    Div,
    Mod,
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    In,
}

impl BinOp {
    /// The CEL name of the operator, for error messages.
    #[inline]
    pub(crate) fn name(self) -> &'static str {
        match self {
            BinOp::Add => "_+_",
            BinOp::Sub => "_-_",
            BinOp::Mul => "_*_",
            BinOp::Div => "_/_",
            BinOp::Mod => "_%_",
            BinOp::Eq => "_==_",
            BinOp::Ne => "_!=_",
            BinOp::Lt => "_<_",
            BinOp::Le => "_<=_",
            BinOp::Gt => "_>_",
            BinOp::Ge => "_>=_",
            BinOp::In => "@in",
        }
    }
}

/// Fields of the `device` variable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DeviceField {
    Driver,
    Attributes,
    Capacity,
    AllowMultipleAllocations,
}

/// A node of the evaluation tree.
#[derive(Debug)]
pub(crate) enum Node {
    Lit(Value),
    DeviceVar,
    Device(DeviceField),
    /// `device.attributes["domain"].id` / `device.capacity[...]...` resolved at compile time.
    DeviceEntry {
        field: DeviceField,
        domain: Arc<str>,
        id: Arc<str>,
    },
    Local(usize),
    Select(Box<Node>, Arc<str>),
    Has(Box<Node>, Arc<str>),
    OptSelect(Box<Node>, Arc<str>),
    Index(Box<Node>, Box<Node>),
    OptIndex(Box<Node>, Box<Node>),
    And(Box<Node>, Box<Node>),
    Or(Box<Node>, Box<Node>),
    Not(Box<Node>),
    NotStrictlyFalse(Box<Node>),
    Cond(Box<(Node, Node, Node)>),
    Neg(Box<Node>),
    Binary(BinOp, Box<Node>, Box<Node>),
    List(Vec<Node>, Vec<usize>),
    Map(Vec<(Node, Node, bool)>),
    /// A function call; for member functions the receiver is the first argument.
    Call(Func, Vec<Node>),
    Comprehension(Box<Comprehension>),
    Bind(usize, Box<Node>, Box<Node>),
}

/// A comprehension (the expansion of `all`, `exists`, `map`, `filter`, ...): `step` folds
/// each element of `range` into the accumulator while `cond` holds, then `result` reads it.
#[derive(Debug)]
pub(crate) struct Comprehension {
    pub(crate) range: Node,
    pub(crate) var: usize,
    pub(crate) var2: Option<usize>,
    pub(crate) accu: usize,
    pub(crate) init: Node,
    pub(crate) cond: Node,
    pub(crate) step: Node,
    pub(crate) result: Node,
}

/// A compiled selector expression.
#[derive(Debug)]
pub struct Program {
    pub(crate) root: Node,
    pub(crate) slots: usize,
    pub(crate) expression: String,
}

impl Program {
    /// The expression as written.
    pub fn expression(&self) -> &str {
        &self.expression
    }
}

#[allow(dead_code)]
fn _assert_send_sync() {
    fn is<T: Send + Sync>() {}
    is::<Program>();
    is::<MapValue>();
}
