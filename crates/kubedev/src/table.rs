//! Plain-text tables for the CLI: columns padded to their widest cell, the last left as is.

use std::fmt::Write as _;

/// One line per row, cells separated by two spaces; the last column is not padded (it may be
/// long, e.g. a list of attributes).
pub(crate) fn columns<const N: usize>(rows: &[[String; N]]) -> String {
    let widths: Vec<usize> = (0..N.saturating_sub(1))
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for r in rows {
        for (c, w) in widths.iter().enumerate() {
            let _ = write!(out, "{:<w$}  ", r[c]);
        }
        if let Some(last) = r.last() {
            out.push_str(last);
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn columns_line_up_and_the_last_is_not_padded() {
        let rows = [
            ["POOL".to_string(), "DEVICE".into(), "X".into()],
            ["node-a".into(), "gpu-0".into(), "long tail".into()],
        ];
        assert_eq!(
            super::columns(&rows),
            "POOL    DEVICE  X\nnode-a  gpu-0   long tail\n"
        );
    }
}
