//! List and map literals, with their optional elements and entries.

use std::sync::Arc;

use super::{EvalError, Evaluated, Evaluator};
use crate::cel::tree::Node;
use crate::cel::value::{MapValue, Value};

impl Evaluator<'_> {
    #[inline(never)]
    pub(super) fn eval_list(&mut self, elements: &[Node], optional: &[usize]) -> Evaluated {
        self.meter.charge(10 + elements.len() as u64)?;
        let mut out = Vec::with_capacity(elements.len());
        for (i, e) in elements.iter().enumerate() {
            let v = self.eval(e)?;
            if optional.contains(&i) {
                match v {
                    Value::Optional(Some(x)) => out.push((*x).clone()),
                    Value::Optional(None) => {}
                    other => {
                        return Err(EvalError::msg(format!(
                            "optional list element is a {}",
                            other.type_name()
                        )));
                    }
                }
            } else {
                out.push(v);
            }
        }
        Ok(Value::List(Arc::new(out)))
    }

    #[inline(never)]
    pub(super) fn eval_map(&mut self, entries: &[(Node, Node, bool)]) -> Evaluated {
        self.meter.charge(30 + entries.len() as u64)?;
        let mut m = MapValue::default();
        for (k, v, optional) in entries {
            let key = self.eval(k)?;
            if !matches!(
                key,
                Value::String(_) | Value::Int(_) | Value::Uint(_) | Value::Bool(_)
            ) {
                return Err(EvalError::msg(format!(
                    "unsupported map key type: {}",
                    key.type_name()
                )));
            }
            let value = self.eval(v)?;
            let value = if *optional {
                match value {
                    Value::Optional(Some(x)) => (*x).clone(),
                    Value::Optional(None) => continue,
                    other => {
                        return Err(EvalError::msg(format!(
                            "optional map entry is a {}",
                            other.type_name()
                        )));
                    }
                }
            } else {
                value
            };
            if m.get(&key).is_some() {
                return Err(EvalError::msg(format!("duplicate map key {key}")));
            }
            m.entries.push((key, value));
        }
        Ok(Value::Map(Arc::new(m)))
    }
}
