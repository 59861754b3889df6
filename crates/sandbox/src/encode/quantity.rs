//! Quantity values as a policy reads them: Kubernetes' `Value()`, with the common forms parsed
//! without the general parser and every text parsed once per message.

use kubedev_core::Quantity;

use super::same;

/// Parsed quantities of this message, by text: capacities and counters repeat across
/// devices, and parsing is the costly part.
pub(super) struct Quantities<'a> {
    pub(super) seen: Vec<(&'a str, i64)>,
}

impl<'a> Quantities<'a> {
    pub(super) fn value(&mut self, text: &'a str) -> i64 {
        if let Some(&(_, v)) = self
            .seen
            .iter()
            .rev()
            .find(|(t, _)| same(t.as_bytes(), text.as_bytes()))
        {
            return v;
        }
        let v = quantity_value(text);
        if self.seen.len() < 32 {
            self.seen.push((text, v));
        }
        v
    }
}

/// Kubernetes' `Value()` of a quantity as written: rounded away from zero, saturated to the
/// `i64` range; 0 when the text is not a quantity (the allocator rejects such devices before
/// a policy sees them).
pub(crate) fn quantity_value(text: &str) -> i64 {
    if let Some(v) = simple_quantity(text) {
        return v;
    }
    match Quantity::parse(text) {
        Ok(q) => saturated_value(&q),
        Err(_) => 0,
    }
}

/// The common forms exactly, without the general parser: digits with an optional binary
/// (`Ki` … `Ei`) or decimal (`k`, `M` … `E`) suffix, when the value fits an `i64`.
fn simple_quantity(text: &str) -> Option<i64> {
    let digits = text.bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 || digits > 18 {
        return None;
    }
    let n: i64 = text[..digits].parse().ok()?;
    let factor: i64 = match &text[digits..] {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "Pi" => 1 << 50,
        "Ei" => 1 << 60,
        "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        "P" => 1_000_000_000_000_000,
        "E" => 1_000_000_000_000_000_000,
        _ => return None,
    };
    n.checked_mul(factor)
}

pub(super) fn saturated_value(q: &Quantity) -> i64 {
    q.value()
        .unwrap_or(if q.sign() < 0 { i64::MIN } else { i64::MAX })
}
