//! Printing: the canonical form Kubernetes prints, parse-then-print, binary values above the
//! cap, and serde through the canonical string.

use super::*;

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
