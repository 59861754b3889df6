//! Tree-walking evaluation with a cost meter.

mod access;
mod literals;
mod locals;
mod operators;

use std::sync::Arc;

use super::DeviceVars;
use super::library;
use super::meter::{EvalError, Meter};
use super::tree::{DeviceField, Node, Program};
use super::value::{MapValue, Value};

/// Evaluates one program's tree for one device: the device read through [`DeviceVars`], the
/// values of local variables by slot, and the cost so far.
pub(crate) struct Evaluator<'a> {
    device: &'a dyn DeviceVars,
    locals: Vec<Value>,
    pub(crate) meter: Meter,
}

/// What evaluating a node gives.
type Evaluated = Result<Value, EvalError>;

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

    pub(crate) fn eval(&mut self, n: &Node) -> Evaluated {
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
    fn eval_device_entry(&mut self, field: &DeviceField, domain: &str, id: &str) -> Evaluated {
        self.meter.charge(3)?;
        match self
            .device
            .entry(matches!(field, DeviceField::Capacity), domain, id)
        {
            Some(v) => Ok(v),
            None => Err(EvalError::msg(format!("no such key: {id}"))),
        }
    }

    #[inline(never)]
    fn eval_not(&mut self, a: &Node) -> Evaluated {
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
    fn eval_cond(&mut self, c: &(Node, Node, Node)) -> Evaluated {
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
    fn eval_neg(&mut self, a: &Node) -> Evaluated {
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
    fn eval_device_var(&mut self) -> Evaluated {
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
    fn eval_call(&mut self, f: &library::Func, args: &[Node]) -> Evaluated {
        use library::Func::{CompareTo, IsGreaterThan, IsLessThan};
        if let (
            CompareTo | IsGreaterThan | IsLessThan,
            [
                Node::DeviceEntry {
                    field: DeviceField::Capacity,
                    domain,
                    id,
                },
                Node::Lit(Value::Quantity(bound)),
            ],
        ) = (f, args)
        {
            return self.capacity_compare(*f, domain, id, bound);
        }
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

    /// A device's capacity compared with a quantity literal (`f` is `compareTo`,
    /// `isGreaterThan` or `isLessThan`): the capacity is read where it lies, with the same
    /// costs and errors as the general path.
    #[inline(never)]
    fn capacity_compare(
        &mut self,
        f: library::Func,
        domain: &str,
        id: &str,
        bound: &Arc<super::numeric::Quantity>,
    ) -> Evaluated {
        self.meter.charge(3)?;
        let other = match self.device.entry_ref(true, domain, id) {
            Some(super::EntryRef::Quantity(q)) => Ok(q),
            Some(super::EntryRef::Value(Value::Quantity(q))) => Ok(*q),
            Some(super::EntryRef::Value(other)) => Err(other),
            Some(super::EntryRef::Str(s)) => Err(Value::str(s)),
            None => return Err(EvalError::msg(format!("no such key: {id}"))),
        };
        // Not a quantity (no device variable gives one): the library answers as it would.
        let capacity = match other {
            Ok(q) => q,
            Err(v) => {
                return library::call(f, &[v, Value::Quantity(bound.clone())], &mut self.meter);
            }
        };
        self.meter.charge(1)?;
        Ok(library::ordering_result(f, capacity.cmp(bound)))
    }

    /// `&&` (`or == false`) and `||` with CEL's commutative error handling: a decisive
    /// operand wins over an error on the other side.
    fn logic(&mut self, a: &Node, b: &Node, or: bool) -> Evaluated {
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
}
