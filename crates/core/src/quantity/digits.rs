//! Big-endian decimal digit strings: the exact arithmetic parsing and printing need beyond
//! 128 bits.

/// Multiplies a big-endian decimal digit string (no leading zeros) by `factor`.
pub(super) fn mul_small(digits: &[u8], factor: u64) -> Vec<u8> {
    if digits.is_empty() {
        return Vec::new();
    }
    let mut out = Vec::with_capacity(digits.len() + 20);
    let mut carry: u128 = 0;
    for d in digits.iter().rev() {
        let x = u128::from(*d) * u128::from(factor) + carry;
        out.push((x % 10) as u8);
        carry = x / 10;
    }
    while carry > 0 {
        out.push((carry % 10) as u8);
        carry /= 10;
    }
    while out.len() > 1 && out.last() == Some(&0) {
        out.pop();
    }
    out.reverse();
    out
}

/// Adds one to a big-endian decimal digit string.
pub(super) fn increment(digits: &mut Vec<u8>) {
    for d in digits.iter_mut().rev() {
        if *d == 9 {
            *d = 0;
        } else {
            *d += 1;
            return;
        }
    }
    digits.insert(0, 1);
}

/// Drops trailing zero digits, returning the exponent raised by their count.
pub(super) fn strip_trailing_zeros(digits: &mut Vec<u8>, exponent: i64) -> Option<i64> {
    let zeros = digits.iter().rev().take_while(|d| **d == 0).count();
    digits.truncate(digits.len() - zeros);
    exponent.checked_add(i64::try_from(zeros).ok()?)
}

/// The value of a big-endian decimal digit string, if it fits.
pub(super) fn digits_value(digits: &[u8]) -> Option<u128> {
    digits.iter().try_fold(0u128, |acc, d| {
        acc.checked_mul(10)?.checked_add(u128::from(*d))
    })
}

pub(super) fn to_digits(value: u128) -> Vec<u8> {
    value.to_string().bytes().map(|b| b - b'0').collect()
}

/// Decimal digits of a non-zero value.
pub(super) fn decimal_len(value: u128) -> u32 {
    value.checked_ilog10().map_or(1, |l| l + 1)
}
