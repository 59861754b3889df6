//! Turns a CEL expression into kubedev's evaluation tree: parse with the `cel` crate, check
//! the structural limits, resolve variables and functions, and check the result type.

mod calls;
mod fold;
mod limits;
mod types;

use std::sync::Arc;

use cel::common::ast::{
    ComprehensionExpr, EntryExpr, Expr, IdedExpr, ListExpr, MapExpr, SelectExpr,
};

use super::tree::{Comprehension, DeviceField, Node, Program};
use super::value::Value;
use super::{CompileError, MAX_AST_DEPTH, MAX_CODE_POINTS, MAX_NESTING};
use fold::{fold_device_entry, literal};
use types::{StaticType, static_type};

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
    limits::check_lexical_nesting(expression)?;
    let ast = cel::parser::Parser::new()
        .enable_optional_syntax(true)
        .max_recursion_depth(MAX_NESTING as u16)
        .parse(expression)
        .map_err(|e| CompileError::Syntax(kubedev_core::echo::chain(&e)))?;
    let depth = limits::ast_depth(&ast);
    if depth > MAX_AST_DEPTH {
        return Err(CompileError::TooDeep {
            depth,
            limit: MAX_AST_DEPTH,
        });
    }
    let mut c = Compiler::default();
    let root = c.expr(&ast)?;
    let ty = static_type(&root);
    if !matches!(ty, StaticType::Bool | StaticType::Dyn) {
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

/// Builds the tree of one expression: the variables in scope (each in a numbered slot of
/// the evaluator's locals) and how many slots the program needs.
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

    /// Each of `exprs`, in order.
    fn exprs(&mut self, exprs: &[IdedExpr]) -> Result<Vec<Node>, CompileError> {
        exprs
            .iter()
            .map(|x| self.expr(x))
            .collect::<Result<Vec<_>, _>>()
    }

    fn expr(&mut self, e: &IdedExpr) -> Result<Node, CompileError> {
        match &e.expr {
            Expr::Unspecified => Err(CompileError::Syntax("empty expression".into())),
            Expr::Literal(l) => Ok(Node::Lit(literal(l))),
            Expr::Ident(name) => self.ident(name),
            Expr::Select(s) => self.select(s),
            Expr::List(l) => self.list(l),
            Expr::Map(m) => self.map(m),
            Expr::Struct(s) => Err(undeclared(&s.type_name)),
            Expr::Comprehension(c) => self.comprehension(c),
            Expr::Call(call) => self.call(call),
        }
    }

    /// A variable in scope, or `device`.
    fn ident(&self, name: &str) -> Result<Node, CompileError> {
        if let Some(slot) = self.lookup(name) {
            Ok(Node::Local(slot))
        } else if name == "device" {
            Ok(Node::DeviceVar)
        } else {
            Err(undeclared(name))
        }
    }

    /// `operand.field` and `has(operand.field)`; a field of `device` is resolved here.
    fn select(&mut self, s: &SelectExpr) -> Result<Node, CompileError> {
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

    /// A list literal; `?x` elements are kept only when they hold a value.
    fn list(&mut self, l: &ListExpr) -> Result<Node, CompileError> {
        let elements = self.exprs(&l.elements)?;
        Ok(Node::List(elements, l.optional_indices.clone()))
    }

    /// A map literal; `?k: v` entries are kept only when `v` holds a value.
    fn map(&mut self, m: &MapExpr) -> Result<Node, CompileError> {
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

    /// A macro's comprehension, its variables in slots of their own while its body compiles.
    fn comprehension(&mut self, c: &ComprehensionExpr) -> Result<Node, CompileError> {
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
}
