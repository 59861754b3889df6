//! Tree-walking evaluation with a cost meter.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;

use super::DeviceVars;
use super::compile::{BinOp, Comprehension, DeviceField, Node, Program};
use super::library;
use super::value::{MapValue, Value, empty_map};

/// Why an evaluation failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct EvalError {
    pub(crate) message: String,
    /// Fatal errors (the cost limit) are never absorbed by `&&`, `||` or macros.
    pub(crate) fatal: bool,
}

impl EvalError {
    pub(crate) fn msg(message: impl Into<String>) -> EvalError {
        EvalError {
            message: message.into(),
            fatal: false,
        }
    }
}

/// Counts evaluation cost and stops at the limit.
#[derive(Debug)]
pub(crate) struct Meter {
    pub(crate) cost: u64,
    pub(crate) limit: u64,
}

static REGEX_CACHE: Mutex<Option<HashMap<String, Arc<regex::Regex>>>> = Mutex::new(None);
const REGEX_CACHE_MAX: usize = 1024;

/// Compiles a regular expression of `matches`, `find` or `findAll` under the size limits every
/// evaluation uses; the error says in one line what is wrong with the pattern.
pub(crate) fn build_regex(pattern: &str) -> Result<regex::Regex, String> {
    regex::RegexBuilder::new(pattern)
        .size_limit(1 << 20)
        .dfa_size_limit(1 << 20)
        .build()
        .map_err(|e| {
            // A syntax error shows the pattern with a caret, then `error: <what>`.
            let text = kubedev_core::echo::chain(&e);
            text.lines()
                .find_map(|l| l.strip_prefix("error: "))
                .map_or_else(|| text.replace('\n', " "), str::to_owned)
        })
}

impl Meter {
    #[inline]
    pub(crate) fn charge(&mut self, units: u64) -> Result<(), EvalError> {
        self.cost = self.cost.saturating_add(units);
        if self.cost > self.limit {
            return Err(EvalError {
                message: format!(
                    "operation cancelled: actual cost limit exceeded (limit {})",
                    self.limit
                ),
                fatal: true,
            });
        }
        Ok(())
    }

    /// A compiled regular expression, shared across evaluations. Size limits keep hostile
    /// patterns from taking much memory.
    pub(crate) fn regex(&mut self, pattern: &str) -> Result<Arc<regex::Regex>, EvalError> {
        let mut guard = REGEX_CACHE.lock();
        let cache = guard.get_or_insert_with(HashMap::new);
        if let Some(re) = cache.get(pattern) {
            return Ok(re.clone());
        }
        let re = build_regex(pattern)
            .map_err(|e| EvalError::msg(format!("invalid regular expression {pattern:?}: {e}")))?;
        let re = Arc::new(re);
        if cache.len() >= REGEX_CACHE_MAX {
            cache.clear();
        }
        cache.insert(pattern.to_string(), re.clone());
        Ok(re)
    }
}

pub(crate) struct Evaluator<'a> {
    device: &'a dyn DeviceVars,
    locals: Vec<Value>,
    pub(crate) meter: Meter,
}

type R = Result<Value, EvalError>;

fn no_overload(op: &str, a: &Value, b: &Value) -> EvalError {
    EvalError::msg(format!(
        "no such overload: {}({}, {})",
        op,
        a.type_name(),
        b.type_name()
    ))
}

impl<'a> Evaluator<'a> {
    pub(crate) fn new(program: &Program, device: &'a dyn DeviceVars, limit: u64) -> Self {
        Evaluator {
            device,
            locals: vec![Value::Null; program.slots],
            meter: Meter { cost: 0, limit },
        }
    }

    fn device_field(&self, f: DeviceField) -> Value {
        match f {
            DeviceField::Driver => self.device.driver(),
            DeviceField::Attributes => self.device.attributes(),
            DeviceField::Capacity => self.device.capacity(),
            DeviceField::AllowMultipleAllocations => Value::Bool(self.device.allow_multiple()),
        }
    }

    pub(crate) fn eval(&mut self, n: &Node) -> R {
        match n {
            Node::Lit(v) => Ok(v.clone()),
            Node::Local(slot) => {
                self.meter.charge(1)?;
                Ok(self.locals[*slot].clone())
            }
            Node::DeviceVar => self.eval_device_var(),
            Node::Device(f) => {
                self.meter.charge(1)?;
                Ok(self.device_field(*f))
            }
            Node::DeviceEntry { field, domain, id } => self.eval_device_entry(field, domain, id),
            Node::Select(operand, field) => self.eval_select(operand, field),
            Node::Has(operand, field) => self.eval_has(operand, field),
            Node::OptSelect(operand, field) => self.eval_opt_select(operand, field),
            Node::Index(operand, index) => self.eval_index(operand, index),
            Node::OptIndex(operand, index) => self.eval_opt_index(operand, index),
            Node::And(a, b) => self.logic(a, b, false),
            Node::Or(a, b) => self.logic(a, b, true),
            Node::Not(a) => self.eval_not(a),
            Node::NotStrictlyFalse(a) => match self.eval(a) {
                Ok(Value::Bool(false)) => Ok(Value::Bool(false)),
                Err(e) if e.fatal => Err(e),
                _ => Ok(Value::Bool(true)),
            },
            Node::Cond(c) => self.eval_cond(c),
            Node::Neg(a) => self.eval_neg(a),
            Node::Binary(op, a, b) => self.eval_binary(op, a, b),
            Node::List(elements, optional) => self.eval_list(elements, optional),
            Node::Map(entries) => self.eval_map(entries),
            Node::Call(f, args) => self.eval_call(f, args),
            Node::Bind(slot, init, body) => self.eval_bind(slot, init, body),
            Node::Comprehension(c) => self.eval_comprehension(c),
        }
    }

    #[inline(never)]
    fn eval_device_entry(&mut self, field: &DeviceField, domain: &str, id: &str) -> R {
        self.meter.charge(3)?;
        match self
            .device
            .entry(matches!(field, DeviceField::Capacity), domain, id)
        {
            Some(v) => Ok(v),
            None => Err(EvalError::msg(format!("no such key: {id}"))),
        }
    }

    /// `entry == lit` (or `!=`) for a string literal `lit`.
    fn entry_equals(
        &mut self,
        op: BinOp,
        field: &DeviceField,
        domain: &str,
        id: &str,
        lit: &Value,
    ) -> R {
        self.meter.charge(3)?;
        let device = self.device;
        let entry = device.entry_ref(matches!(field, DeviceField::Capacity), domain, id);
        let Some(entry) = entry else {
            return Err(EvalError::msg(format!("no such key: {id}")));
        };
        self.meter.charge(1)?;
        match entry {
            super::EntryRef::Str(s) => {
                let equal = matches!(lit, Value::String(l) if s == &**l);
                Ok(Value::Bool(if op == BinOp::Ne { !equal } else { equal }))
            }
            super::EntryRef::Value(v) => self.binary(op, &v, lit),
        }
    }

    #[inline(never)]
    fn eval_select(&mut self, operand: &Node, field: &str) -> R {
        let v = self.eval(operand)?;
        self.meter.charge(1)?;
        select(&v, field)
    }

    #[inline(never)]
    fn eval_has(&mut self, operand: &Node, field: &str) -> R {
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
    fn eval_index(&mut self, operand: &Node, index: &Node) -> R {
        let v = self.eval(operand)?;
        let i = self.eval(index)?;
        self.meter.charge(1)?;
        index_value(&v, &i)
    }

    #[inline(never)]
    fn eval_not(&mut self, a: &Node) -> R {
        let v = self.eval(a)?;
        self.meter.charge(1)?;
        match v {
            Value::Bool(b) => Ok(Value::Bool(!b)),
            other => Err(EvalError::msg(format!(
                "no such overload: !_({})",
                other.type_name()
            ))),
        }
    }

    #[inline(never)]
    fn eval_cond(&mut self, c: &(Node, Node, Node)) -> R {
        let cond = self.eval(&c.0)?;
        self.meter.charge(1)?;
        match cond {
            Value::Bool(true) => self.eval(&c.1),
            Value::Bool(false) => self.eval(&c.2),
            other => Err(EvalError::msg(format!(
                "no such overload: _?_:_({})",
                other.type_name()
            ))),
        }
    }

    #[inline(never)]
    fn eval_neg(&mut self, a: &Node) -> R {
        let v = self.eval(a)?;
        self.meter.charge(1)?;
        match v {
            Value::Int(i) => i
                .checked_neg()
                .map(Value::Int)
                .ok_or_else(|| EvalError::msg("integer overflow")),
            Value::Double(d) => Ok(Value::Double(-d)),
            other => Err(EvalError::msg(format!(
                "no such overload: -_({})",
                other.type_name()
            ))),
        }
    }

    #[inline(never)]
    fn eval_bind(&mut self, slot: &usize, init: &Node, body: &Node) -> R {
        let v = self.eval(init)?;
        let saved = std::mem::replace(&mut self.locals[*slot], v);
        let r = self.eval(body);
        self.locals[*slot] = saved;
        r
    }

    #[inline(never)]
    fn eval_device_var(&mut self) -> R {
        self.meter.charge(1)?;
        let mut m = MapValue::default();
        for (k, f) in [
            ("driver", DeviceField::Driver),
            ("attributes", DeviceField::Attributes),
            ("capacity", DeviceField::Capacity),
            (
                "allowMultipleAllocations",
                DeviceField::AllowMultipleAllocations,
            ),
        ] {
            m.entries.push((Value::str(k), self.device_field(f)));
        }
        Ok(Value::Map(Arc::new(m)))
    }

    #[inline(never)]
    fn eval_opt_select(&mut self, operand: &Node, field: &str) -> R {
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
    fn eval_opt_index(&mut self, operand: &Node, index: &Node) -> R {
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

    #[inline(never)]
    fn eval_binary(&mut self, op: &BinOp, a: &Node, b: &Node) -> R {
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
        }
        let x = self.eval(a)?;
        let y = self.eval(b)?;
        self.meter.charge(1)?;
        self.binary(*op, &x, &y)
    }

    #[inline(never)]
    fn eval_list(&mut self, elements: &[Node], optional: &[usize]) -> R {
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
    fn eval_map(&mut self, entries: &[(Node, Node, bool)]) -> R {
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

    #[inline(never)]
    fn eval_call(&mut self, f: &library::Func, args: &[Node]) -> R {
        // Most calls have one to three arguments (the receiver first): no vector for them.
        match args {
            [] => library::call(*f, &[], &mut self.meter),
            [a] => {
                let a = self.eval(a)?;
                library::call(*f, &[a], &mut self.meter)
            }
            [a, b] => {
                let a = self.eval(a)?;
                let b = self.eval(b)?;
                library::call(*f, &[a, b], &mut self.meter)
            }
            [a, b, c] => {
                let a = self.eval(a)?;
                let b = self.eval(b)?;
                let c = self.eval(c)?;
                library::call(*f, &[a, b, c], &mut self.meter)
            }
            _ => {
                let mut values = Vec::with_capacity(args.len());
                for a in args {
                    values.push(self.eval(a)?);
                }
                library::call(*f, &values, &mut self.meter)
            }
        }
    }

    #[inline(never)]
    fn eval_comprehension(&mut self, c: &Comprehension) -> R {
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

    /// `&&` (`or == false`) and `||` with CEL's commutative error handling: a decisive
    /// operand wins over an error on the other side.
    fn logic(&mut self, a: &Node, b: &Node, or: bool) -> R {
        self.meter.charge(1)?;
        let decisive = or;
        let left = match self.eval(a) {
            Ok(Value::Bool(x)) if x == decisive => return Ok(Value::Bool(decisive)),
            Ok(Value::Bool(_)) => None,
            Ok(other) => Some(EvalError::msg(format!(
                "no such overload: {}({})",
                if or { "_||_" } else { "_&&_" },
                other.type_name()
            ))),
            Err(e) if e.fatal => return Err(e),
            Err(e) => Some(e),
        };
        match self.eval(b) {
            Ok(Value::Bool(x)) if x == decisive => Ok(Value::Bool(decisive)),
            Ok(Value::Bool(x)) => match left {
                None => Ok(Value::Bool(x)),
                Some(e) => Err(e),
            },
            Ok(other) => Err(left.unwrap_or_else(|| {
                EvalError::msg(format!(
                    "no such overload: {}({})",
                    if or { "_||_" } else { "_&&_" },
                    other.type_name()
                ))
            })),
            Err(e) if e.fatal => Err(e),
            Err(e) => Err(left.unwrap_or(e)),
        }
    }

    fn binary(&mut self, op: BinOp, x: &Value, y: &Value) -> R {
        use Value::*;
        let name = match op {
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
        };
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

fn select(v: &Value, field: &str) -> R {
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

fn index_value(v: &Value, i: &Value) -> R {
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

fn key_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.to_string(),
        other => other.to_string(),
    }
}
