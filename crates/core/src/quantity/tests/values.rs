//! Values: exact comparison, rounding accessors, integer and float views, constructors and
//! arithmetic keeping Kubernetes' formats.

use super::*;

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
