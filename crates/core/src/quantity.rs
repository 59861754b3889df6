//! Kubernetes resource quantities (`1.5Gi`, `500m`, `12e6`) with exact values.
//!
//! The grammar, the rounding and the canonical form follow Kubernetes' `resource.Quantity`:
//!
//! ```text
//! <quantity>        ::= <signedNumber><suffix>
//! <signedNumber>    ::= <number> | <sign><number>
//! <number>          ::= <digits> | <digits>.<digits> | <digits>. | .<digits>
//! <sign>            ::= "+" | "-"
//! <suffix>          ::= <binarySI> | <decimalExponent> | <decimalSI>
//! <binarySI>        ::= Ki | Mi | Gi | Ti | Pi | Ei
//! <decimalSI>       ::= n | u | m | "" | k | M | G | T | P | E
//! <decimalExponent> ::= "e" <signedDigits> | "E" <signedDigits>
//! ```
//!
//! A value is held exactly as `mantissa × 10^exponent` (a mantissa of at most 38 significant
//! digits, an exponent from -9 up), so `1Ki == 1024`, `1000m == 1` and `0.5Gi == 512Mi`, and
//! comparison, equality and hashing are exact.

mod canonical;
mod digits;
mod parse;

use std::cmp::Ordering;
use std::fmt;
use std::hash::{Hash, Hasher};

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use digits::decimal_len;

/// The most significant decimal digits a [`Quantity`] holds.
const MAX_DIGITS: usize = 38;
/// The largest mantissa magnitude: 38 nines.
const MAX_MANTISSA: u128 = 10u128.pow(MAX_DIGITS as u32) - 1;
/// Values are kept to the nano (10^-9); finer input is rounded away from zero.
const NANO: i64 = -9;
/// The largest decimal exponent, so that every value prints as something that parses back.
const MAX_EXPONENT: i64 = i32::MAX as i64;
/// The largest exponent a decimal-exponent suffix may carry, as in Kubernetes.
const MAX_SUFFIX_EXPONENT: i64 = i32::MAX as i64;
/// Kubernetes caps a parsed binary-suffix quantity at 2^63-1 in magnitude.
const BINARY_CAP: u128 = i64::MAX as u128;
/// 10^0 to 10^19, the powers of ten a `u64` holds: the arithmetic of values that fit 64 bits
/// (most quantities) uses them instead of 128-bit powers and divisions.
static POW10: [u64; 20] = {
    let mut table = [1u64; 20];
    let mut i = 1;
    while i < 20 {
        table[i] = table[i - 1] * 10;
        i += 1;
    }
    table
};

/// How a [`Quantity`] is written: the kind of suffix it was parsed with, kept for printing.
///
/// The names and the JSON spelling are Kubernetes' (`"BinarySI"`, …).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub enum Format {
    /// Powers of ten written as exponents, e.g. `12e6`.
    DecimalExponent,
    /// Powers of 1024 written as `Ki`, `Mi`, `Gi`, `Ti`, `Pi`, `Ei`, e.g. `12Mi`.
    BinarySI,
    /// Powers of 1000 written as `n`, `u`, `m`, `k`, `M`, `G`, `T`, `P`, `E`, e.g. `12M`.
    #[default]
    DecimalSI,
}

/// Why a string is not a quantity. Every variant names the input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum QuantityError {
    /// The input was empty.
    #[error("a quantity cannot be empty")]
    Empty,
    /// The number part has no digit at all (e.g. `-`, `.`, `Ki`).
    #[error("invalid quantity {0}: the number has no digits", crate::echo::echo(.input))]
    NoDigits {
        /// The rejected input.
        input: String,
    },
    /// A character that cannot appear in a quantity (a space, a second dot, a letter).
    #[error("invalid quantity {0}: unexpected character {character:?}", crate::echo::echo(.input))]
    UnexpectedCharacter {
        /// The rejected input.
        input: String,
        /// The first character that cannot appear where it does.
        character: char,
    },
    /// The suffix is none of the known ones and not a decimal exponent.
    #[error(
        "invalid quantity {0}: unknown suffix {1} (expected one of n, u, m, k, M, G, \
         T, P, E, Ki, Mi, Gi, Ti, Pi, Ei, or a decimal exponent such as e6)",
        crate::echo::echo(.input),
        crate::echo::echo(.suffix)
    )]
    UnknownSuffix {
        /// The rejected input.
        input: String,
        /// The suffix as written.
        suffix: String,
    },
    /// A decimal exponent outside what Kubernetes accepts (±2147483647).
    #[error("invalid quantity {0}: the exponent is outside -2147483647..=2147483647", crate::echo::echo(.input))]
    ExponentOutOfRange {
        /// The rejected input.
        input: String,
    },
    /// More than 38 significant digits remain after rounding to the nano.
    #[error("quantity {0} has more than 38 significant digits", crate::echo::echo(.input))]
    TooManyDigits {
        /// The rejected input.
        input: String,
    },
    /// The value is too large: its decimal exponent would exceed 2147483647.
    #[error("quantity {0} is too large (its decimal exponent exceeds 2147483647)", crate::echo::echo(.input))]
    OutOfRange {
        /// The rejected input.
        input: String,
    },
}

/// A Kubernetes resource quantity with its exact value and the [`Format`] it prints in.
///
/// Parsing accepts every spelling Kubernetes accepts (see the module documentation) and
/// applies Kubernetes' two adjustments: a non-zero value finer than `1n` is rounded away from
/// zero to the nano (`0.9n` → `1n`, `3.001n` → `4n`), and a binary-suffix value is capped at
/// 2^63-1 in magnitude (`9Ei` → `9223372036854775807`). Beyond Kubernetes, a value needing more
/// than 38 significant digits or a decimal exponent above 2147483647 is an error, never
/// rounded or wrapped. Input with no digits at all (`-`, `.`), which Kubernetes' scanner reads
/// as zero against its own documented grammar, is rejected.
///
/// Equality, ordering and hashing compare values only: `1Ki == 1024` although they print
/// differently. [`Display`](fmt::Display) prints the canonical form exactly as Kubernetes'
/// `Quantity.String()` does (`1024Mi` → `1Gi`, `1.5` → `1500m`, `12e6` → `12e6`).
///
/// ```
/// use kubedev_core::Quantity;
///
/// let half: Quantity = "0.5Gi".parse()?;
/// assert_eq!(half.to_string(), "512Mi");
/// assert_eq!(half, "536870912".parse()?);
/// assert_eq!("1000m".parse::<Quantity>()?.as_i64(), Some(1));
/// # Ok::<(), kubedev_core::QuantityError>(())
/// ```
#[derive(Clone, Copy)]
pub struct Quantity {
    /// Zero, or a value without trailing decimal zeros whose magnitude is at most `MAX_MANTISSA`.
    mantissa: i128,
    /// 0 for zero, else from `NANO` to `MAX_EXPONENT`.
    exponent: i32,
    format: Format,
}

impl Quantity {
    /// The integer `value`, to be printed in `format` (Kubernetes' `NewQuantity`).
    pub fn from_i64(value: i64, format: Format) -> Quantity {
        // An i64 has at most 19 digits: always representable.
        Quantity::from_parts(value < 0, u128::from(value.unsigned_abs()), 0, format).unwrap_or(
            Quantity {
                mantissa: 0,
                exponent: 0,
                format,
            },
        )
    }

    /// `value × 10^scale`, to be printed in `format` (Kubernetes' `NewScaledQuantity`, which
    /// fixes DecimalSI); `from_scaled(1500, -3, Format::DecimalSI)` is `1500m`.
    ///
    /// A non-zero value finer than the nano is rounded away from zero to the nano, as parsing
    /// does; a value whose exponent would exceed 2147483647 is an error.
    pub fn from_scaled(value: i64, scale: i32, format: Format) -> Result<Quantity, QuantityError> {
        let negative = value < 0;
        let mut magnitude = u128::from(value.unsigned_abs());
        let mut exponent = i64::from(scale);
        if magnitude != 0 && exponent < NANO {
            let shift = NANO - exponent;
            let rounded = match u32::try_from(shift)
                .ok()
                .and_then(|s| 10u128.checked_pow(s))
            {
                Some(divisor) => magnitude.div_ceil(divisor),
                None => 1,
            };
            magnitude = rounded;
            exponent = NANO;
        }
        Quantity::from_parts(negative, magnitude, exponent, format).ok_or_else(|| {
            QuantityError::OutOfRange {
                input: format!("{value}e{scale}"),
            }
        })
    }

    /// The format the quantity prints in.
    pub fn format(&self) -> Format {
        self.format
    }

    /// The same value, printed in `format` from now on.
    pub fn with_format(self, format: Format) -> Quantity {
        Quantity { format, ..self }
    }

    /// The exact value as `(mantissa, exponent)`, meaning `mantissa × 10^exponent`: the mantissa
    /// has no trailing zeros and at most 38 digits, and zero is `(0, 0)`.
    pub fn to_decimal_parts(&self) -> (i128, i32) {
        (self.mantissa, self.exponent)
    }

    /// Whether the value is zero.
    pub fn is_zero(&self) -> bool {
        self.mantissa == 0
    }

    /// -1, 0 or 1 as the value is negative, zero or positive.
    pub fn sign(&self) -> i32 {
        self.mantissa.signum() as i32
    }

    /// Whether the value is a whole number (of any size).
    pub fn is_integer(&self) -> bool {
        self.exponent >= 0
    }

    /// The value as an `i64`, if it is a whole number that fits (Kubernetes' `AsInt64`).
    pub fn as_i64(&self) -> Option<i64> {
        if !self.is_integer() {
            return None;
        }
        let scale = 10i128.checked_pow(self.exponent.unsigned_abs())?;
        i64::try_from(self.mantissa.checked_mul(scale)?).ok()
    }

    /// The nearest `f64` (infinite beyond the `f64` range).
    pub fn as_approximate_f64(&self) -> f64 {
        let text = format!("{}e{}", self.mantissa, self.exponent);
        match text.parse::<f64>() {
            Ok(value) => value,
            // Unreachable: the text is a valid float literal. Fall back to arithmetic.
            Err(_) => self.mantissa as f64 * 10f64.powi(self.exponent),
        }
    }

    /// The value in units of `10^scale`, rounded away from zero, if that fits an `i64`
    /// (Kubernetes' `ScaledValue`, which instead overflows silently).
    pub fn scaled_value(&self, scale: i32) -> Option<i64> {
        if self.mantissa == 0 {
            return Some(0);
        }
        let shift = i64::from(self.exponent) - i64::from(scale);
        if let Ok(m) = i64::try_from(self.mantissa)
            && shift.unsigned_abs() < 19
        {
            // In 64 bits: the same result without 128-bit products and divisions.
            let factor = POW10[shift.unsigned_abs() as usize] as i64;
            if shift >= 0 {
                return m.checked_mul(factor);
            }
            let (quotient, remainder) = (m / factor, m % factor);
            return Some(if remainder == 0 {
                quotient
            } else {
                quotient + m.signum()
            });
        }
        let units = if shift >= 0 {
            let factor = 10i128.checked_pow(u32::try_from(shift).ok()?)?;
            self.mantissa.checked_mul(factor)?
        } else {
            match u32::try_from(-shift)
                .ok()
                .and_then(|s| 10i128.checked_pow(s))
            {
                Some(divisor) => {
                    let (quotient, remainder) = (self.mantissa / divisor, self.mantissa % divisor);
                    if remainder == 0 {
                        quotient
                    } else {
                        quotient + self.mantissa.signum()
                    }
                }
                // Less than one unit: away from zero is one unit.
                None => self.mantissa.signum(),
            }
        };
        i64::try_from(units).ok()
    }

    /// The value rounded away from zero to a whole number, if it fits an `i64`
    /// (Kubernetes' `Value`).
    pub fn value(&self) -> Option<i64> {
        self.scaled_value(0)
    }

    /// The value in thousandths, rounded away from zero, if it fits an `i64`
    /// (Kubernetes' `MilliValue`).
    pub fn milli_value(&self) -> Option<i64> {
        self.scaled_value(-3)
    }

    /// `self + other`, or `None` if the exact sum needs more than 38 significant digits (or an
    /// exponent beyond 2147483647). The sum prints in `self`'s format, or in `other`'s when
    /// `self` is zero, as Kubernetes' `Add` does.
    pub fn checked_add(&self, other: &Quantity) -> Option<Quantity> {
        if self.is_zero() {
            return Some(*other);
        }
        if other.is_zero() {
            return Some(*self);
        }
        let exponent = self.exponent.min(other.exponent);
        let a = self.aligned_magnitude(exponent)?;
        let b = other.aligned_magnitude(exponent)?;
        let (a_negative, b_negative) = (self.mantissa < 0, other.mantissa < 0);
        let (negative, magnitude) = if a_negative == b_negative {
            (a_negative, a.checked_add(b)?)
        } else if a >= b {
            (a_negative, a - b)
        } else {
            (b_negative, b - a)
        };
        Quantity::from_parts(negative, magnitude, i64::from(exponent), self.format)
    }

    /// `self - other`, or `None` as for [`checked_add`](Self::checked_add). The difference prints
    /// in `self`'s format, or in `other`'s when `self` is zero, as Kubernetes' `Sub` does.
    pub fn checked_sub(&self, other: &Quantity) -> Option<Quantity> {
        self.checked_add(&-*other)
    }

    /// Builds a normalised quantity, or `None` when it is out of range.
    fn from_parts(
        negative: bool,
        magnitude: u128,
        exponent: i64,
        format: Format,
    ) -> Option<Quantity> {
        if magnitude == 0 {
            return Some(Quantity {
                mantissa: 0,
                exponent: 0,
                format,
            });
        }
        let (mut magnitude, mut exponent) = (magnitude, exponent);
        if let Ok(mut small) = u64::try_from(magnitude) {
            // Trailing zeros in 64 bits: cheaper divisions, same result.
            while small % 10 == 0 {
                small /= 10;
                exponent = exponent.saturating_add(1);
            }
            magnitude = u128::from(small);
        } else {
            while magnitude % 10 == 0 {
                magnitude /= 10;
                exponent = exponent.saturating_add(1);
            }
        }
        if magnitude > MAX_MANTISSA || !(NANO..=MAX_EXPONENT).contains(&exponent) {
            return None;
        }
        let mantissa = magnitude as i128;
        Some(Quantity {
            mantissa: if negative { -mantissa } else { mantissa },
            exponent: exponent as i32,
            format,
        })
    }

    /// |self| in units of `10^exponent` (at most `self.exponent`), if that fits.
    fn aligned_magnitude(&self, exponent: i32) -> Option<u128> {
        let shift = self.exponent.checked_sub(exponent)?;
        if let (Ok(small), Ok(at)) = (
            u64::try_from(self.mantissa.unsigned_abs()),
            usize::try_from(shift),
        ) && let Some(&factor) = POW10.get(at)
        {
            // Two 64-bit factors: the product fits 128 bits.
            return Some(u128::from(small) * u128::from(factor));
        }
        let factor = 10u128.checked_pow(u32::try_from(shift).ok()?)?;
        self.mantissa.unsigned_abs().checked_mul(factor)
    }

    /// Compares magnitudes of two non-zero quantities.
    fn cmp_magnitude(&self, other: &Quantity) -> Ordering {
        let (a, b) = (self.mantissa.unsigned_abs(), other.mantissa.unsigned_abs());
        if self.exponent == other.exponent {
            return a.cmp(&b);
        }
        // Both within 64 bits and exponents less than 20 apart: aligned, the larger exponent's
        // magnitude times 10^difference fits 128 bits.
        if let (Ok(small_a), Ok(small_b)) = (u64::try_from(a), u64::try_from(b))
            && let Some(&factor) = POW10.get(self.exponent.abs_diff(other.exponent) as usize)
        {
            let (a, b) = (u128::from(small_a), u128::from(small_b));
            let factor = u128::from(factor);
            return if self.exponent > other.exponent {
                (a * factor).cmp(&b)
            } else {
                a.cmp(&(b * factor))
            };
        }
        // 10^(order-1) <= |x| < 10^order
        let order_a = i64::from(decimal_len(a)) + i64::from(self.exponent);
        let order_b = i64::from(decimal_len(b)) + i64::from(other.exponent);
        if order_a != order_b {
            return order_a.cmp(&order_b);
        }
        // Same order of magnitude: the exponents differ by fewer than 38, so aligning fits.
        let exponent = self.exponent.min(other.exponent);
        match (
            self.aligned_magnitude(exponent),
            other.aligned_magnitude(exponent),
        ) {
            (Some(a), Some(b)) => a.cmp(&b),
            // Unreachable by the argument above; keep a total order regardless.
            _ => self.exponent.cmp(&other.exponent),
        }
    }
}

impl Default for Quantity {
    /// Zero, in DecimalSI.
    fn default() -> Self {
        Quantity {
            mantissa: 0,
            exponent: 0,
            format: Format::DecimalSI,
        }
    }
}

impl PartialEq for Quantity {
    fn eq(&self, other: &Self) -> bool {
        // Normalised: equal values have equal parts.
        self.mantissa == other.mantissa && self.exponent == other.exponent
    }
}

impl Eq for Quantity {}

impl Hash for Quantity {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.mantissa.hash(state);
        self.exponent.hash(state);
    }
}

impl Ord for Quantity {
    fn cmp(&self, other: &Self) -> Ordering {
        let (a, b) = (self.mantissa.signum(), other.mantissa.signum());
        if a != b {
            return a.cmp(&b);
        }
        match a {
            0 => Ordering::Equal,
            1 => self.cmp_magnitude(other),
            _ => other.cmp_magnitude(self),
        }
    }
}

impl PartialOrd for Quantity {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl std::ops::Neg for Quantity {
    type Output = Quantity;

    /// The negated value, in the same format (always representable).
    fn neg(self) -> Quantity {
        Quantity {
            mantissa: -self.mantissa,
            ..self
        }
    }
}

impl Serialize for Quantity {
    /// Serialises as the canonical string, as Kubernetes does.
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Quantity {
    /// Deserialises from a string (surrounding whitespace ignored, as the API server does) or a
    /// number. A float arrives as its shortest decimal spelling, so `1e3` reads as DecimalSI
    /// `1k` where Kubernetes, reading the JSON text, keeps DecimalExponent; the value is the same.
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(QuantityVisitor)
    }
}

struct QuantityVisitor;

impl QuantityVisitor {
    fn parse<E: de::Error>(text: &str) -> Result<Quantity, E> {
        Quantity::parse(text.trim()).map_err(E::custom)
    }
}

impl Visitor<'_> for QuantityVisitor {
    type Value = Quantity;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a Kubernetes quantity string such as \"1.5Gi\", or a number")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Quantity, E> {
        Self::parse(v)
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Quantity, E> {
        Ok(Quantity::from_i64(v, Format::DecimalSI))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Quantity, E> {
        Self::parse(&v.to_string())
    }

    fn visit_i128<E: de::Error>(self, v: i128) -> Result<Quantity, E> {
        Self::parse(&v.to_string())
    }

    fn visit_u128<E: de::Error>(self, v: u128) -> Result<Quantity, E> {
        Self::parse(&v.to_string())
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Quantity, E> {
        if !v.is_finite() {
            return Err(E::custom(format_args!(
                "invalid quantity {v}: not a finite number"
            )));
        }
        Self::parse(&v.to_string())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
