//! The functions selectors may call: the CEL standard library subset that applies to device
//! data, the Kubernetes `quantity`, `semver`, `regex` and `lists` libraries, the string and
//! set extensions, and optional values.
//!
//! This module resolves names to [`Func`] and dispatches calls; each family's evaluation is in
//! its submodule.

mod kubernetes;
pub(super) use kubernetes::ordering_result;
mod lists;
mod optional;
mod standard;
mod strings;

use std::sync::Arc;

use super::meter::{EvalError, Meter};
use super::value::Value;

/// A resolved function.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Func {
    // standard
    Size,
    ToInt,
    ToUint,
    ToDouble,
    ToString,
    ToBytes,
    ToBool,
    Dyn,
    Contains,
    StartsWith,
    EndsWith,
    Matches,
    // Kubernetes quantity and semver
    Quantity,
    IsQuantity,
    Semver,
    IsSemver,
    CompareTo,
    IsGreaterThan,
    IsLessThan,
    QAdd,
    QSub,
    AsInteger,
    AsApproximateFloat,
    Sign,
    IsInteger,
    Major,
    Minor,
    Patch,
    // Kubernetes regex
    Find,
    FindAll,
    // strings extension
    CharAt,
    IndexOf,
    LastIndexOf,
    LowerAscii,
    UpperAscii,
    Replace,
    Split,
    Substring,
    Trim,
    Join,
    Reverse,
    StringsQuote,
    // lists
    IsSorted,
    Sum,
    Min,
    Max,
    Slice,
    Flatten,
    Distinct,
    Sort,
    // DRA list attributes
    Includes,
    // sets
    SetsContains,
    SetsEquivalent,
    SetsIntersects,
    // optional
    OptionalOf,
    OptionalNone,
    OptionalOfNonZero,
    HasValue,
    OptValue,
    OrValue,
    OptOr,
}

impl Func {
    /// Finds the function called `name` as a global (`member == false`) or member function
    /// with `argc` arguments (not counting the receiver).
    pub(crate) fn resolve(name: &str, member: bool, argc: usize) -> Option<Func> {
        use Func::*;
        let f = match (member, name, argc) {
            (false, "size", 1) | (true, "size", 0) => Size,
            (false, "int", 1) => ToInt,
            (false, "uint", 1) => ToUint,
            (false, "double", 1) => ToDouble,
            (false, "string", 1) => ToString,
            (false, "bytes", 1) => ToBytes,
            (false, "bool", 1) => ToBool,
            (false, "dyn", 1) => Dyn,
            (true, "contains", 1) => Contains,
            (true, "startsWith", 1) => StartsWith,
            (true, "endsWith", 1) => EndsWith,
            (false, "matches", 2) | (true, "matches", 1) => Matches,
            (false, "quantity", 1) => Quantity,
            (false, "isQuantity", 1) => IsQuantity,
            (false, "semver", 1 | 2) => Semver,
            (false, "isSemver", 1 | 2) => IsSemver,
            (true, "compareTo", 1) => CompareTo,
            (true, "isGreaterThan", 1) => IsGreaterThan,
            (true, "isLessThan", 1) => IsLessThan,
            (true, "add", 1) => QAdd,
            (true, "sub", 1) => QSub,
            (true, "asInteger", 0) => AsInteger,
            (true, "asApproximateFloat", 0) => AsApproximateFloat,
            // A global function in the Kubernetes quantity library (its docs show a member).
            (false, "sign", 1) => Sign,
            (true, "isInteger", 0) => IsInteger,
            (true, "major", 0) => Major,
            (true, "minor", 0) => Minor,
            (true, "patch", 0) => Patch,
            (true, "find", 1) => Find,
            (true, "findAll", 1 | 2) => FindAll,
            (true, "charAt", 1) => CharAt,
            (true, "indexOf", 1 | 2) => IndexOf,
            (true, "lastIndexOf", 1 | 2) => LastIndexOf,
            (true, "lowerAscii", 0) => LowerAscii,
            (true, "upperAscii", 0) => UpperAscii,
            (true, "replace", 2 | 3) => Replace,
            (true, "split", 1 | 2) => Split,
            (true, "substring", 1 | 2) => Substring,
            (true, "trim", 0) => Trim,
            (true, "join", 0 | 1) => Join,
            (true, "reverse", 0) => Reverse,
            (false, "strings.quote", 1) => StringsQuote,
            (true, "includes", 1) => Includes,
            (true, "isSorted", 0) => IsSorted,
            (true, "sum", 0) => Sum,
            (true, "min", 0) => Min,
            (true, "max", 0) => Max,
            (true, "slice", 2) => Slice,
            (true, "flatten", 0 | 1) => Flatten,
            (true, "distinct", 0) => Distinct,
            (true, "sort", 0) => Sort,
            (false, "sets.contains", 2) => SetsContains,
            (false, "sets.equivalent", 2) => SetsEquivalent,
            (false, "sets.intersects", 2) => SetsIntersects,
            (false, "optional.of", 1) => OptionalOf,
            (false, "optional.none", 0) => OptionalNone,
            (false, "optional.ofNonZeroValue", 1) => OptionalOfNonZero,
            (true, "hasValue", 0) => HasValue,
            (true, "value", 0) => OptValue,
            (true, "orValue", 1) => OrValue,
            (true, "or", 1) => OptOr,
            _ => return None,
        };
        Some(f)
    }

    /// The static result type when it does not depend on the arguments.
    pub(crate) fn result_type(self) -> Option<&'static str> {
        use Func::*;
        Some(match self {
            Size | ToInt | CompareTo | Sign | AsInteger | CharAt | IndexOf | LastIndexOf
            | Major | Minor | Patch => match self {
                CharAt => "string",
                _ => "int",
            },
            ToUint => "uint",
            ToDouble | AsApproximateFloat => "double",
            ToString | LowerAscii | UpperAscii | Replace | Substring | Trim | Join
            | StringsQuote => "string",
            ToBytes => "bytes",
            ToBool | Contains | StartsWith | EndsWith | Matches | IsQuantity | IsSemver
            | IsGreaterThan | IsLessThan | IsInteger | IsSorted | SetsContains | SetsEquivalent
            | SetsIntersects | HasValue | Includes => "bool",
            Quantity | QAdd | QSub => "quantity",
            Semver => "semver",
            Split | FindAll | Flatten | Distinct | Sort | Slice => "list",
            OptionalOf | OptionalNone | OptionalOfNonZero | OptOr => "optional",
            _ => return None,
        })
    }

    /// The CEL name, for error messages.
    pub(crate) fn name(self) -> &'static str {
        use Func::*;
        match self {
            Size => "size",
            ToInt => "int",
            ToUint => "uint",
            ToDouble => "double",
            ToString => "string",
            ToBytes => "bytes",
            ToBool => "bool",
            Dyn => "dyn",
            Contains => "contains",
            StartsWith => "startsWith",
            EndsWith => "endsWith",
            Matches => "matches",
            Quantity => "quantity",
            IsQuantity => "isQuantity",
            Semver => "semver",
            IsSemver => "isSemver",
            CompareTo => "compareTo",
            IsGreaterThan => "isGreaterThan",
            IsLessThan => "isLessThan",
            QAdd => "add",
            QSub => "sub",
            AsInteger => "asInteger",
            AsApproximateFloat => "asApproximateFloat",
            Sign => "sign",
            IsInteger => "isInteger",
            Major => "major",
            Minor => "minor",
            Patch => "patch",
            Find => "find",
            FindAll => "findAll",
            CharAt => "charAt",
            IndexOf => "indexOf",
            LastIndexOf => "lastIndexOf",
            LowerAscii => "lowerAscii",
            UpperAscii => "upperAscii",
            Replace => "replace",
            Split => "split",
            Substring => "substring",
            Trim => "trim",
            Join => "join",
            Reverse => "reverse",
            StringsQuote => "strings.quote",
            IsSorted => "isSorted",
            Sum => "sum",
            Min => "min",
            Max => "max",
            Slice => "slice",
            Flatten => "flatten",
            Distinct => "distinct",
            Sort => "sort",
            SetsContains => "sets.contains",
            SetsEquivalent => "sets.equivalent",
            SetsIntersects => "sets.intersects",
            Includes => "includes",
            OptionalOf => "optional.of",
            OptionalNone => "optional.none",
            OptionalOfNonZero => "optional.ofNonZeroValue",
            HasValue => "hasValue",
            OptValue => "value",
            OrValue => "orValue",
            OptOr => "or",
        }
    }
}

pub(super) fn no_overload(f: Func, args: &[Value]) -> EvalError {
    let types: Vec<&str> = args.iter().map(Value::type_name).collect();
    EvalError::msg(format!(
        "no such overload: {}({})",
        f.name(),
        types.join(", ")
    ))
}

/// One tenth of a length, rounded up: the cost of scanning text, as CEL charges it.
pub(super) fn tenth(n: usize) -> u64 {
    (n as u64).div_ceil(10)
}

pub(super) fn regex_for(pattern: &str, meter: &mut Meter) -> Result<Arc<regex::Regex>, EvalError> {
    meter.charge(tenth(pattern.len()))?;
    meter.regex(pattern)
}

pub(super) fn char_count(s: &str) -> usize {
    s.chars().count()
}

pub(super) fn list_value(items: Vec<Value>) -> Value {
    Value::List(Arc::new(items))
}

/// Calls `f` with evaluated arguments (receiver first for member functions).
pub(crate) fn call(f: Func, args: &[Value], meter: &mut Meter) -> Result<Value, EvalError> {
    use Func::*;
    meter.charge(1)?;
    match f {
        Size | ToInt | ToUint | ToDouble | ToString | ToBytes | ToBool | Dyn | Contains
        | StartsWith | EndsWith | Matches => standard::call(f, args, meter),
        Find | FindAll => kubernetes::regex(f, args, meter),
        Quantity | IsQuantity | Semver | IsSemver | CompareTo | IsGreaterThan | IsLessThan
        | QAdd | QSub | AsInteger | AsApproximateFloat | Sign | IsInteger | Major | Minor
        | Patch => kubernetes::quantity_semver(f, args, meter),
        CharAt | IndexOf | LastIndexOf | Substring => strings::positions(f, args, meter),
        LowerAscii | UpperAscii | Replace | Split | Trim | Join | Reverse | StringsQuote => {
            strings::transforms(f, args, meter)
        }
        IsSorted | Sum | Min | Max | Slice | Flatten | Distinct | Sort => {
            lists::call(f, args, meter)
        }
        SetsContains | SetsEquivalent | SetsIntersects => lists::sets(f, args, meter),
        Includes => lists::includes(args, meter),
        OptionalOf | OptionalNone | OptionalOfNonZero | HasValue | OptValue | OrValue | OptOr => {
            optional::call(f, args)
        }
    }
}
