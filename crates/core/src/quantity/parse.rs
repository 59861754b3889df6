//! Parsing: the Kubernetes quantity grammar, suffixes and the two adjustments (rounding to
//! the nano, capping binary-suffix values).

use std::str::FromStr;

use super::digits::{digits_value, increment, mul_small, strip_trailing_zeros};
use super::{BINARY_CAP, Format, MAX_DIGITS, MAX_SUFFIX_EXPONENT, NANO, Quantity, QuantityError};

impl Quantity {
    /// Parses a quantity as Kubernetes does (see the type's documentation for the rules).
    pub fn parse(input: &str) -> Result<Quantity, QuantityError> {
        match parse_integer(input) {
            Some(q) => Ok(q),
            None => Quantity::parse_general(input),
        }
    }

    /// The whole grammar (`parse` without its shortcut for plain integers).
    pub(super) fn parse_general(input: &str) -> Result<Quantity, QuantityError> {
        let number = split_number(input)?;
        let (multiplier, format) = interpret_suffix(input, number.suffix)?;
        let out_of_range = || QuantityError::OutOfRange {
            input: input.to_owned(),
        };
        let (mut digits, exponent) =
            significant_digits(&number, multiplier).ok_or_else(out_of_range)?;
        if digits.is_empty() {
            return Ok(Quantity {
                mantissa: 0,
                exponent: 0,
                format,
            });
        }
        let mut exponent = strip_trailing_zeros(&mut digits, exponent).ok_or_else(out_of_range)?;
        exponent = round_to_nano(&mut digits, exponent).ok_or_else(out_of_range)?;

        let mut format = format;
        if matches!(multiplier, Multiplier::Binary(_)) {
            if exceeds_binary_cap(&digits, exponent) {
                let cap = BINARY_CAP as i128;
                return Ok(Quantity {
                    mantissa: if number.negative { -cap } else { cap },
                    exponent: 0,
                    format,
                });
            }
            // Digits before the decimal point; the value is below 10^whole.
            let whole = digits.len() as i64 + exponent;
            if whole <= 0 {
                // Below one, a binary suffix would only confuse: Kubernetes switches.
                format = Format::DecimalSI;
            }
        }

        if digits.len() > MAX_DIGITS {
            return Err(QuantityError::TooManyDigits {
                input: input.to_owned(),
            });
        }
        let magnitude = digits_value(&digits).ok_or_else(|| QuantityError::TooManyDigits {
            input: input.to_owned(),
        })?;
        Quantity::from_parts(number.negative, magnitude, exponent, format).ok_or_else(out_of_range)
    }
}

/// A quantity's text cut at its parts: the sign, the digits before and after the decimal
/// point, and the suffix.
struct NumberText<'a> {
    negative: bool,
    /// The digits before the point (ASCII).
    integer: &'a [u8],
    /// The digits after the point (ASCII).
    fraction: &'a [u8],
    /// Whatever follows the digits.
    suffix: &'a str,
}

/// Cuts `input` into its sign, digits and suffix; an error when it is empty or has no digit.
fn split_number(input: &str) -> Result<NumberText<'_>, QuantityError> {
    let bytes = input.as_bytes();
    if bytes.is_empty() {
        return Err(QuantityError::Empty);
    }
    let mut pos = 0;
    let negative = match bytes[0] {
        b'-' => {
            pos = 1;
            true
        }
        b'+' => {
            pos = 1;
            false
        }
        _ => false,
    };
    let int_start = pos;
    while pos < bytes.len() && bytes[pos].is_ascii_digit() {
        pos += 1;
    }
    let integer = &bytes[int_start..pos];
    let mut fraction: &[u8] = &[];
    if pos < bytes.len() && bytes[pos] == b'.' {
        pos += 1;
        let frac_start = pos;
        while pos < bytes.len() && bytes[pos].is_ascii_digit() {
            pos += 1;
        }
        fraction = &bytes[frac_start..pos];
    }
    if integer.is_empty() && fraction.is_empty() {
        return Err(QuantityError::NoDigits {
            input: input.to_owned(),
        });
    }
    // Only ASCII bytes were skipped, so `pos` is on a character boundary.
    let suffix = input.get(pos..).unwrap_or_default();
    Ok(NumberText {
        negative,
        integer,
        fraction,
        suffix,
    })
}

/// The number's significant digits (leading zeros dropped; empty for zero) with the
/// suffix's multiplier applied, and the power of ten they are scaled by; `None` when the
/// exponent is out of range.
fn significant_digits(number: &NumberText<'_>, multiplier: Multiplier) -> Option<(Vec<u8>, i64)> {
    let mut digits: Vec<u8> = number
        .integer
        .iter()
        .chain(number.fraction)
        .map(|b| b - b'0')
        .skip_while(|d| *d == 0)
        .collect();
    let frac_len = i64::try_from(number.fraction.len()).ok()?;
    let exponent = match multiplier {
        Multiplier::Decimal(e) => e.checked_sub(frac_len)?,
        Multiplier::Binary(bits) => {
            digits = mul_small(&digits, 1u64 << bits);
            -frac_len
        }
    };
    Some((digits, exponent))
}

/// Keeps the value `digits` × 10^`exponent` to the nano, rounding a finer non-zero value away
/// from zero; the new exponent, or `None` when it is out of range.
fn round_to_nano(digits: &mut Vec<u8>, exponent: i64) -> Option<i64> {
    if exponent >= NANO {
        return Some(exponent);
    }
    let dropped = NANO - exponent;
    match usize::try_from(dropped) {
        Ok(dropped) if dropped < digits.len() => {
            let keep = digits.len() - dropped;
            let inexact = digits[keep..].iter().any(|d| *d != 0);
            digits.truncate(keep);
            if inexact {
                increment(digits);
            }
        }
        _ => *digits = vec![1],
    }
    strip_trailing_zeros(digits, NANO)
}

/// Whether the value `digits` × 10^`exponent` (kept to the nano) is above the cap of values
/// with a binary suffix.
fn exceeds_binary_cap(digits: &[u8], exponent: i64) -> bool {
    // Digits before the decimal point; the value is below 10^whole.
    let whole = digits.len() as i64 + exponent;
    whole > 19 || {
        // At most 28 digits of nanos, so this fits.
        let nanos = digits_value(digits)
            .zip(10u128.checked_pow((exponent - NANO) as u32))
            .and_then(|(m, p)| m.checked_mul(p));
        nanos.is_none_or(|n| n > BINARY_CAP * 1_000_000_000)
    }
}

/// The common case, an optionally signed integer of at most 18 digits with no suffix or a
/// single SI or binary suffix (`8`, `80Gi`, `500m`), without digit vectors; `None` for
/// anything else, which the general parser handles.
pub(super) fn parse_integer(input: &str) -> Option<Quantity> {
    let bytes = input.as_bytes();
    let (negative, rest) = match bytes.first()? {
        b'-' => (true, &bytes[1..]),
        b'+' => (false, &bytes[1..]),
        _ => (false, bytes),
    };
    let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
    if digits == 0 || digits > 18 {
        return None;
    }
    let mut value: u64 = 0;
    for &b in &rest[..digits] {
        value = value * 10 + u64::from(b - b'0');
    }
    let suffix = &rest[digits..];
    let (multiplier, format) = match suffix {
        [] => (Multiplier::Decimal(0), Format::DecimalSI),
        [b'n'] => (Multiplier::Decimal(-9), Format::DecimalSI),
        [b'u'] => (Multiplier::Decimal(-6), Format::DecimalSI),
        [b'm'] => (Multiplier::Decimal(-3), Format::DecimalSI),
        [b'k'] => (Multiplier::Decimal(3), Format::DecimalSI),
        [b'M'] => (Multiplier::Decimal(6), Format::DecimalSI),
        [b'G'] => (Multiplier::Decimal(9), Format::DecimalSI),
        [b'T'] => (Multiplier::Decimal(12), Format::DecimalSI),
        [b'P'] => (Multiplier::Decimal(15), Format::DecimalSI),
        [b'E'] => (Multiplier::Decimal(18), Format::DecimalSI),
        [b'K', b'i'] => (Multiplier::Binary(10), Format::BinarySI),
        [b'M', b'i'] => (Multiplier::Binary(20), Format::BinarySI),
        [b'G', b'i'] => (Multiplier::Binary(30), Format::BinarySI),
        [b'T', b'i'] => (Multiplier::Binary(40), Format::BinarySI),
        [b'P', b'i'] => (Multiplier::Binary(50), Format::BinarySI),
        [b'E', b'i'] => (Multiplier::Binary(60), Format::BinarySI),
        _ => return None,
    };
    let (mut magnitude, mut exponent) = match multiplier {
        Multiplier::Decimal(e) => (value, e),
        Multiplier::Binary(bits) => {
            // Larger values are capped by the general parser.
            if value > (BINARY_CAP as u64) >> bits {
                return None;
            }
            (value << bits, 0)
        }
    };
    if magnitude == 0 {
        return Some(Quantity {
            mantissa: 0,
            exponent: 0,
            format,
        });
    }
    // Normalise as `from_parts` does, in 64 bits.
    while magnitude % 10 == 0 {
        magnitude /= 10;
        exponent += 1;
    }
    let mantissa = i128::from(magnitude);
    Some(Quantity {
        mantissa: if negative { -mantissa } else { mantissa },
        exponent: i32::try_from(exponent).ok()?,
        format,
    })
}

/// What a suffix multiplies the number by.
#[derive(Debug, Clone, Copy)]
enum Multiplier {
    /// 10^n
    Decimal(i64),
    /// 2^n
    Binary(u32),
}

fn interpret_suffix(input: &str, suffix: &str) -> Result<(Multiplier, Format), QuantityError> {
    let decimal = |e| Ok((Multiplier::Decimal(e), Format::DecimalSI));
    let binary = |e| Ok((Multiplier::Binary(e), Format::BinarySI));
    match suffix {
        "" => return decimal(0),
        "n" => return decimal(-9),
        "u" => return decimal(-6),
        "m" => return decimal(-3),
        "k" => return decimal(3),
        "M" => return decimal(6),
        "G" => return decimal(9),
        "T" => return decimal(12),
        "P" => return decimal(15),
        "E" => return decimal(18),
        "Ki" => return binary(10),
        "Mi" => return binary(20),
        "Gi" => return binary(30),
        "Ti" => return binary(40),
        "Pi" => return binary(50),
        "Ei" => return binary(60),
        _ => {}
    }
    if let Some(character) = suffix.chars().find(|c| {
        !matches!(
            c,
            'e' | 'E' | 'i' | 'n' | 'u' | 'm' | 'k' | 'K' | 'M' | 'G' | 'T' | 'P' | '+' | '-' | '0'
                ..='9'
        )
    }) {
        return Err(QuantityError::UnexpectedCharacter {
            input: input.to_owned(),
            character,
        });
    }
    let unknown = || QuantityError::UnknownSuffix {
        input: input.to_owned(),
        suffix: suffix.to_owned(),
    };
    let rest = suffix.strip_prefix(['e', 'E']).ok_or_else(unknown)?;
    let (negative, digits) = match rest.as_bytes().first() {
        Some(b'-') => (true, &rest[1..]),
        Some(b'+') => (false, &rest[1..]),
        _ => (false, rest),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(unknown());
    }
    let mut value: i64 = 0;
    for b in digits.bytes() {
        value = value
            .checked_mul(10)
            .and_then(|v| v.checked_add(i64::from(b - b'0')))
            .filter(|v| *v <= MAX_SUFFIX_EXPONENT)
            .ok_or_else(|| QuantityError::ExponentOutOfRange {
                input: input.to_owned(),
            })?;
    }
    Ok((
        Multiplier::Decimal(if negative { -value } else { value }),
        Format::DecimalExponent,
    ))
}

impl FromStr for Quantity {
    type Err = QuantityError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Quantity::parse(s)
    }
}
