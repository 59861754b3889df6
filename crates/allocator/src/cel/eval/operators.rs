//! Binary operators: comparisons (a device entry against a string literal read where it
//! lies), arithmetic, concatenation and `in`.

use std::sync::Arc;

use super::{EvalError, Evaluated, Evaluator};
use crate::cel::EntryRef;
use crate::cel::tree::{BinOp, DeviceField, Node};
use crate::cel::value::Value;

impl Evaluator<'_> {
    /// `entry == lit` (or `!=`) for a string literal `lit`.
    fn entry_equals(
        &mut self,
        op: BinOp,
        field: &DeviceField,
        domain: &str,
        id: &str,
        lit: &Value,
    ) -> Evaluated {
        self.meter.charge(3)?;
        let device = self.device;
        let entry = device.entry_ref(matches!(field, DeviceField::Capacity), domain, id);
        let Some(entry) = entry else {
            return Err(EvalError::msg(format!("no such key: {id}")));
        };
        self.meter.charge(1)?;
        match entry {
            EntryRef::Str(s) => {
                let equal = matches!(lit, Value::String(l) if s == &**l);
                Ok(Value::Bool(if op == BinOp::Ne { !equal } else { equal }))
            }
            EntryRef::Quantity(q) => self.binary(op, &Value::Quantity(Arc::new(q)), lit),
            EntryRef::Value(v) => self.binary(op, &v, lit),
        }
    }

    #[inline(never)]
    pub(super) fn eval_binary(&mut self, op: &BinOp, a: &Node, b: &Node) -> Evaluated {
        if matches!(op, BinOp::Eq | BinOp::Ne) {
            // A device entry compared with a string literal, either way round: the entry's
            // string is compared where it lies (same costs and errors as the general path).
            let pair = match (a, b) {
                (Node::DeviceEntry { field, domain, id }, Node::Lit(lit @ Value::String(_)))
                | (Node::Lit(lit @ Value::String(_)), Node::DeviceEntry { field, domain, id }) => {
                    Some((field, domain, id, lit))
                }
                _ => None,
            };
            if let Some((field, domain, id, lit)) = pair {
                return self.entry_equals(*op, field, domain, id, lit);
            }
            // `device.driver` compared with a string literal (every class selector): the
            // driver's name is compared without copying values, at the general path's cost.
            if let (Node::Device(DeviceField::Driver), Node::Lit(Value::String(lit)))
            | (Node::Lit(Value::String(lit)), Node::Device(DeviceField::Driver)) = (a, b)
            {
                self.meter.charge(2)?;
                let equal = self.device.driver_is(lit);
                return Ok(Value::Bool(if *op == BinOp::Ne { !equal } else { equal }));
            }
        }
        let x = self.eval(a)?;
        let y = self.eval(b)?;
        self.meter.charge(1)?;
        self.binary(*op, &x, &y)
    }

    /// `x op y` on evaluated operands, charging what the operation costs.
    fn binary(&mut self, op: BinOp, x: &Value, y: &Value) -> Evaluated {
        use Value::*;
        let name = op.name();
        let overflow = || EvalError::msg("integer overflow");
        Ok(match op {
            BinOp::Eq => Bool(x.equals(y)),
            BinOp::Ne => Bool(!x.equals(y)),
            BinOp::Lt | BinOp::Le | BinOp::Gt | BinOp::Ge => {
                let o = x.compare(y).ok_or_else(|| no_overload(name, x, y))?;
                Bool(match op {
                    BinOp::Lt => o.is_lt(),
                    BinOp::Le => o.is_le(),
                    BinOp::Gt => o.is_gt(),
                    _ => o.is_ge(),
                })
            }
            BinOp::In => match y {
                List(l) => {
                    self.meter.charge(l.len() as u64)?;
                    Bool(l.iter().any(|v| v.equals(x)))
                }
                Map(m) => Bool(m.get(x).is_some()),
                _ => return Err(no_overload(name, x, y)),
            },
            BinOp::Add => match (x, y) {
                (Int(a), Int(b)) => Int(a.checked_add(*b).ok_or_else(overflow)?),
                (Uint(a), Uint(b)) => Uint(a.checked_add(*b).ok_or_else(overflow)?),
                (Double(a), Double(b)) => Double(a + b),
                (String(a), String(b)) => {
                    self.meter
                        .charge(((a.len() + b.len()) as u64).div_ceil(10))?;
                    let mut s = std::string::String::with_capacity(a.len() + b.len());
                    s.push_str(a);
                    s.push_str(b);
                    Value::str(&s)
                }
                (Bytes(a), Bytes(b)) => {
                    self.meter
                        .charge(((a.len() + b.len()) as u64).div_ceil(10))?;
                    let mut v = a.to_vec();
                    v.extend_from_slice(b);
                    Bytes(Arc::from(v))
                }
                (List(a), List(b)) => {
                    self.meter.charge((a.len() + b.len()) as u64)?;
                    let mut v = Vec::with_capacity(a.len() + b.len());
                    v.extend(a.iter().cloned());
                    v.extend(b.iter().cloned());
                    List(Arc::new(v))
                }
                _ => return Err(no_overload(name, x, y)),
            },
            BinOp::Sub => match (x, y) {
                (Int(a), Int(b)) => Int(a.checked_sub(*b).ok_or_else(overflow)?),
                (Uint(a), Uint(b)) => Uint(a.checked_sub(*b).ok_or_else(overflow)?),
                (Double(a), Double(b)) => Double(a - b),
                _ => return Err(no_overload(name, x, y)),
            },
            BinOp::Mul => match (x, y) {
                (Int(a), Int(b)) => Int(a.checked_mul(*b).ok_or_else(overflow)?),
                (Uint(a), Uint(b)) => Uint(a.checked_mul(*b).ok_or_else(overflow)?),
                (Double(a), Double(b)) => Double(a * b),
                _ => return Err(no_overload(name, x, y)),
            },
            BinOp::Div => match (x, y) {
                (Int(_), Int(0)) | (Uint(_), Uint(0)) => {
                    return Err(EvalError::msg("division by zero"));
                }
                (Int(a), Int(b)) => Int(a.checked_div(*b).ok_or_else(overflow)?),
                (Uint(a), Uint(b)) => Uint(a / b),
                (Double(a), Double(b)) => Double(a / b),
                _ => return Err(no_overload(name, x, y)),
            },
            BinOp::Mod => match (x, y) {
                (Int(_), Int(0)) | (Uint(_), Uint(0)) => {
                    return Err(EvalError::msg("modulus by zero"));
                }
                (Int(a), Int(b)) => Int(a.checked_rem(*b).ok_or_else(overflow)?),
                (Uint(a), Uint(b)) => Uint(a % b),
                _ => return Err(no_overload(name, x, y)),
            },
        })
    }
}

/// The error for an operator applied to operands of types it has no overload for.
fn no_overload(op: &str, a: &Value, b: &Value) -> EvalError {
    EvalError::msg(format!(
        "no such overload: {}({}, {})",
        op,
        a.type_name(),
        b.type_name()
    ))
}
