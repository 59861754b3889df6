//! Properties over any representable quantity: text round trips, no panic on arbitrary text,
//! ordering and arithmetic.

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

/// `scaled_value` worked out in 128 bits: the value in units of 10^scale, rounded away from
/// zero, if it fits an `i64`.
fn reference_scaled(v: &Quantity, scale: i32) -> Option<i64> {
    let (m, e) = v.to_decimal_parts();
    if m == 0 {
        return Some(0);
    }
    let shift = i64::from(e) - i64::from(scale);
    let units = if shift >= 0 {
        m.checked_mul(10i128.checked_pow(u32::try_from(shift).ok()?)?)?
    } else {
        match 10i128.checked_pow(u32::try_from(-shift).ok()?) {
            Some(d) if m % d == 0 => m / d,
            Some(d) => m / d + m.signum(),
            None => m.signum(),
        }
    };
    i64::try_from(units).ok()
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
    fn scaled_values_round_away_from_zero(v in small_quantity(), scale in -12i32..40) {
        prop_assert_eq!(v.scaled_value(scale), reference_scaled(&v, scale));
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
