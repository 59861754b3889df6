#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::numeric::Version;
use super::*;

fn q(s: &str) -> Quantity {
    Quantity::parse(s).expect("quantity")
}

fn gpu() -> DeviceContext {
    DeviceContext::new(
        "gpu.example.com",
        vec![
            ("model".to_string(), AttributeValue::String("h100".into())),
            ("numa".to_string(), AttributeValue::Int(1)),
            ("healthy".to_string(), AttributeValue::Bool(true)),
            (
                "driverVersion".to_string(),
                AttributeValue::Version(Version::parse("560.35.3").expect("version")),
            ),
            (
                "pci.example.com/root".to_string(),
                AttributeValue::String("pci0000:00".into()),
            ),
        ],
        vec![("memory".to_string(), q("80Gi"))],
        false,
    )
}

fn run(expr: &str) -> Result<bool, String> {
    let p = compile_uncached(expr).map_err(|e| format!("compile: {e}"))?;
    evaluate(&p, &gpu()).map_err(|e| format!("runtime: {e}"))
}

fn short(expr: &str) -> String {
    expr.chars().take(80).collect()
}

#[track_caller]
fn yes(expr: &str) {
    assert_eq!(run(expr), Ok(true), "{}", short(expr));
}

#[track_caller]
fn no(expr: &str) {
    assert_eq!(run(expr), Ok(false), "{}", short(expr));
}

#[track_caller]
fn compile_err(expr: &str, needle: &str) {
    match run(expr) {
        Err(e) if e.starts_with("compile") && e.contains(needle) => {}
        other => panic!(
            "{}: expected compile error with {needle:?}, got {other:?}",
            short(expr)
        ),
    }
}

#[track_caller]
fn runtime_err(expr: &str, needle: &str) {
    match run(expr) {
        Err(e) if e.starts_with("runtime") && e.contains(needle) => {}
        other => panic!(
            "{}: expected runtime error with {needle:?}, got {other:?}",
            short(expr)
        ),
    }
}

#[test]
fn device_variable() {
    yes(r#"device.driver == "gpu.example.com""#);
    yes(r#"device.attributes["gpu.example.com"].model == "h100""#);
    yes(r#"device.attributes["gpu.example.com"]["numa"] == 1"#);
    yes(r#"device.attributes["pci.example.com"].root == "pci0000:00""#);
    yes(r#"device.attributes["gpu.example.com"].healthy"#);
    yes(r#"device.capacity["gpu.example.com"].memory.compareTo(quantity("40Gi")) >= 0"#);
    yes(r#"!device.allowMultipleAllocations"#);
    // Unknown domains are empty maps; unknown ids are errors.
    yes(r#"size(device.attributes["other.example.com"]) == 0"#);
    no(r#""other.example.com" in device.attributes"#);
    yes(r#""gpu.example.com" in device.attributes"#);
    runtime_err(
        r#"device.attributes["gpu.example.com"].missing == "x""#,
        "no such key: missing",
    );
    yes(r#"has(device.attributes["gpu.example.com"].model)"#);
    no(r#"has(device.attributes["gpu.example.com"].missing)"#);
    compile_err("device.nosuchfield", "undefined field");
}

#[test]
fn logic_absorbs_errors() {
    yes(
        r#"device.attributes["gpu.example.com"].missing == "x" || device.driver == "gpu.example.com""#,
    );
    yes(r#"device.driver == "gpu.example.com" || device.attributes["gpu.example.com"].missing"#);
    no(r#"device.attributes["gpu.example.com"].missing == "x" && false"#);
    runtime_err(
        r#"device.attributes["gpu.example.com"].missing == "x" && true"#,
        "no such key",
    );
    no(
        r#"["a", "b"].all(x, device.attributes["gpu.example.com"].missing == x || false)"#
            .replace("|| false", "&& false")
            .as_str(),
    );
    yes(r#"[1, 2, 3].exists(x, x == 2)"#);
    yes(r#"[1, 2, 3].exists_one(x, x > 2)"#);
    yes(r#"[1, 2, 3].map(x, x * 2) == [2, 4, 6]"#);
    yes(r#"[1, 2, 3].filter(x, x > 1).size() == 2"#);
    yes(r#"device.attributes["gpu.example.com"].exists(k, k == "model")"#);
}

#[test]
fn kubernetes_semver() {
    yes(r#"device.attributes["gpu.example.com"].driverVersion.isGreaterThan(semver("550.0.0"))"#);
    yes(r#"device.attributes["gpu.example.com"].driverVersion.compareTo(semver("560.35.3")) == 0"#);
    yes(r#"device.attributes["gpu.example.com"].driverVersion.major() == 560"#);
    yes(r#"semver("1.2.3").minor() == 2 && semver("1.2.3").patch() == 3"#);
    yes(r#"isSemver("1.2.3") && !isSemver("1.2") && isSemver("v1.2", true)"#);
    yes(r#"semver("v1.2", true) == semver("1.2.0")"#);
    yes(r#"semver("1.0.0-alpha").isLessThan(semver("1.0.0"))"#);
    runtime_err(r#"semver("not-a-version").major() == 1"#, "invalid semver");
}

#[test]
fn kubernetes_quantity() {
    yes(r#"quantity("1Gi").isGreaterThan(quantity("1G"))"#);
    yes(r#"quantity("1Gi").add(quantity("1Gi")) == quantity("2Gi")"#);
    yes(r#"quantity("2Gi").sub(quantity("1Gi")).compareTo(quantity("1Gi")) == 0"#);
    yes(r#"quantity("5").add(3).asInteger() == 8"#);
    yes(r#"quantity("1500m").asApproximateFloat() == 1.5"#);
    // `sign` is a global function of the Kubernetes quantity library, not a member.
    yes(r#"sign(quantity("-3")) == -1 && sign(quantity("0")) == 0"#);
    yes(r#"quantity("2").isInteger() && !quantity("1500m").isInteger()"#);
    yes(r#"isQuantity("10Mi") && !isQuantity("10 Mi")"#);
    runtime_err(r#"sign(quantity("ten")) == 1"#, "invalid quantity");
    runtime_err(r#"quantity("1500m").asInteger() == 1"#, "cannot convert");
}

#[test]
fn strings_lists_sets_regex() {
    yes(r#""h100".startsWith("h") && "h100".endsWith("00") && "h100".contains("10")"#);
    yes(r#"device.attributes["gpu.example.com"].model.matches("^h[0-9]+$")"#);
    yes(r#""a,b,c".split(",") == ["a", "b", "c"]"#);
    yes(r#"["a", "b"].join("-") == "a-b""#);
    yes(r#""Hello".lowerAscii() == "hello" && "hello".upperAscii() == "HELLO""#);
    yes(r#""hello".substring(1, 3) == "el" && "hello".charAt(1) == "e""#);
    yes(r#""hello".indexOf("l") == 2 && "hello".lastIndexOf("l") == 3"#);
    yes(r#""  x ".trim() == "x" && "aXa".replace("a", "b") == "bXb""#);
    yes(r#"[3, 1, 2].sort() == [1, 2, 3] && [1, 2, 3].isSorted()"#);
    yes(r#"[1, 2, 3].sum() == 6 && [1, 2, 3].min() == 1 && [1, 2, 3].max() == 3"#);
    yes(
        r#"sets.contains([1, 2, 3], [2]) && sets.intersects([1], [1, 5]) && sets.equivalent([1, 2], [2, 1])"#,
    );
    yes(r#""abc123".find("[0-9]+") == "123" && "a1b2".findAll("[0-9]") == ["1", "2"]"#);
    yes(r#"size("héllo") == 5"#);
}

#[test]
fn optionals_and_bind() {
    yes(r#"device.attributes["gpu.example.com"].?missing.orValue("none") == "none""#);
    yes(r#"device.attributes["gpu.example.com"].?model.orValue("none") == "h100""#);
    yes(r#"device.attributes["gpu.example.com"][?"numa"].hasValue()"#);
    yes(r#"optional.of(1).value() == 1 && !optional.none().hasValue()"#);
    yes(r#"cel.bind(g, device.attributes["gpu.example.com"], g.model == "h100" && g.numa == 1)"#);
}

#[test]
fn numbers() {
    yes("dyn(1) == 1.0 && dyn(1u) == 1 && 2 > 1.5 && 3u < 4");
    compile_err("1 == 1.0", "no matching overload");
    yes("7 / 2 == 3 && 7 % 2 == 1 && -7 / 2 == -3");
    runtime_err("9223372036854775807 + 1 > 0", "overflow");
    runtime_err("1 / 0 == 0", "division by zero");
    yes("int(\"42\") == 42 && double(1) == 1.0 && string(5) == \"5\"");
}

#[test]
fn compile_errors() {
    compile_err("noSuchVar", "undeclared reference to 'noSuchVar'");
    compile_err("foo(1)", "undeclared reference to 'foo'");
    compile_err("device.driver", "must evaluate to bool");
    compile_err("1 + 2", "must evaluate to bool");
    compile_err(r#"device.driver == 1"#, "no matching overload");
    compile_err("device.driver ==", "syntax error");
    compile_err(r#"quantity("1").sign() == 1"#, "sign");
    // `!` binds tighter than `in`: this is `(!"model") in ...`.
    compile_err(
        r#"!"model" in device.attributes["a"]"#,
        "found no matching overload for '!_' applied to '(string)'",
    );
    compile_err(
        r#"device.driver && true"#,
        "'_&&_' applied to '(string, bool)'",
    );
    compile_err(r#"1 || true"#, "'_||_' applied to '(int, bool)'");
    compile_err(
        r#"!device.attributes["a"].model in ["a100", "l4"]"#,
        "found no matching overload for '@in' applied to '(bool, list(string))'",
    );
    compile_err(r#"1 in {"a": 1}"#, "'@in' applied to '(int, map)'");
    yes(r#"1 in [1, "a"] && "a" in ["a", 2]"#);
    compile_err(
        r#"(device.driver ? true : false)"#,
        "'_?_:_' applied to '(string)'",
    );
    let long = format!("{}true", " ".repeat(MAX_CODE_POINTS));
    compile_err(
        &long,
        "expression code point size exceeds limit: size: 100004, limit 100000",
    );
}

/// The scheduler's limits on stored expressions: no byte limit of its own (only the parser's
/// 100,000 code points) and the parser's recursion limit of 250; the API server's 10 KiB applies
/// when a selector is written.
#[test]
fn limits_are_the_schedulers_and_the_length_limit_is_for_writes() {
    let nested = |n: usize| format!("{}true{}", "(".repeat(n), ")".repeat(n));
    yes(&nested(100));
    yes(&nested(240));
    compile_err(&nested(260), "expression recursion limit exceeded: 250");
    // A stored 24 KB selector (e.g. written before a limit, or by an older server) is valid.
    let alternatives: Vec<String> = (0..1000)
        .map(|i| format!("device.driver == \"driver-{i:05}.example.com\""))
        .collect();
    let stored = alternatives.join(" || ");
    assert!(stored.len() > 24 * 1024, "{}", stored.len());
    no(&stored);
    let e = validate_new(&stored).map(|_| ()).unwrap_err();
    assert!(
        e.to_string()
            .contains("the API server accepts a new or changed selector of at most 10240 bytes"),
        "{e}"
    );
    assert!(validate_new("device.driver == \"a\"").is_ok());
}

#[test]
fn literal_regular_expressions_that_do_not_compile_are_compile_errors() {
    let attr = r#"device.attributes["gpu.example.com"].model"#;
    compile_err(
        &format!(r#"{attr}.matches("[")"#),
        r#"invalid regular expression "[""#,
    );
    compile_err(r#"matches("a", "(")"#, "invalid regular expression");
    compile_err(
        &format!(r#"{attr}.find("a{{2") == "a""#),
        "invalid regular expression",
    );
    compile_err(
        &format!(r#"size({attr}.findAll("*", 2)) == 0"#),
        "invalid regular expression",
    );
    // A pattern known only at evaluation still fails there.
    runtime_err(
        &format!(r#""[".matches({attr} + "[")"#),
        "invalid regular expression",
    );
}

#[test]
fn non_bool_result_is_runtime_error() {
    runtime_err(
        r#"device.attributes["gpu.example.com"].model"#,
        "could not be converted to bool",
    );
}

#[test]
fn hostile_expressions_are_bounded() {
    // Deep nesting is refused before parsing.
    let deep = format!("{}true{}", "(".repeat(5000), ")".repeat(5000));
    compile_err(&deep, "nests");
    // A long left-deep chain parses but is refused by the tree depth limit.
    let chain = format!("{} == 2", vec!["1"; 4000].join("+"));
    compile_err(&chain, "nests");
    // A long balanced || chain is fine.
    let ors = vec!["device.driver == \"x\""; 200].join(" || ");
    assert_eq!(run(&ors), Ok(false));
    // Nested comprehensions hit the cost limit instead of running for long.
    let range = format!(
        "[{}]",
        (0..100)
            .map(|i| i.to_string())
            .collect::<Vec<_>>()
            .join(",")
    );
    let bomb = format!(
        "{r}.all(a, {r}.all(b, {r}.all(c, a + b + c >= 0)))",
        r = range
    );
    let p = compile_uncached(&bomb).expect("compiles");
    let err = evaluate(&p, &gpu()).expect_err("cost limit");
    assert!(err.is_cost_limit(), "{err}");
    // Doubling lists is charged per element.
    let doubling = (0..40).fold("[1]".to_string(), |acc, i| {
        format!("cel.bind(l{i}, {acc}, l{i} + l{i})")
    });
    let p = compile_uncached(&format!("size({doubling}) > 0")).expect("compiles");
    assert!(evaluate(&p, &gpu()).expect_err("limit").is_cost_limit());
}

#[test]
fn compile_cache_returns_same_program() {
    let a = compile("device.driver == \"cache-test\"").expect("compiles");
    let b = compile("device.driver == \"cache-test\"").expect("compiles");
    assert!(Arc::ptr_eq(&a, &b));
}

/// A thread's shared interner stops sharing at its cap: past it, names and strings are still
/// right, only not kept.
#[test]
fn the_interner_keeps_at_most_its_cap() {
    let mut interner = Interner::default();
    for i in 0..MAX_INTERNED + 100 {
        let name = format!("example.com/attr{i}");
        let (domain, id) = interner.name(&name, "gpu.example.com");
        assert_eq!((&*domain, &*id), ("example.com", &*format!("attr{i}")));
    }
    assert_eq!(interner.names.len(), MAX_INTERNED);
    assert!(interner.strings.len() <= MAX_INTERNED);
    let s = interner.str("not kept");
    assert_eq!(&*s, "not kept");
    assert!(!interner.strings.contains_key("not kept"));
}

/// The short-string comparison agrees with `==` for every length up to past its word paths,
/// whichever byte differs.
#[test]
fn str_eq_agrees_with_string_equality() {
    for n in 0..24 {
        let base: String = (0..n).map(|i| char::from(b'a' + (i % 26) as u8)).collect();
        assert!(super::str_eq(&base, &base.clone()), "{base}");
        for at in 0..n {
            let mut other = base.clone().into_bytes();
            other[at] = b'Z';
            let other = String::from_utf8(other).unwrap();
            assert!(!super::str_eq(&base, &other), "{base} vs {other}");
        }
        let longer = format!("{base}x");
        assert!(!super::str_eq(&base, &longer));
    }
}

/// Comparing a device entry with a string literal (read where the string lies) answers as
/// the general comparison does, either way round, for strings, other types and missing
/// entries, and costs the same as comparing the entry with any other operand of no cost.
#[test]
fn entry_literal_comparisons_equal_the_general_path() {
    let d = r#"device.attributes["gpu.example.com"]"#;
    // The general path: the literal reached through a variable binding it.
    let general =
        |entry: &str, op: &str, lit: &str| format!(r#"cel.bind(v, "{lit}", {entry} {op} v)"#);
    let cases = [
        (format!("{d}.model"), "h100"),
        (format!("{d}.model"), "a100"),
        (format!("{d}.numa"), "1"),
        (format!("{d}.healthy"), "true"),
        (format!("{d}.missing"), "x"),
        (
            r#"device.attributes["pci.example.com"].root"#.to_string(),
            "pci0000:00",
        ),
    ];
    for (entry, lit) in &cases {
        for op in ["==", "!="] {
            let fast = run(&format!(r#"{entry} {op} "{lit}""#));
            let flipped = run(&format!(r#""{lit}" {op} {entry}"#));
            let slow = run(&general(entry, op, lit));
            assert_eq!(fast, slow, "{entry} {op} {lit:?}");
            assert_eq!(flipped, slow, "{lit:?} {op} {entry}");
        }
    }
    // Cost: the entry (3) and the comparison (1), as for an integer literal.
    let cost = |expr: &str| {
        let p = compile_uncached(expr).expect("compiles");
        evaluate_with_limit(&p, &gpu(), COST_LIMIT).map(|(_, c)| c)
    };
    assert_eq!(
        cost(&format!(r#"{d}.model == "h100""#)),
        cost(&format!("{d}.numa == 1"))
    );
}

/// A capacity compared with a quantity literal, and `device.driver` compared with a string
/// literal, answer as the general path does (the literal bound to a variable), missing
/// entries included, at the general path's cost.
#[test]
fn capacity_and_driver_literal_comparisons_equal_the_general_path() {
    let c = r#"device.capacity["gpu.example.com"]"#;
    for entry in [format!("{c}.memory"), format!("{c}.missing")] {
        for (f, test) in [
            ("compareTo", " >= 0"),
            ("compareTo", " == -1"),
            ("isGreaterThan", ""),
            ("isLessThan", ""),
        ] {
            for lit in ["40Gi", "80Gi", "100Gi"] {
                let fast = run(&format!(r#"{entry}.{f}(quantity("{lit}")){test}"#));
                let slow = run(&format!(
                    r#"cel.bind(b, quantity("{lit}"), {entry}.{f}(b){test})"#
                ));
                assert_eq!(fast, slow, "{entry}.{f}({lit}){test}");
            }
        }
    }
    for lit in ["gpu.example.com", "other.example.com"] {
        for op in ["==", "!="] {
            let fast = run(&format!(r#"device.driver {op} "{lit}""#));
            let flipped = run(&format!(r#""{lit}" {op} device.driver"#));
            let slow = run(&format!(r#"cel.bind(v, "{lit}", device.driver {op} v)"#));
            assert_eq!(fast, slow, "device.driver {op} {lit:?}");
            assert_eq!(flipped, slow, "{lit:?} {op} device.driver");
        }
    }
    let cost = |expr: &str| {
        let p = compile_uncached(expr).expect("compiles");
        evaluate_with_limit(&p, &gpu(), COST_LIMIT)
            .map(|(_, c)| c)
            .expect("evaluates")
    };
    // The literal costs nothing where another entry costs 3; `device.driver` costs 1.
    assert_eq!(
        cost(&format!(r#"{c}.memory.compareTo(quantity("40Gi")) >= 0"#)) + 3,
        cost(&format!("{c}.memory.compareTo({c}.memory) >= 0"))
    );
    assert_eq!(
        cost(r#"device.driver == "gpu.example.com""#) + 1,
        cost("device.driver == device.driver")
    );
}
