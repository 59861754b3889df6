//! Tests of quantities: parsing, rounding, canonical printing, arithmetic, comparison, serde,
//! and the cases Kubernetes' own tests pin.

use super::*;

fn q(s: &str) -> Quantity {
    Quantity::parse(s).unwrap_or_else(|e| panic!("{s}: {e}"))
}

/// `mantissa × 10^exponent` in `format`.
fn dec(mantissa: i128, exponent: i64, format: Format) -> Quantity {
    Quantity::from_parts(mantissa < 0, mantissa.unsigned_abs(), exponent, format)
        .unwrap_or_else(|| panic!("{mantissa}e{exponent} out of range"))
}

use Format::{BinarySI, DecimalExponent, DecimalSI};

/// Kubernetes' TestQuantityParse table: input, exact value and format.
const PARSE_TABLE: &[(&str, i128, i64, Format)] = &[
    ("0", 0, 0, DecimalSI),
    ("0n", 0, 0, DecimalSI),
    ("0u", 0, 0, DecimalSI),
    ("0m", 0, 0, DecimalSI),
    ("0Ki", 0, 0, BinarySI),
    ("0k", 0, 0, DecimalSI),
    ("0Mi", 0, 0, BinarySI),
    ("0M", 0, 0, DecimalSI),
    ("0Gi", 0, 0, BinarySI),
    ("0G", 0, 0, DecimalSI),
    ("0Ti", 0, 0, BinarySI),
    ("0T", 0, 0, DecimalSI),
    ("1", 1, 0, DecimalSI),
    ("1Ki", 1024, 0, BinarySI),
    ("8Ki", 8 * 1024, 0, BinarySI),
    ("7Mi", 7 * 1024 * 1024, 0, BinarySI),
    ("6Gi", 6 * 1024 * 1024 * 1024, 0, BinarySI),
    ("5Ti", 5 * (1 << 40), 0, BinarySI),
    ("4Pi", 4 * (1 << 50), 0, BinarySI),
    ("3Ei", 3 * (1 << 60), 0, BinarySI),
    ("10Ti", 10 * (1 << 40), 0, BinarySI),
    ("100Ti", 100 * (1 << 40), 0, BinarySI),
    ("5n", 5, -9, DecimalSI),
    ("4u", 4, -6, DecimalSI),
    ("3m", 3, -3, DecimalSI),
    ("9", 9, 0, DecimalSI),
    ("8k", 8, 3, DecimalSI),
    ("50k", 5, 4, DecimalSI),
    ("7M", 7, 6, DecimalSI),
    ("6G", 6, 9, DecimalSI),
    ("5T", 5, 12, DecimalSI),
    ("40T", 4, 13, DecimalSI),
    ("300T", 3, 14, DecimalSI),
    ("2P", 2, 15, DecimalSI),
    ("1E", 1, 18, DecimalSI),
    ("1E-3", 1, -3, DecimalExponent),
    ("1e3", 1, 3, DecimalExponent),
    ("1E6", 1, 6, DecimalExponent),
    ("1e9", 1, 9, DecimalExponent),
    ("1E12", 1, 12, DecimalExponent),
    ("1e15", 1, 15, DecimalExponent),
    ("1E18", 1, 18, DecimalExponent),
    ("1e14", 1, 14, DecimalExponent),
    ("1e13", 1, 13, DecimalExponent),
    ("100.035k", 100035, 0, DecimalSI),
    ("0.001", 1, -3, DecimalSI),
    ("0.0005k", 5, -1, DecimalSI),
    ("0.005", 5, -3, DecimalSI),
    ("0.05", 5, -2, DecimalSI),
    ("0.5", 5, -1, DecimalSI),
    ("0.00050k", 5, -1, DecimalSI),
    ("0.00500", 5, -3, DecimalSI),
    ("0.05000", 5, -2, DecimalSI),
    ("0.50000", 5, -1, DecimalSI),
    ("0.5e0", 5, -1, DecimalExponent),
    ("0.5e-1", 5, -2, DecimalExponent),
    ("0.5e-2", 5, -3, DecimalExponent),
    ("10.035M", 10035, 3, DecimalSI),
    ("1.2e3", 12, 2, DecimalExponent),
    ("1.3E+6", 13, 5, DecimalExponent),
    ("1.40e9", 14, 8, DecimalExponent),
    ("1.53E12", 153, 10, DecimalExponent),
    ("1.6e15", 16, 14, DecimalExponent),
    ("1.7E18", 17, 17, DecimalExponent),
    ("9.01", 901, -2, DecimalSI),
    ("8.1k", 81, 2, DecimalSI),
    ("7.123456M", 7123456, 0, DecimalSI),
    ("6.987654321G", 6987654321, 0, DecimalSI),
    ("5.444T", 5444, 9, DecimalSI),
    ("40.1T", 401, 11, DecimalSI),
    ("300.2T", 3002, 11, DecimalSI),
    ("2.5P", 25, 14, DecimalSI),
    ("1.01E", 101, 16, DecimalSI),
    // Rounded up to the nano, or capped.
    ("3.001n", 4, -9, DecimalSI),
    ("1.1E-9", 2, -9, DecimalExponent),
    ("0.0000000001", 1, -9, DecimalSI),
    ("0.0000000005", 1, -9, DecimalSI),
    ("0.00000000050", 1, -9, DecimalSI),
    ("0.5e-9", 1, -9, DecimalExponent),
    ("0.9n", 1, -9, DecimalSI),
    ("0.00000012345", 124, -9, DecimalSI),
    ("0.00000012354", 124, -9, DecimalSI),
    ("9Ei", i64::MAX as i128, 0, BinarySI),
    ("9223372036854775807Ki", i64::MAX as i128, 0, BinarySI),
    ("12E", 12, 18, DecimalSI),
    // Fractional binary values.
    ("100.035Ki", 10243584, -2, BinarySI),
    ("0.5Mi", 512 * 1024, 0, BinarySI),
    ("0.05Gi", 536870912, -1, BinarySI),
    ("0.025Ti", 274877906944, -1, BinarySI),
    // Written by trolls.
    ("0.000000000001Ki", 2, -9, DecimalSI),
    (".001", 1, -3, DecimalSI),
    (".0001k", 100, -3, DecimalSI),
    ("1.", 1, 0, DecimalSI),
    ("1.G", 1, 9, DecimalSI),
];

#[test]
fn parses_the_kubernetes_table() {
    for &(input, mantissa, exponent, format) in PARSE_TABLE {
        let want = dec(mantissa, exponent, format);
        for (prefix, negate) in [("", false), ("+", false), ("-", true)] {
            let spelled = format!("{prefix}{input}");
            let got = q(&spelled);
            let want = if negate { -want } else { want };
            assert_eq!(got, want, "{spelled}: value");
            assert_eq!(got.format(), format, "{spelled}: format");
        }
    }
}

#[test]
fn rejects_what_kubernetes_rejects() {
    for input in [
        "",
        "1.1.M",
        "1+1.0M",
        "0.1mi",
        "0.1am",
        "aoeu",
        ".5i",
        "1i",
        "-3.01i",
        "-3.01e-",
        "1e4294967297",
        "1e2147483648",
        "1e-2147483648",
        " 1",
        "1 ",
        "1.2.3",
        "Ki1",
        "1Ki1",
        "+-1",
        "-+1",
        "--1",
        "1e",
        "1e+",
        "1ee3",
        "1e3Ki",
        "1Kb",
        "1KiB",
        "1k ",
        "1,5",
        "1_000",
        "0x10",
        "١",
        "1µ",
        "NaN",
        "Inf",
    ] {
        let err = Quantity::parse(input).expect_err(input);
        if !input.is_empty() {
            assert!(
                err.to_string().contains(&format!("{input:?}")),
                "error {err} does not name {input:?}"
            );
        }
    }
}

#[test]
fn rejects_digitless_numbers_that_kubernetes_scanner_reads_as_zero() {
    for input in ["-", "+", ".", "-.", "e3", "Ki", "k"] {
        assert!(
            matches!(Quantity::parse(input), Err(QuantityError::NoDigits { .. })),
            "{input}"
        );
    }
}

#[test]
fn limits_are_errors_not_wraps() {
    let forty = "1234567890123456789012345678901234567890";
    assert!(matches!(
        Quantity::parse(forty),
        Err(QuantityError::TooManyDigits { .. })
    ));
    // 38 digits are fine, and trailing zeros do not count.
    let thirty_eight = &forty[..38];
    assert_eq!(q(thirty_eight).to_string(), thirty_eight);
    assert_eq!(
        q(&format!("{thirty_eight}000")).to_string(),
        format!("{thirty_eight}k")
    );
    // Digits beyond the nano round away instead of counting.
    assert_eq!(q(&format!("0.000000001{forty}")).to_string(), "2n");
    // A binary value of any length is capped, as in Kubernetes.
    assert_eq!(q(&format!("{forty}Ki")), dec(i64::MAX as i128, 0, BinarySI));
    assert_eq!(q("8Ei").to_string(), "9223372036854775807");
    assert_eq!(q("7.99999Ei").format(), BinarySI);
    // Huge and tiny exponents.
    assert_eq!(q("1e2147483647").to_string(), "10e2147483646");
    assert!(matches!(
        Quantity::parse("10e2147483647"),
        Err(QuantityError::OutOfRange { .. })
    ));
    assert_eq!(q("1e-2147483647").to_string(), "1e-9");
    assert_eq!(q("-.484785E-7466").to_string(), "-1e-9");
    assert_eq!(
        q("-.484785E-7466").with_format(DecimalSI).to_string(),
        "-1n"
    );
    assert_eq!(q("1e0000000000000000000000003"), q("1k"));
}

/// Kubernetes' TestQuantityString table: value and format, canonical text, and another
/// spelling that canonicalises to it.
#[test]
fn prints_canonically_like_kubernetes() {
    let table: &[(Quantity, &str, &str)] = &[
        (dec(1024 * 1024 * 1024, 0, BinarySI), "1Gi", "1024Mi"),
        (dec(300 * 1024 * 1024, 0, BinarySI), "300Mi", "307200Ki"),
        (dec(6 * 1024, 0, BinarySI), "6Ki", ""),
        (
            dec(1001 * 1024 * 1024 * 1024, 0, BinarySI),
            "1001Gi",
            "1025024Mi",
        ),
        (dec(1 << 40, 0, BinarySI), "1Ti", "1024Gi"),
        (dec(5, 0, BinarySI), "5", "5000m"),
        (dec(500, -3, BinarySI), "500m", "0.5"),
        (dec(1, 9, DecimalSI), "1G", "1000M"),
        (dec(1000, 6, DecimalSI), "1G", "0.001T"),
        (dec(1000000, 3, DecimalSI), "1G", ""),
        (dec(1000000000, 0, DecimalSI), "1G", ""),
        (dec(1, -3, DecimalSI), "1m", "1000u"),
        (dec(80, -3, DecimalSI), "80m", ""),
        (dec(1080, -3, DecimalSI), "1080m", "1.08"),
        (dec(108, -2, DecimalSI), "1080m", "1080000000n"),
        (dec(10800, -4, DecimalSI), "1080m", ""),
        (dec(300, 6, DecimalSI), "300M", ""),
        (dec(1, 12, DecimalSI), "1T", ""),
        (dec(1, 18, DecimalSI), "1E", ""),
        (dec(1, 21, DecimalSI), "1e21", "1000E"),
        (dec(5, 21, DecimalSI), "5e21", "5000E"),
        (dec(1, 24, DecimalSI), "1e24", "1000000E"),
        (dec(1, 70, BinarySI), "10e69", ""),
        (dec(2, 70, BinarySI), "20e69", ""),
        (dec(1, 72, BinarySI), "1e72", ""),
        (dec(1 << 70, 0, BinarySI), "1180591620717411303424", ""),
        (dec(1234567, 6, DecimalSI), "1234567M", ""),
        (dec(1234567, -3, BinarySI), "1234567m", ""),
        (dec(3, 3, DecimalSI), "3k", ""),
        (dec(1025, 0, BinarySI), "1025", ""),
        (dec(2000, 0, BinarySI), "2000", ""),
        (dec(0, 0, DecimalSI), "0", ""),
        (dec(0, 0, BinarySI), "0", ""),
        (dec(1, 9, DecimalExponent), "1e9", ".001e12"),
        (dec(1, -3, DecimalExponent), "1e-3", "0.001e0"),
        (dec(1, -9, DecimalExponent), "1e-9", "1000e-12"),
        (dec(80, -3, DecimalExponent), "80e-3", ""),
        (dec(300, 6, DecimalExponent), "300e6", ""),
        (dec(1, 12, DecimalExponent), "1e12", ""),
        (dec(1, 3, DecimalExponent), "1e3", ""),
        (dec(3, 3, DecimalExponent), "3e3", ""),
        (dec(0, 0, DecimalExponent), "0", "00"),
        (dec(1, -9, DecimalSI), "1n", ""),
        (dec(80, -9, DecimalSI), "80n", ""),
        (dec(1080, -9, DecimalSI), "1080n", ""),
        (dec(108, -8, DecimalSI), "1080n", ""),
        (dec(1, -6, DecimalSI), "1u", ""),
        (dec(80, -6, DecimalSI), "80u", ""),
        (dec(1080, -6, DecimalSI), "1080u", ""),
    ];
    for &(value, want, alternate) in table {
        assert_eq!(value.to_string(), want, "{value:?}");
        assert_eq!(q(want), value, "{want} parses back");
        if !alternate.is_empty() {
            assert_eq!(q(alternate).to_string(), want, "{alternate}");
        }
        if !value.is_zero() {
            assert_eq!((-value).to_string(), format!("-{want}"));
        }
    }
}

#[test]
fn parse_then_print_like_kubernetes() {
    for (input, want) in [
        ("1Ki", "1Ki"),
        ("1Mi", "1Mi"),
        ("1Gi", "1Gi"),
        ("1024Mi", "1Gi"),
        ("1536Mi", "1536Mi"),
        ("1.5Gi", "1536Mi"),
        ("0.5Gi", "512Mi"),
        ("1000M", "1G"),
        ("1000m", "1"),
        ("1.5", "1500m"),
        ("12e6", "12e6"),
        ("1e3", "1e3"),
        ("1E3", "1e3"),
        ("1e+21", "1e21"),
        ("5.", "5"),
        ("+1", "1"),
        ("01", "1"),
        ("1e0", "1"),
        ("123e0", "123"),
        (".5", "500m"),
        ("100m", "100m"),
        ("10000T", "10P"),
        ("100.035Ki", "102435840m"),
        (".001Ki", "1024m"),
        (".000001Ki", "1024u"),
        (".000000001Ki", "1024n"),
        (".000000000001Ki", "2n"),
        ("9Ei", "9223372036854775807"),
        ("8Ei", "9223372036854775807"),
        ("7Ei", "7Ei"),
        ("1024Ei", "9223372036854775807"),
        ("1000E", "1e21"),
    ] {
        assert_eq!(q(input).to_string(), want, "{input}");
        if !input.starts_with('+') {
            assert_eq!(q(&format!("-{input}")).to_string(), format!("-{want}"));
        }
    }
}

#[test]
fn values_compare_exactly() {
    assert_eq!(q("1Ki"), q("1024"));
    assert_eq!(q("1000m"), q("1"));
    assert_eq!(q("0.5Gi"), q("512Mi"));
    assert_eq!(q("1e3"), q("1k"));
    assert_eq!(q("-0"), q("0"));
    for (x, y, want) in [
        ("0", "0", Ordering::Equal),
        ("100m", "50m", Ordering::Greater),
        ("50m", "100m", Ordering::Less),
        ("10000T", "100Gi", Ordering::Greater),
        ("1n", "0", Ordering::Greater),
        ("-1n", "0", Ordering::Less),
        ("-1", "-1n", Ordering::Less),
        ("1e30", "999999999999999999999999999999", Ordering::Greater),
        ("-1e30", "-999999999999999999999999999999", Ordering::Less),
        ("1.000000001", "1", Ordering::Greater),
        ("1e2147483647", "9Ei", Ordering::Greater),
        ("800m", "1", Ordering::Less),
        ("800m", "790m", Ordering::Greater),
    ] {
        assert_eq!(q(x).cmp(&q(y)), want, "{x} vs {y}");
        assert_eq!(q(y).cmp(&q(x)), want.reverse(), "{y} vs {x}");
    }
    let hash = |v: Quantity| {
        use std::collections::hash_map::DefaultHasher;
        let mut h = DefaultHasher::new();
        v.hash(&mut h);
        h.finish()
    };
    assert_eq!(hash(q("1Ki")), hash(q("1024")));
    assert_eq!(hash(q("0Gi")), hash(q("0")));
}

#[test]
fn accessors_round_like_kubernetes() {
    for (input, value, milli) in [
        ("-.484785E-7466", -1, -1),
        (".484785E-7466", 1, 1),
        ("-.484785E-1", -1, -49),
        (".484785E-1", 1, 49),
        ("-0.0005", -1, -1),
        ("0.0005", 1, 1),
        ("-1500m", -2, -1500),
        ("1500m", 2, 1500),
        ("-9.5000000001Gi", -10200547329, -10200547328108),
        ("9.5000000001Gi", 10200547329, 10200547328108),
        ("-1", -1, -1000),
        ("1", 1, 1000),
        ("0", 0, 0),
    ] {
        assert_eq!(q(input).value(), Some(value), "{input} value");
        assert_eq!(q(input).milli_value(), Some(milli), "{input} milli");
    }
    // Kubernetes' TestScaledValue.
    for (from, to, want) in [
        (-9, -9, 1),
        (-9, -6, 1),
        (-9, -3, 1),
        (-9, 0, 1),
        (-6, -9, 1000),
        (-6, -6, 1),
        (-6, -3, 1),
        (-6, 0, 1),
        (-3, -9, 1_000_000),
        (-3, -6, 1000),
        (-3, -3, 1),
        (-3, 0, 1),
        (0, -9, 1_000_000_000),
        (0, -6, 1_000_000),
        (0, -3, 1000),
        (0, 0, 1),
        (2, -2, 10_000),
    ] {
        let v = Quantity::from_scaled(1, from, DecimalSI).unwrap();
        assert_eq!(v.scaled_value(to), Some(want), "{from} -> {to}");
    }
    assert_eq!(q("9223372036854775807").value(), Some(i64::MAX));
    assert_eq!(q("9223372036854775808").value(), None);
    assert_eq!(q("-9223372036854775808").value(), Some(i64::MIN));
    assert_eq!(q("9223372036854775807").milli_value(), None);
    assert_eq!(q("1e2147483647").value(), None);
    assert_eq!(q("1e-2147483647").scaled_value(i32::MAX), Some(1));
}

#[test]
fn integer_and_float_views() {
    assert_eq!(q("1Ki").as_i64(), Some(1024));
    assert_eq!(q("0.5Gi").as_i64(), Some(536870912));
    assert_eq!(q("1500m").as_i64(), None);
    assert!(!q("1500m").is_integer());
    assert!(q("1e30").is_integer());
    assert_eq!(q("1e30").as_i64(), None);
    assert_eq!(q("-9223372036854775808").as_i64(), Some(i64::MIN));
    assert_eq!(q("1500m").as_approximate_f64(), 1.5);
    assert_eq!(q("-1Ki").as_approximate_f64(), -1024.0);
    assert_eq!(q("1e400").as_approximate_f64(), f64::INFINITY);
    assert_eq!(q("1e2147483647").as_approximate_f64(), f64::INFINITY);
    assert_eq!(q("0.1").as_approximate_f64(), 0.1);
    assert_eq!(q("3n").sign(), 1);
    assert_eq!(q("-3n").sign(), -1);
    assert_eq!(q("0Ki").sign(), 0);
    assert!(q("0Ki").is_zero());
    assert_eq!(q("1.5").to_decimal_parts(), (15, -1));
    assert_eq!(q("0").to_decimal_parts(), (0, 0));
}

#[test]
fn constructors_match_kubernetes() {
    // TestNewSet
    for (value, format, want) in [
        (1, DecimalSI, "1"),
        (1000, DecimalSI, "1k"),
        (1234000, DecimalSI, "1234k"),
        (1024, BinarySI, "1Ki"),
        (1000000, DecimalExponent, "1e6"),
        (1024 * 1024, BinarySI, "1Mi"),
    ] {
        let v = Quantity::from_i64(value, format);
        assert_eq!(v.to_string(), want);
        assert_eq!(q(want).value(), Some(value));
    }
    // TestMilliNewSet
    for (value, format, want) in [
        (1, DecimalSI, "1m"),
        (1000, DecimalSI, "1"),
        (1234000, DecimalSI, "1234"),
        (1024, BinarySI, "1024m"),
        (1000000, DecimalExponent, "1e3"),
        (1024 * 1024, BinarySI, "1048576m"),
    ] {
        let v = Quantity::from_scaled(value, -3, format).unwrap();
        assert_eq!(v.to_string(), want);
        assert_eq!(q(want).milli_value(), Some(value));
    }
    // TestNewScaledSet
    for (value, scale, want) in [
        (1, -9, "1n"),
        (1000, -9, "1u"),
        (1, -6, "1u"),
        (1000, -6, "1m"),
        (1, -3, "1m"),
        (1000, -3, "1"),
        (1, 0, "1"),
        (0, -9, "0"),
        (0, 0, "0"),
    ] {
        let v = Quantity::from_scaled(value, scale, DecimalSI).unwrap();
        assert_eq!(v.to_string(), want);
        assert_eq!(q(want).scaled_value(scale), Some(value));
    }
    assert_eq!(
        Quantity::from_i64(i64::MIN, DecimalSI).to_string(),
        "-9223372036854775808"
    );
    assert_eq!(
        Quantity::from_scaled(7, -18, DecimalSI)
            .unwrap()
            .to_string(),
        "1n"
    );
    assert_eq!(
        Quantity::from_scaled(-7, -400, DecimalSI)
            .unwrap()
            .to_string(),
        "-1n"
    );
    assert!(Quantity::from_scaled(10, i32::MAX, DecimalSI).is_err());
    assert_eq!(Quantity::default().to_string(), "0");
}

#[test]
fn arithmetic_keeps_kubernetes_formats() {
    // Adding or subtracting zero keeps the suffix, whichever side it is on.
    for text in ["100m", "1Gi"] {
        let (value, zero) = (q(text), q("0"));
        assert_eq!(value.checked_add(&zero).unwrap().to_string(), text);
        assert_eq!(zero.checked_add(&value).unwrap().to_string(), text);
        assert_eq!(value.checked_sub(&zero).unwrap().to_string(), text);
        assert_eq!(
            zero.checked_sub(&value).unwrap().to_string(),
            format!("-{text}")
        );
    }
    // TestSub
    let sub = |a: Quantity, b: Quantity| a.checked_sub(&b).unwrap();
    assert_eq!(sub(dec(10, 0, DecimalSI), dec(1, 1, DecimalSI)), q("0"));
    let nine = sub(dec(10, 0, DecimalSI), dec(1, 0, BinarySI));
    assert_eq!((nine, nine.format()), (q("9"), DecimalSI));
    let nine = sub(dec(10, 0, BinarySI), dec(1, 0, DecimalSI));
    assert_eq!((nine, nine.format()), (q("9"), BinarySI));
    assert_eq!(
        q("1Gi").checked_add(&q("512Mi")).unwrap().to_string(),
        "1536Mi"
    );
    assert_eq!(q("1").checked_add(&q("500m")).unwrap().to_string(), "1500m");
    assert_eq!(
        q("1Gi").checked_sub(&q("1n")).unwrap().to_string(),
        "1073741823999999999n"
    );
    // 2^63 from i64::MIN: no wrap.
    let two_63 = q("0")
        .checked_sub(&Quantity::from_i64(i64::MIN, DecimalSI))
        .unwrap();
    assert_eq!(two_63.to_string(), "9223372036854775808");
    // Beyond 38 digits: None, not a wrong value.
    assert_eq!(q("1e30").checked_add(&q("1n")), None);
    assert_eq!(q("1e2147483647").checked_add(&q("1")), None);
    let nines = q("99999999999999999999999999999999999999");
    assert_eq!(nines.checked_add(&q("1")).unwrap(), q("1e38"));
    assert_eq!(nines.checked_add(&nines), None);
    assert_eq!(q("-1Ki").checked_add(&q("1Ki")).unwrap(), q("0"));
}

#[test]
fn binary_above_the_cap_prints_like_kubernetes() {
    // Only arithmetic reaches it; the spelling parses back capped, as in Kubernetes.
    let big = q("8Ei").checked_add(&q("8Ei")).unwrap();
    assert_eq!(big.to_string(), "18446744073709551614");
    let two_64 = q("1").checked_add(&q("18446744073709551615")).unwrap();
    assert_eq!(two_64.with_format(BinarySI).to_string(), "16Ei");
    assert_eq!(q("16Ei"), q("9223372036854775807"));
    assert_eq!(
        q("1e30").with_format(BinarySI).to_string(),
        "931322574615478515625Gi"
    );
    assert_eq!(q("931322574615478515625Gi"), q("9223372036854775807"));
}

#[test]
fn serde_uses_the_canonical_string() {
    let v: Quantity = serde_json::from_str("\"1.5Gi\"").unwrap();
    assert_eq!(serde_json::to_string(&v).unwrap(), "\"1536Mi\"");
    for (json, want) in [
        ("\" 1\"", "1"),
        ("\"1 \"", "1"),
        ("1", "1"),
        (" 1", "1"),
        ("1 ", "1"),
        ("10", "10"),
        ("-1", "-1"),
        (" -1", "-1"),
        ("1.5", "1500m"),
        ("1e3", "1k"),
        ("18446744073709551615", "18446744073709551615"),
        ("0.1", "100m"),
    ] {
        let v: Quantity = serde_json::from_str(json).unwrap();
        assert_eq!(v.to_string(), want, "{json}");
    }
    for json in ["\"1.2.3\"", "\"\"", "true", "null", "[1]", "{}"] {
        let err = serde_json::from_str::<Quantity>(json)
            .unwrap_err()
            .to_string();
        assert!(!err.is_empty(), "{json}");
    }
    let err = serde_json::from_str::<Quantity>("\"12 apples\"").unwrap_err();
    assert!(err.to_string().contains("\"12 apples\""), "{err}");
    let format: Format = serde_json::from_str("\"BinarySI\"").unwrap();
    assert_eq!(format, BinarySI);
}

mod properties {
    use super::*;
    use proptest::prelude::*;

    fn any_format() -> impl Strategy<Value = Format> {
        prop_oneof![Just(DecimalSI), Just(BinarySI), Just(DecimalExponent)]
    }

    /// Any representable quantity, with mantissas of every length and exponents near the
    /// suffixes and far from them.
    fn any_quantity() -> impl Strategy<Value = Quantity> {
        let mantissa = prop_oneof![
            -2000i128..2000,
            -(1i128 << 70)..(1i128 << 70),
            -(MAX_MANTISSA as i128)..=(MAX_MANTISSA as i128),
        ];
        let exponent = prop_oneof![
            4 => -9i64..30,
            1 => -9i64..80,
            1 => (MAX_EXPONENT - 50)..=MAX_EXPONENT,
        ];
        (mantissa, exponent, any_format()).prop_filter_map("out of range", |(m, e, f)| {
            let v = Quantity::from_parts(m < 0, m.unsigned_abs(), e, f)?;
            // Kubernetes caps a parsed binary value: above the cap the spelling cannot
            // round-trip, by design (see binary_above_the_cap_prints_like_kubernetes).
            let cap = Quantity::from_i64(i64::MAX, DecimalSI);
            if f == BinarySI && (v > cap || v < -cap) {
                return None;
            }
            Some(v)
        })
    }

    /// An independent exact spelling: sign, integer digits and 9 fractional digits.
    fn fixed_point(v: &Quantity) -> (i32, String, String) {
        let (m, e) = v.to_decimal_parts();
        let mut digits = m.unsigned_abs().to_string();
        digits.extend(std::iter::repeat_n('0', (e + 9) as usize));
        let digits = format!("{digits:0>10}");
        let (int, frac) = digits.split_at(digits.len() - 9);
        let int = int.trim_start_matches('0');
        (m.signum() as i32, int.to_owned(), frac.to_owned())
    }

    fn reference_cmp(a: &Quantity, b: &Quantity) -> Ordering {
        let (sa, ia, fa) = fixed_point(a);
        let (sb, ib, fb) = fixed_point(b);
        if sa != sb {
            return sa.cmp(&sb);
        }
        let magnitude = ia.len().cmp(&ib.len()).then(ia.cmp(&ib)).then(fa.cmp(&fb));
        if sa < 0 {
            magnitude.reverse()
        } else {
            magnitude
        }
    }

    const E18: i64 = 10i64.pow(18);

    fn fail(error: impl fmt::Display) -> TestCaseError {
        TestCaseError::fail(error.to_string())
    }

    fn small_quantity() -> impl Strategy<Value = Quantity> {
        (-(10i128.pow(20))..10i128.pow(20), -9i64..60, any_format())
            .prop_filter_map("out of range", |(m, e, f)| {
                Quantity::from_parts(m < 0, m.unsigned_abs(), e, f)
            })
    }

    proptest! {
        #[test]
        fn display_parses_back_to_the_same_value(v in any_quantity()) {
            let text = v.to_string();
            let back = Quantity::parse(&text).map_err(fail)?;
            prop_assert_eq!(back, v, "{}", text);
            // Decimal spellings are stable; a binary one may reparse as DecimalSI.
            if v.format() != BinarySI {
                prop_assert_eq!(back.to_string(), text);
            }
            let json = serde_json::to_string(&v).map_err(fail)?;
            let back: Quantity = serde_json::from_str(&json).map_err(fail)?;
            prop_assert_eq!(back, v);
        }

        #[test]
        fn quantity_like_text_parses_back_or_errors(
            text in "[-+]?[0-9.]{0,45}([eEinumkKMGTP]{0,2}[-+]?[0-9]{0,12})?",
        ) {
            if let Ok(v) = Quantity::parse(&text) {
                prop_assert_eq!(Quantity::parse(&v.to_string()).ok(), Some(v));
            }
        }

        #[test]
        fn arbitrary_text_never_panics(text in "\\PC{0,30}") {
            let _ = Quantity::parse(&text);
        }

        #[test]
        fn ordering_agrees_with_exact_values(a in small_quantity(), b in small_quantity()) {
            prop_assert_eq!(a.cmp(&b), reference_cmp(&a, &b));
            prop_assert_eq!(a == b, reference_cmp(&a, &b) == Ordering::Equal);
        }

        #[test]
        fn ordering_of_wide_values_is_consistent(
            a in any_quantity(),
            b in any_quantity(),
            c in any_quantity(),
        ) {
            prop_assert_eq!(a.cmp(&b), b.cmp(&a).reverse());
            if a <= b && b <= c {
                prop_assert!(a <= c);
            }
            prop_assert_eq!(-a < -b, b < a);
        }

        #[test]
        fn add_and_sub_are_inverse(a in any_quantity(), b in any_quantity()) {
            if let Some(sum) = a.checked_add(&b) {
                prop_assert_eq!(sum.checked_sub(&b), Some(a));
                prop_assert_eq!(b.checked_add(&a), Some(sum));
                prop_assert_eq!(sum.cmp(&a), b.cmp(&Quantity::default()));
            }
            if let Some(difference) = a.checked_sub(&b) {
                prop_assert_eq!(difference.checked_add(&b), Some(a));
            }
            prop_assert_eq!(a.checked_sub(&a), Some(Quantity::default()));
        }

        #[test]
        fn add_matches_nano_arithmetic(a in -E18..E18, b in -E18..E18, sa in -9i32..10, sb in -9i32..10) {
            let (qa, qb) = (
                Quantity::from_scaled(a, sa, DecimalSI).map_err(fail)?,
                Quantity::from_scaled(b, sb, DecimalSI).map_err(fail)?,
            );
            let nanos = |v: i64, s: i32| i128::from(v) * 10i128.pow((s + 9) as u32);
            let want = nanos(a, sa) + nanos(b, sb);
            let sum = qa.checked_add(&qb).ok_or_else(|| fail("no sum"))?;
            let (m, e) = sum.to_decimal_parts();
            prop_assert_eq!(m * 10i128.pow((e + 9) as u32), want);
        }
    }
}

/// The shortcut for plain integers gives exactly what the general parser gives (value and
/// format), and leaves everything else to it.
#[test]
fn integer_shortcut_agrees_with_the_general_parser() {
    let suffixes = [
        "", "n", "u", "m", "k", "M", "G", "T", "P", "E", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei",
    ];
    let numbers = [
        "0",
        "00",
        "1",
        "7",
        "10",
        "80",
        "100",
        "1000",
        "123456789",
        "999999999999999999",
        "9223372036854775807",
        "8589934591",
        "8589934592",
        "8796093022207",
    ];
    let mut shortcut = 0;
    for n in numbers {
        for sign in ["", "-", "+"] {
            for s in suffixes {
                let text = format!("{sign}{n}{s}");
                let general = Quantity::parse_general(&text);
                match parse::parse_integer(&text) {
                    Some(fast) => {
                        shortcut += 1;
                        let general = general.unwrap_or_else(|e| panic!("{text}: {e}"));
                        assert_eq!(format!("{fast:?}"), format!("{general:?}"), "{text}");
                    }
                    None => {
                        // Left to the general parser: too many digits, or a capped binary value.
                        assert!(
                            n.len() > 18 || s.ends_with('i'),
                            "{text} skipped the shortcut"
                        );
                    }
                }
                assert_eq!(
                    format!("{:?}", Quantity::parse(&text)),
                    format!("{general:?}", general = Quantity::parse_general(&text)),
                    "{text}"
                );
            }
        }
    }
    assert!(shortcut > 500, "only {shortcut} inputs took the shortcut");
    for text in [
        "1.5", "1e3", "1E-3", "0.1Gi", "1Ki1", "", "-", "1x", "1 Ki", "١",
    ] {
        assert!(parse::parse_integer(text).is_none(), "{text}");
    }
}

/// Found by the `quantity_version` fuzz target: a long number with a long unknown suffix was
/// echoed in full, twice.
#[test]
fn a_long_invalid_quantity_gives_a_short_error() {
    let input = format!(
        "8{}71e315{}{}",
        "4".repeat(78),
        "0".repeat(100),
        "4".repeat(600)
    );
    let input = format!("{input}x{}", "y".repeat(2000));
    let err = Quantity::parse(&input).unwrap_err().to_string();
    assert!(err.len() < 1024, "{} bytes: {err}", err.len());
    assert!(err.contains("bytes)"), "{err}");
}
