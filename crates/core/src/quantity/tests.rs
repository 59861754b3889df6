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

mod parsing;
mod printing;
mod properties;
mod values;
