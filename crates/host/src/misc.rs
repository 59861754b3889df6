//! The cgroup v2 `misc.capacity` file: how many of each miscellaneous resource the host has
//! (confidential-VM address-space IDs: `tdx`, `sev`, `sev_es`; SGX EPC: `sgx_epc`).

use std::collections::BTreeMap;
use std::path::Path;

use crate::error::HostError;

/// Where the root cgroup lists the host's miscellaneous resources (kernel 5.13 and later).
pub const MISC_CAPACITY: &str = "/sys/fs/cgroup/misc.capacity";

/// Parses `misc.capacity` text (`<resource> <count>` per line, e.g. `tdx 15`, `sev 509`,
/// `sev_es 0`; empty lines ignored). `path` is only used in errors, which name it and the
/// 1-based line number.
pub fn parse_misc_capacity(path: &Path, text: &str) -> Result<BTreeMap<String, u64>, HostError> {
    let mut out = BTreeMap::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let bad = |reason: &str| HostError::MiscCapacity {
            path: path.to_path_buf(),
            line: i + 1,
            content: line.chars().take(64).collect(),
            reason: reason.to_string(),
        };
        let mut parts = line.split_whitespace();
        let (Some(name), Some(count), None) = (parts.next(), parts.next(), parts.next()) else {
            return Err(bad("expected `<resource> <count>`"));
        };
        if !name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        {
            return Err(bad(
                "the resource name is not lower-case letters, digits and '_'",
            ));
        }
        if !count.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad("the count is not a non-negative decimal number"));
        }
        let count: u64 = count.parse().map_err(|_| bad("the count is too large"))?;
        if out.insert(name.to_string(), count).is_some() {
            return Err(bad("the resource is listed twice"));
        }
    }
    Ok(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_kernel_format() {
        let m =
            parse_misc_capacity(Path::new(MISC_CAPACITY), "tdx 15\nsev 509\nsev_es 0\n\n").unwrap();
        assert_eq!(m["tdx"], 15);
        assert_eq!(m["sev"], 509);
        assert_eq!(m["sev_es"], 0);
        assert_eq!(m.len(), 3);
    }

    #[test]
    fn bad_lines_name_the_file_and_the_line() {
        for (text, line) in [
            ("tdx 15\nsev x\n", 2),
            ("tdx\n", 1),
            ("tdx 1 2\n", 1),
            ("sev 1\n\nTDX 3\n", 3),
            ("tdx -1\n", 1),
            ("tdx 99999999999999999999999\n", 1),
            ("tdx 1\ntdx 2\n", 2),
        ] {
            let err = parse_misc_capacity(Path::new(MISC_CAPACITY), text)
                .unwrap_err()
                .to_string();
            assert!(
                err.starts_with("/sys/fs/cgroup/misc.capacity: line ")
                    && err.contains(&format!("line {line}:")),
                "{text:?}: {err}"
            );
        }
    }
}
