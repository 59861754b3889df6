//! Parsers of what sysfs files hold: hexadecimal and decimal numbers and `uevent` files.

use std::collections::BTreeMap;

/// Parses a hexadecimal number as sysfs writes them: optional `0x`, 1 to 16 digits, surrounding
/// white space ignored.
pub fn parse_hex(s: &str) -> Option<u64> {
    let s = s.trim();
    let digits = s
        .strip_prefix("0x")
        .or_else(|| s.strip_prefix("0X"))
        .unwrap_or(s);
    if digits.is_empty() || digits.len() > 16 || !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u64::from_str_radix(digits, 16).ok()
}

/// Parses a decimal number (optionally negative), surrounding white space ignored.
pub fn parse_dec(s: &str) -> Option<i64> {
    let s = s.trim();
    let digits = s.strip_prefix('-').unwrap_or(s);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// A `uevent` file that is not a list of `KEY=VALUE` lines.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("uevent line {line}: {problem}")]
#[non_exhaustive]
pub struct UeventError {
    /// The 1-based line number.
    pub line: usize,
    /// What is wrong with it.
    pub problem: String,
}

/// Parses a sysfs `uevent` file (`KEY=VALUE` per `\n`-terminated line, as the kernel writes it;
/// empty lines ignored; a key repeated keeps its last value).
pub fn parse_uevent(s: &str) -> Result<BTreeMap<String, String>, UeventError> {
    let mut out = BTreeMap::new();
    for (i, line) in s.split('\n').enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            return Err(UeventError {
                line: i + 1,
                problem: format!("{:?} has no '='", line.chars().take(64).collect::<String>()),
            });
        };
        if key.is_empty() || !key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
            return Err(UeventError {
                line: i + 1,
                problem: format!(
                    "{:?} is not a key (letters, digits and '_')",
                    key.chars().take(64).collect::<String>()
                ),
            });
        }
        out.insert(key.to_string(), value.to_string());
    }
    Ok(out)
}
