//! Expressions that give local variables values: `cel.bind` and the macros' comprehensions.

use super::{EvalError, Evaluated, Evaluator};
use crate::cel::tree::{Comprehension, Node};
use crate::cel::value::Value;

impl Evaluator<'_> {
    #[inline(never)]
    pub(super) fn eval_bind(&mut self, slot: &usize, init: &Node, body: &Node) -> Evaluated {
        let v = self.eval(init)?;
        let saved = std::mem::replace(&mut self.locals[*slot], v);
        let r = self.eval(body);
        self.locals[*slot] = saved;
        r
    }

    #[inline(never)]
    pub(super) fn eval_comprehension(&mut self, c: &Comprehension) -> Evaluated {
        let range = self.eval(&c.range)?;
        let items: Vec<(Value, Value)> = match &range {
            Value::List(l) => l
                .iter()
                .enumerate()
                .map(|(i, v)| (Value::Int(i as i64), v.clone()))
                .collect(),
            Value::Map(m) => m
                .entries
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            other => {
                return Err(EvalError::msg(format!(
                    "expression of type {} cannot be range of a comprehension",
                    other.type_name()
                )));
            }
        };
        let is_list = matches!(range, Value::List(_));
        let accu = self.eval(&c.init)?;
        let saved_accu = std::mem::replace(&mut self.locals[c.accu], accu);
        let saved_var = self.locals[c.var].clone();
        let saved_var2 = c.var2.map(|s| self.locals[s].clone());
        let mut outcome: Result<(), EvalError> = Ok(());
        for (key, value) in items {
            if let Err(e) = self.meter.charge(1) {
                outcome = Err(e);
                break;
            }
            match c.var2 {
                Some(s2) => {
                    self.locals[c.var] = key;
                    self.locals[s2] = value;
                }
                None => self.locals[c.var] = if is_list { value } else { key },
            }
            match self.eval(&c.cond) {
                Ok(Value::Bool(false)) => break,
                Ok(Value::Bool(true)) => {}
                Ok(other) => {
                    outcome = Err(EvalError::msg(format!(
                        "comprehension condition is a {}",
                        other.type_name()
                    )));
                    break;
                }
                Err(e) => {
                    outcome = Err(e);
                    break;
                }
            }
            match self.eval(&c.step) {
                Ok(v) => self.locals[c.accu] = v,
                Err(e) => {
                    outcome = Err(e);
                    break;
                }
            }
        }
        let result = outcome.and_then(|()| self.eval(&c.result));
        self.locals[c.accu] = saved_accu;
        self.locals[c.var] = saved_var;
        if let (Some(s2), Some(v)) = (c.var2, saved_var2) {
            self.locals[s2] = v;
        }
        result
    }
}
