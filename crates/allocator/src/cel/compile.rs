//! Turns a CEL expression into kubedev's evaluation tree: parse with the `cel` crate, check
//! the structural limits, resolve variables and functions, and check the result type.

use std::sync::Arc;

use cel::common::ast::{EntryExpr, Expr, IdedExpr, LiteralValue, operators};

use super::library::Func;
use super::numeric::{Quantity, Version};
use super::value::{MapValue, Value};
use super::{CompileError, MAX_AST_DEPTH, MAX_CODE_POINTS, MAX_NESTING};

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

/// Static types, as far as they are known without the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ty {
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

impl Ty {
    fn name(self) -> &'static str {
        match self {
            Ty::Bool => "bool",
            Ty::Int => "int",
            Ty::Uint => "uint",
            Ty::Double => "double",
            Ty::String => "string",
            Ty::Bytes => "bytes",
            Ty::List => "list",
            Ty::Map => "map",
            Ty::Null => "null_type",
            Ty::Quantity => "kubernetes.Quantity",
            Ty::Semver => "kubernetes.Semver",
            Ty::Optional => "optional_type",
            Ty::Dyn => "dyn",
        }
    }
}

/// Checks the lexical limits, parses and compiles `expression`.
pub(crate) fn compile(expression: &str) -> Result<Program, CompileError> {
    if expression.len() > MAX_CODE_POINTS {
        let length = expression.chars().count();
        if length > MAX_CODE_POINTS {
            return Err(CompileError::TooLong {
                length,
                limit: MAX_CODE_POINTS,
            });
        }
    }
    check_lexical_nesting(expression)?;
    let ast = cel::parser::Parser::new()
        .enable_optional_syntax(true)
        .max_recursion_depth(MAX_NESTING as u16)
        .parse(expression)
        .map_err(|e| CompileError::Syntax(kubedev_core::echo::chain(&e)))?;
    let depth = ast_depth(&ast);
    if depth > MAX_AST_DEPTH {
        return Err(CompileError::TooDeep {
            depth,
            limit: MAX_AST_DEPTH,
        });
    }
    let mut c = Compiler::default();
    let root = c.expr(&ast)?;
    let ty = static_type(&root);
    if !matches!(ty, Ty::Bool | Ty::Dyn) {
        return Err(CompileError::Type(format!(
            "must evaluate to bool or the unknown type, not {}",
            ty.name()
        )));
    }
    Ok(Program {
        root,
        slots: c.max_slots,
        expression: expression.to_string(),
    })
}

/// Rejects bracket nesting deeper than the parser's limit before the parser sees it, so
/// the parser's own recursion stays small.
fn check_lexical_nesting(expression: &str) -> Result<(), CompileError> {
    let mut depth = 0usize;
    let mut quote: Option<u8> = None;
    let bytes = expression.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        match quote {
            Some(q) => {
                if b == b'\\' {
                    i += 1;
                } else if b == q {
                    quote = None;
                }
            }
            None => match b {
                b'"' | b'\'' => quote = Some(b),
                b'(' | b'[' | b'{' => {
                    depth += 1;
                    if depth > MAX_NESTING {
                        return Err(CompileError::TooDeep {
                            depth,
                            limit: MAX_NESTING,
                        });
                    }
                }
                b')' | b']' | b'}' => depth = depth.saturating_sub(1),
                _ => {}
            },
        }
        i += 1;
    }
    Ok(())
}

/// Depth of the parsed tree, computed without recursion.
fn ast_depth(root: &IdedExpr) -> usize {
    let mut max = 0;
    let mut stack: Vec<(&IdedExpr, usize)> = vec![(root, 1)];
    while let Some((e, d)) = stack.pop() {
        max = max.max(d);
        match &e.expr {
            Expr::Call(c) => {
                if let Some(t) = &c.target {
                    stack.push((t, d + 1));
                }
                stack.extend(c.args.iter().map(|a| (a, d + 1)));
            }
            Expr::Comprehension(c) => {
                for x in [
                    &c.iter_range,
                    &c.accu_init,
                    &c.loop_cond,
                    &c.loop_step,
                    &c.result,
                ] {
                    stack.push((x, d + 1));
                }
            }
            Expr::List(l) => stack.extend(l.elements.iter().map(|a| (a, d + 1))),
            Expr::Map(m) => {
                for entry in &m.entries {
                    if let EntryExpr::MapEntry(me) = &entry.expr {
                        stack.push((&me.key, d + 1));
                        stack.push((&me.value, d + 1));
                    }
                }
            }
            Expr::Struct(s) => {
                for entry in &s.entries {
                    if let EntryExpr::StructField(f) = &entry.expr {
                        stack.push((&f.value, d + 1));
                    }
                }
            }
            Expr::Select(s) => stack.push((&s.operand, d + 1)),
            Expr::Ident(_) | Expr::Literal(_) | Expr::Unspecified => {}
        }
    }
    max
}

#[derive(Default)]
struct Compiler {
    scopes: Vec<(String, usize)>,
    next_slot: usize,
    max_slots: usize,
}

fn undeclared(name: &str) -> CompileError {
    CompileError::Undeclared(name.to_string())
}

impl Compiler {
    fn push_var(&mut self, name: &str) -> usize {
        let slot = self.next_slot;
        self.next_slot += 1;
        self.max_slots = self.max_slots.max(self.next_slot);
        self.scopes.push((name.to_string(), slot));
        slot
    }

    fn pop_vars(&mut self, n: usize) {
        for _ in 0..n {
            self.scopes.pop();
            self.next_slot -= 1;
        }
    }

    fn lookup(&self, name: &str) -> Option<usize> {
        self.scopes
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .map(|(_, s)| *s)
    }

    fn boxed(&mut self, e: &IdedExpr) -> Result<Box<Node>, CompileError> {
        Ok(Box::new(self.expr(e)?))
    }

    fn expr(&mut self, e: &IdedExpr) -> Result<Node, CompileError> {
        match &e.expr {
            Expr::Unspecified => Err(CompileError::Syntax("empty expression".into())),
            Expr::Literal(l) => Ok(Node::Lit(literal(l))),
            Expr::Ident(name) => {
                if let Some(slot) = self.lookup(name) {
                    Ok(Node::Local(slot))
                } else if name == "device" {
                    Ok(Node::DeviceVar)
                } else {
                    Err(undeclared(name))
                }
            }
            Expr::Select(s) => {
                let operand = self.expr(&s.operand)?;
                let field: Arc<str> = Arc::from(s.field.as_str());
                if let Node::DeviceVar = operand {
                    let f = match &*field {
                        "driver" => DeviceField::Driver,
                        "attributes" => DeviceField::Attributes,
                        "capacity" => DeviceField::Capacity,
                        "allowMultipleAllocations" => DeviceField::AllowMultipleAllocations,
                        other => {
                            return Err(CompileError::Type(format!("undefined field '{other}'")));
                        }
                    };
                    if s.test {
                        return Ok(Node::Lit(Value::Bool(true)));
                    }
                    return Ok(Node::Device(f));
                }
                if s.test {
                    return Ok(Node::Has(Box::new(operand), field));
                }
                Ok(fold_device_entry(Node::Select(Box::new(operand), field)))
            }
            Expr::List(l) => {
                let elements = l
                    .elements
                    .iter()
                    .map(|x| self.expr(x))
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(Node::List(elements, l.optional_indices.clone()))
            }
            Expr::Map(m) => {
                let mut entries = Vec::with_capacity(m.entries.len());
                for entry in &m.entries {
                    match &entry.expr {
                        EntryExpr::MapEntry(me) => {
                            entries.push((self.expr(&me.key)?, self.expr(&me.value)?, me.optional))
                        }
                        EntryExpr::StructField(_) => {
                            return Err(CompileError::Syntax("struct field in a map".into()));
                        }
                    }
                }
                Ok(Node::Map(entries))
            }
            Expr::Struct(s) => Err(undeclared(&s.type_name)),
            Expr::Comprehension(c) => {
                let range = self.expr(&c.iter_range)?;
                let init = self.expr(&c.accu_init)?;
                let var = self.push_var(&c.iter_var);
                let var2 = c.iter_var2.as_ref().map(|v| self.push_var(v));
                let accu = self.push_var(&c.accu_var);
                let cond = self.expr(&c.loop_cond);
                let step = self.expr(&c.loop_step);
                let result = self.expr(&c.result);
                self.pop_vars(if var2.is_some() { 3 } else { 2 });
                Ok(Node::Comprehension(Box::new(Comprehension {
                    range,
                    var,
                    var2,
                    accu,
                    init,
                    cond: cond?,
                    step: step?,
                    result: result?,
                })))
            }
            Expr::Call(call) => self.call(call),
        }
    }

    fn call(&mut self, call: &cel::common::ast::CallExpr) -> Result<Node, CompileError> {
        let name = call.func_name.as_str();
        let args = &call.args;
        if call.target.is_none() {
            let binary = |op| -> Option<BinOp> { Some(op) };
            let op = match name {
                operators::LOGICAL_AND | operators::LOGICAL_OR if args.len() == 2 => {
                    let a = self.boxed(&args[0])?;
                    let b = self.boxed(&args[1])?;
                    return Ok(if name == operators::LOGICAL_AND {
                        Node::And(a, b)
                    } else {
                        Node::Or(a, b)
                    });
                }
                operators::LOGICAL_NOT if args.len() == 1 => {
                    return Ok(Node::Not(self.boxed(&args[0])?));
                }
                operators::NOT_STRICTLY_FALSE if args.len() == 1 => {
                    return Ok(Node::NotStrictlyFalse(self.boxed(&args[0])?));
                }
                operators::NEGATE if args.len() == 1 => {
                    return Ok(match self.expr(&args[0])? {
                        Node::Lit(Value::Int(i)) if i != i64::MIN => Node::Lit(Value::Int(-i)),
                        Node::Lit(Value::Double(d)) => Node::Lit(Value::Double(-d)),
                        other => Node::Neg(Box::new(other)),
                    });
                }
                operators::CONDITIONAL if args.len() == 3 => {
                    return Ok(Node::Cond(Box::new((
                        self.expr(&args[0])?,
                        self.expr(&args[1])?,
                        self.expr(&args[2])?,
                    ))));
                }
                operators::INDEX if args.len() == 2 => {
                    let operand = self.boxed(&args[0])?;
                    let index = self.boxed(&args[1])?;
                    return Ok(fold_device_entry(Node::Index(operand, index)));
                }
                operators::OPT_INDEX if args.len() == 2 => {
                    return Ok(Node::OptIndex(self.boxed(&args[0])?, self.boxed(&args[1])?));
                }
                operators::OPT_SELECT if args.len() == 2 => {
                    let operand = self.boxed(&args[0])?;
                    let field = match &args[1].expr {
                        Expr::Literal(LiteralValue::String(s)) => Arc::from(s.inner()),
                        _ => return Err(CompileError::Syntax("invalid optional field".into())),
                    };
                    return Ok(Node::OptSelect(operand, field));
                }
                operators::ADD => binary(BinOp::Add),
                operators::SUBSTRACT => binary(BinOp::Sub),
                operators::MULTIPLY => binary(BinOp::Mul),
                operators::DIVIDE => binary(BinOp::Div),
                operators::MODULO => binary(BinOp::Mod),
                operators::EQUALS => binary(BinOp::Eq),
                operators::NOT_EQUALS => binary(BinOp::Ne),
                operators::LESS => binary(BinOp::Lt),
                operators::LESS_EQUALS => binary(BinOp::Le),
                operators::GREATER => binary(BinOp::Gt),
                operators::GREATER_EQUALS => binary(BinOp::Ge),
                operators::IN => binary(BinOp::In),
                _ => None,
            };
            if let (Some(op), 2) = (op, args.len()) {
                let a = self.expr(&args[0])?;
                let b = self.expr(&args[1])?;
                check_binary(op, &a, &b)?;
                return Ok(Node::Binary(op, Box::new(a), Box::new(b)));
            }
            let func = Func::resolve(name, false, args.len()).ok_or_else(|| undeclared(name))?;
            let nodes = args
                .iter()
                .map(|a| self.expr(a))
                .collect::<Result<Vec<_>, _>>()?;
            return fold_call(func, nodes);
        }
        let Some(target) = call.target.as_deref() else {
            return Err(undeclared(name));
        };
        // Namespaced global functions (`cel.bind`, `optional.of`, `sets.contains`, ...)
        // parse as calls on an identifier that is not a variable.
        if let Expr::Ident(ns) = &target.expr
            && self.lookup(ns).is_none()
            && ns != "device"
        {
            {
                let qualified = format!("{ns}.{name}");
                if qualified == "cel.bind" {
                    if args.len() != 3 {
                        return Err(undeclared(&qualified));
                    }
                    let Expr::Ident(var) = &args[0].expr else {
                        return Err(CompileError::Syntax(
                            "cel.bind() variable name must be a simple identifier".into(),
                        ));
                    };
                    let init = self.expr(&args[1])?;
                    let slot = self.push_var(var);
                    let body = self.expr(&args[2]);
                    self.pop_vars(1);
                    return Ok(Node::Bind(slot, Box::new(init), Box::new(body?)));
                }
                let func = Func::resolve(&qualified, false, args.len())
                    .ok_or_else(|| undeclared(&qualified))?;
                let nodes = args
                    .iter()
                    .map(|a| self.expr(a))
                    .collect::<Result<Vec<_>, _>>()?;
                return fold_call(func, nodes);
            }
        }
        let func = Func::resolve(name, true, args.len()).ok_or_else(|| undeclared(name))?;
        let mut nodes = Vec::with_capacity(args.len() + 1);
        nodes.push(self.expr(target)?);
        for a in args {
            nodes.push(self.expr(a)?);
        }
        fold_call(func, nodes)
    }
}

fn literal(l: &LiteralValue) -> Value {
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
fn fold_device_entry(node: Node) -> Node {
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

fn rebuild(outer: Node, id: Arc<str>) -> Node {
    Node::Index(Box::new(outer), Box::new(Node::Lit(Value::String(id))))
}

/// Precomputes calls on literals whose result cannot fail or depend on the device:
/// `quantity("40Gi")`, `semver("1.2.3")`. Invalid literals stay calls, so they fail at
/// evaluation time as in the scheduler. A literal regular expression that does not compile is
/// an error, as it is for the API server.
fn fold_call(func: Func, args: Vec<Node>) -> Result<Node, CompileError> {
    if let (Func::Matches | Func::Find | Func::FindAll, Some(Node::Lit(Value::String(pattern)))) =
        (func, args.get(1))
    {
        super::eval::build_regex(pattern).map_err(|message| CompileError::Regex {
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

fn check_binary(op: BinOp, a: &Node, b: &Node) -> Result<(), CompileError> {
    let (ta, tb) = (static_type(a), static_type(b));
    if ta == Ty::Dyn || tb == Ty::Dyn {
        return Ok(());
    }
    let numeric = |t: Ty| matches!(t, Ty::Int | Ty::Uint | Ty::Double);
    let ok = match op {
        BinOp::Eq | BinOp::Ne => ta == tb || ta == Ty::Null || tb == Ty::Null,
        BinOp::Lt | BinOp::Le | BinOp::Gt | BinOp::Ge => {
            (numeric(ta) && numeric(tb))
                || (ta == tb && matches!(ta, Ty::String | Ty::Bytes | Ty::Bool))
        }
        BinOp::In => matches!(tb, Ty::List | Ty::Map),
        BinOp::Add => {
            ta == tb
                && matches!(
                    ta,
                    Ty::Int | Ty::Uint | Ty::Double | Ty::String | Ty::Bytes | Ty::List
                )
        }
        BinOp::Sub | BinOp::Mul | BinOp::Div => ta == tb && numeric(ta),
        BinOp::Mod => ta == tb && matches!(ta, Ty::Int | Ty::Uint),
    };
    if ok {
        Ok(())
    } else {
        Err(CompileError::Type(format!(
            "found no matching overload for '{}' applied to '({}, {})'",
            op_name(op),
            ta.name(),
            tb.name()
        )))
    }
}

fn op_name(op: BinOp) -> &'static str {
    match op {
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

fn static_type(node: &Node) -> Ty {
    match node {
        Node::Lit(v) => match v {
            Value::Null => Ty::Null,
            Value::Bool(_) => Ty::Bool,
            Value::Int(_) => Ty::Int,
            Value::Uint(_) => Ty::Uint,
            Value::Double(_) => Ty::Double,
            Value::String(_) => Ty::String,
            Value::Bytes(_) => Ty::Bytes,
            Value::List(_) => Ty::List,
            Value::Map(_) => Ty::Map,
            Value::Quantity(_) => Ty::Quantity,
            Value::Semver(_) => Ty::Semver,
            Value::Optional(_) => Ty::Optional,
        },
        Node::Device(DeviceField::Driver) => Ty::String,
        Node::Device(DeviceField::AllowMultipleAllocations) => Ty::Bool,
        Node::Device(_) | Node::DeviceVar => Ty::Map,
        Node::DeviceEntry {
            field: DeviceField::Capacity,
            ..
        } => Ty::Quantity,
        Node::Has(..) | Node::And(..) | Node::Or(..) | Node::Not(_) | Node::NotStrictlyFalse(_) => {
            Ty::Bool
        }
        Node::OptSelect(..) | Node::OptIndex(..) => Ty::Optional,
        Node::List(..) => Ty::List,
        Node::Map(..) => Ty::Map,
        Node::Binary(op, a, b) => match op {
            BinOp::Eq | BinOp::Ne | BinOp::Lt | BinOp::Le | BinOp::Gt | BinOp::Ge | BinOp::In => {
                Ty::Bool
            }
            _ => {
                let (ta, tb) = (static_type(a), static_type(b));
                if ta == tb { ta } else { Ty::Dyn }
            }
        },
        Node::Neg(a) => match static_type(a) {
            t @ (Ty::Int | Ty::Double) => t,
            _ => Ty::Dyn,
        },
        Node::Cond(c) => {
            let (a, b) = (static_type(&c.1), static_type(&c.2));
            if a == b { a } else { Ty::Dyn }
        }
        Node::Call(f, _) => match f.result_type() {
            Some(t) => match t {
                "bool" => Ty::Bool,
                "int" => Ty::Int,
                "uint" => Ty::Uint,
                "double" => Ty::Double,
                "string" => Ty::String,
                "bytes" => Ty::Bytes,
                "list" => Ty::List,
                "quantity" => Ty::Quantity,
                "semver" => Ty::Semver,
                "optional" => Ty::Optional,
                _ => Ty::Dyn,
            },
            None => Ty::Dyn,
        },
        Node::Comprehension(c) => static_type(&c.result),
        Node::Bind(_, _, body) => static_type(body),
        _ => Ty::Dyn,
    }
}

#[allow(dead_code)]
fn _assert_send_sync() {
    fn is<T: Send + Sync>() {}
    is::<Program>();
    is::<MapValue>();
}
