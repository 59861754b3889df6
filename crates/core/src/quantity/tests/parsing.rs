//! Parsing: Kubernetes' parse table, what it rejects, limits as errors, the integer shortcut
//! agreeing with the general parser, and short errors for long invalid input.

use super::*;

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
