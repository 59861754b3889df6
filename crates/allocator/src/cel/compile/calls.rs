//! Calls: the operators that become nodes of their own, binary operators (type-checked),
//! global, namespaced and member functions, and `cel.bind`.

use std::sync::Arc;

use cel::common::ast::{CallExpr, Expr, IdedExpr, LiteralValue, operators};

use super::fold::{fold_call, fold_device_entry};
use super::types::{check_binary, check_logical};
use super::{Compiler, undeclared};
use crate::cel::CompileError;
use crate::cel::library::Func;
use crate::cel::tree::{BinOp, Node};
use crate::cel::value::Value;

impl Compiler {
    /// A call with or without a receiver; for member functions the receiver becomes the
    /// first argument.
    pub(super) fn call(&mut self, call: &CallExpr) -> Result<Node, CompileError> {
        let name = call.func_name.as_str();
        let args = &call.args;
        let Some(target) = call.target.as_deref() else {
            return self.global_call(name, args);
        };
        // Namespaced global functions (`cel.bind`, `optional.of`, `sets.contains`, ...)
        // parse as calls on an identifier that is not a variable.
        if let Expr::Ident(namespace) = &target.expr
            && self.lookup(namespace).is_none()
            && namespace != "device"
        {
            return self.namespaced_call(namespace, name, args);
        }
        self.member_call(name, target, args)
    }

    /// A call without a receiver: an operator or a global function.
    fn global_call(&mut self, name: &str, args: &[IdedExpr]) -> Result<Node, CompileError> {
        if let Some(node) = self.operator_node(name, args)? {
            return Ok(node);
        }
        if let (Some(op), 2) = (binary_operator(name), args.len()) {
            let a = self.expr(&args[0])?;
            let b = self.expr(&args[1])?;
            check_binary(op, &a, &b)?;
            return Ok(Node::Binary(op, Box::new(a), Box::new(b)));
        }
        let func = Func::resolve(name, false, args.len()).ok_or_else(|| undeclared(name))?;
        let nodes = self.exprs(args)?;
        fold_call(func, nodes)
    }

    /// The operators with a node of their own (logic, negation, the conditional, indexing
    /// and optional selection) with their number of operands; `None` for any other call.
    fn operator_node(
        &mut self,
        name: &str,
        args: &[IdedExpr],
    ) -> Result<Option<Node>, CompileError> {
        let node = match name {
            operators::LOGICAL_AND | operators::LOGICAL_OR if args.len() == 2 => {
                let a = self.boxed(&args[0])?;
                let b = self.boxed(&args[1])?;
                check_logical(name, &[&a, &b])?;
                if name == operators::LOGICAL_AND {
                    Node::And(a, b)
                } else {
                    Node::Or(a, b)
                }
            }
            operators::LOGICAL_NOT if args.len() == 1 => {
                let a = self.boxed(&args[0])?;
                check_logical(name, &[&a])?;
                Node::Not(a)
            }
            operators::NOT_STRICTLY_FALSE if args.len() == 1 => {
                Node::NotStrictlyFalse(self.boxed(&args[0])?)
            }
            operators::NEGATE if args.len() == 1 => match self.expr(&args[0])? {
                Node::Lit(Value::Int(i)) if i != i64::MIN => Node::Lit(Value::Int(-i)),
                Node::Lit(Value::Double(d)) => Node::Lit(Value::Double(-d)),
                other => Node::Neg(Box::new(other)),
            },
            operators::CONDITIONAL if args.len() == 3 => {
                let c = self.expr(&args[0])?;
                check_logical(name, &[&c])?;
                Node::Cond(Box::new((c, self.expr(&args[1])?, self.expr(&args[2])?)))
            }
            operators::INDEX if args.len() == 2 => {
                let operand = self.boxed(&args[0])?;
                let index = self.boxed(&args[1])?;
                fold_device_entry(Node::Index(operand, index))
            }
            operators::OPT_INDEX if args.len() == 2 => {
                Node::OptIndex(self.boxed(&args[0])?, self.boxed(&args[1])?)
            }
            operators::OPT_SELECT if args.len() == 2 => {
                let operand = self.boxed(&args[0])?;
                let field = match &args[1].expr {
                    Expr::Literal(LiteralValue::String(s)) => Arc::from(s.inner()),
                    _ => return Err(CompileError::Syntax("invalid optional field".into())),
                };
                Node::OptSelect(operand, field)
            }
            _ => return Ok(None),
        };
        Ok(Some(node))
    }

    /// `namespace.name(args)`: `cel.bind`, or a function such as `optional.of`.
    fn namespaced_call(
        &mut self,
        namespace: &str,
        name: &str,
        args: &[IdedExpr],
    ) -> Result<Node, CompileError> {
        let qualified = format!("{namespace}.{name}");
        if qualified == "cel.bind" {
            return self.bind(args);
        }
        let func =
            Func::resolve(&qualified, false, args.len()).ok_or_else(|| undeclared(&qualified))?;
        let nodes = self.exprs(args)?;
        fold_call(func, nodes)
    }

    /// `cel.bind(var, init, body)`: `body` with `var` in a slot holding `init`.
    fn bind(&mut self, args: &[IdedExpr]) -> Result<Node, CompileError> {
        if args.len() != 3 {
            return Err(undeclared("cel.bind"));
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
        Ok(Node::Bind(slot, Box::new(init), Box::new(body?)))
    }

    /// `target.name(args)`, the receiver evaluated first.
    fn member_call(
        &mut self,
        name: &str,
        target: &IdedExpr,
        args: &[IdedExpr],
    ) -> Result<Node, CompileError> {
        let func = Func::resolve(name, true, args.len()).ok_or_else(|| undeclared(name))?;
        let mut nodes = Vec::with_capacity(args.len() + 1);
        nodes.push(self.expr(target)?);
        for a in args {
            nodes.push(self.expr(a)?);
        }
        fold_call(func, nodes)
    }
}

/// The binary operator a call's name is, if it is one.
fn binary_operator(name: &str) -> Option<BinOp> {
    Some(match name {
        operators::ADD => BinOp::Add,
        operators::SUBSTRACT => BinOp::Sub,
        operators::MULTIPLY => BinOp::Mul,
        operators::DIVIDE => BinOp::Div,
        operators::MODULO => BinOp::Mod,
        operators::EQUALS => BinOp::Eq,
        operators::NOT_EQUALS => BinOp::Ne,
        operators::LESS => BinOp::Lt,
        operators::LESS_EQUALS => BinOp::Le,
        operators::GREATER => BinOp::Gt,
        operators::GREATER_EQUALS => BinOp::Ge,
        operators::IN => BinOp::In,
        _ => return None,
    })
}
