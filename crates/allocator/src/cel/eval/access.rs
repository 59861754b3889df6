//! Reading into values: field selection, `has`, indexing and their optional forms.

use std::sync::Arc;

use super::{EvalError, Evaluated, Evaluator};
use crate::cel::tree::Node;
use crate::cel::value::{Value, empty_map};

impl Evaluator<'_> {
    #[inline(never)]
    pub(super) fn eval_select(&mut self, operand: &Node, field: &str) -> Evaluated {
        let v = self.eval(operand)?;
        self.meter.charge(1)?;
        select(&v, field)
    }

    #[inline(never)]
    pub(super) fn eval_has(&mut self, operand: &Node, field: &str) -> Evaluated {
        let v = self.eval(operand)?;
        self.meter.charge(1)?;
        match &v {
            Value::Map(m) => Ok(Value::Bool(
                m.missing_is_empty || m.get_str(field).is_some(),
            )),
            other => Err(EvalError::msg(format!(
                "invalid type for field selection: {}",
                other.type_name()
            ))),
        }
    }

    #[inline(never)]
    pub(super) fn eval_index(&mut self, operand: &Node, index: &Node) -> Evaluated {
        let v = self.eval(operand)?;
        let i = self.eval(index)?;
        self.meter.charge(1)?;
        index_value(&v, &i)
    }

    #[inline(never)]
    pub(super) fn eval_opt_select(&mut self, operand: &Node, field: &str) -> Evaluated {
        let v = self.eval(operand)?;
        self.meter.charge(1)?;
        let inner = match &v {
            Value::Optional(None) => return Ok(Value::Optional(None)),
            Value::Optional(Some(x)) => (**x).clone(),
            other => other.clone(),
        };
        match &inner {
            Value::Map(m) => Ok(Value::Optional(match m.get_str(field) {
                Some(x) => Some(Arc::new(x.clone())),
                None if m.missing_is_empty => Some(Arc::new(empty_map())),
                None => None,
            })),
            other => Err(EvalError::msg(format!(
                "invalid type for field selection: {}",
                other.type_name()
            ))),
        }
    }

    #[inline(never)]
    pub(super) fn eval_opt_index(&mut self, operand: &Node, index: &Node) -> Evaluated {
        let v = self.eval(operand)?;
        let i = self.eval(index)?;
        self.meter.charge(1)?;
        let inner = match &v {
            Value::Optional(None) => return Ok(Value::Optional(None)),
            Value::Optional(Some(x)) => (**x).clone(),
            other => other.clone(),
        };
        match index_value(&inner, &i) {
            Ok(x) => Ok(Value::Optional(Some(Arc::new(x)))),
            Err(e) if e.fatal => Err(e),
            Err(_) => match &inner {
                Value::Map(_) | Value::List(_) => Ok(Value::Optional(None)),
                other => Err(EvalError::msg(format!(
                    "no such overload: _[?_]({})",
                    other.type_name()
                ))),
            },
        }
    }
}

/// `v.field`: a map's entry (an empty map where missing entries read as empty).
fn select(v: &Value, field: &str) -> Evaluated {
    match v {
        Value::Map(m) => match m.get_str(field) {
            Some(x) => Ok(x.clone()),
            None if m.missing_is_empty => Ok(empty_map()),
            None => Err(EvalError::msg(format!("no such key: {field}"))),
        },
        other => Err(EvalError::msg(format!(
            "type '{}' does not support field selection",
            other.type_name()
        ))),
    }
}

/// `v[i]` of a map or a list.
fn index_value(v: &Value, i: &Value) -> Evaluated {
    match v {
        Value::Map(m) => {
            if !matches!(
                i,
                Value::String(_)
                    | Value::Int(_)
                    | Value::Uint(_)
                    | Value::Bool(_)
                    | Value::Double(_)
            ) {
                return Err(EvalError::msg(format!(
                    "unsupported map key type: {}",
                    i.type_name()
                )));
            }
            match m.get(i) {
                Some(x) => Ok(x.clone()),
                None if m.missing_is_empty => Ok(empty_map()),
                None => Err(EvalError::msg(format!("no such key: {}", key_text(i)))),
            }
        }
        Value::List(l) => {
            let idx = match i {
                Value::Int(n) => *n,
                Value::Uint(n) => i64::try_from(*n).unwrap_or(i64::MAX),
                Value::Double(d) if d.fract() == 0.0 && d.is_finite() => *d as i64,
                other => {
                    return Err(EvalError::msg(format!(
                        "unsupported index type '{}' in list",
                        other.type_name()
                    )));
                }
            };
            if idx < 0 || idx as usize >= l.len() {
                return Err(EvalError::msg(format!(
                    "index out of bounds: {idx}, size {}",
                    l.len()
                )));
            }
            Ok(l[idx as usize].clone())
        }
        other => Err(EvalError::msg(format!(
            "no such overload: _[_]({}, {})",
            other.type_name(),
            i.type_name()
        ))),
    }
}

/// A missing key as an error message names it (strings without quotes).
fn key_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.to_string(),
        other => other.to_string(),
    }
}
