//! Printing: the canonical text of a quantity, as Kubernetes' `Quantity.String()` writes it,
//! and the `Display` and `Debug` impls that use it.

use std::fmt;

use super::digits::{mul_small, to_digits};
use super::{Format, Quantity};

impl Quantity {
    /// The canonical text, as Kubernetes' `Quantity.String()` writes it.
    fn canonical(&self) -> String {
        if self.mantissa == 0 {
            return "0".to_owned();
        }
        let sign = if self.mantissa < 0 { "-" } else { "" };
        let magnitude = self.mantissa.unsigned_abs();
        let exponent = self.exponent;
        let mut format = self.format;
        if format == Format::BinarySI {
            let below_1024 = exponent < 4
                && 10u128
                    .checked_pow(exponent.unsigned_abs())
                    .and_then(|p| magnitude.checked_mul(p))
                    .is_some_and(|v| v < 1024);
            if exponent < 0 || below_1024 {
                // Fractions and values below 1024 print as DecimalSI.
                format = Format::DecimalSI;
            } else if exponent < 70 {
                // A whole number: the count of factors 1024 picks the suffix, up to Ei.
                let twos = magnitude.trailing_zeros() + exponent as u32;
                let power = twos / 10;
                if power <= 6 {
                    let from_mantissa = (10 * power).min(magnitude.trailing_zeros());
                    let from_exponent = 10 * power - from_mantissa;
                    let mut digits = to_digits(magnitude >> from_mantissa);
                    let mut fives = from_exponent;
                    while fives > 0 {
                        let step = fives.min(27);
                        digits = mul_small(&digits, 5u64.pow(step));
                        fives -= step;
                    }
                    let mut text = String::from(sign);
                    text.extend(digits.iter().map(|d| char::from(b'0' + d)));
                    text.extend(std::iter::repeat_n(
                        '0',
                        (exponent as u32 - from_exponent) as usize,
                    ));
                    text.push_str(["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"][power as usize]);
                    return text;
                }
                // Past Ei there is no binary suffix.
                format = Format::DecimalExponent;
            } else {
                format = Format::DecimalExponent;
            }
        }
        // Lower the exponent to a multiple of three, moving zeros into the mantissa.
        let extra_zeros = exponent.rem_euclid(3);
        let exponent = exponent - extra_zeros;
        let mut text = format!("{sign}{magnitude}");
        text.extend(std::iter::repeat_n('0', extra_zeros as usize));
        let decimal_si = match exponent {
            -9 => Some("n"),
            -6 => Some("u"),
            -3 => Some("m"),
            0 => Some(""),
            3 => Some("k"),
            6 => Some("M"),
            9 => Some("G"),
            12 => Some("T"),
            15 => Some("P"),
            18 => Some("E"),
            _ => None,
        };
        match (format, decimal_si) {
            (Format::DecimalSI, Some(suffix)) => text.push_str(suffix),
            // DecimalSI has no suffix past E: it falls back to an exponent, as Kubernetes does.
            _ if exponent == 0 => {}
            _ => {
                text.push('e');
                text.push_str(&exponent.to_string());
            }
        }
        text
    }
}

impl fmt::Display for Quantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(&self.canonical())
    }
}

impl fmt::Debug for Quantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Quantity")
            .field(&format_args!("{}", self.canonical()))
            .field(&self.format)
            .finish()
    }
}
