//! What the daemon's benches report beside criterion's medians: percentiles, and the rows they
//! write to `target/bench-figures/` for `cargo xtask bench`'s report.

use std::path::Path;
use std::time::Duration;

/// The `p` quantile (0 to 1) of `v`.
pub(crate) fn percentile(mut v: Vec<Duration>, p: f64) -> Duration {
    v.sort();
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

/// Writes `rows` (measure, value) to `target/bench-figures/NAME.md` as report rows.
pub(crate) fn write(name: &str, rows: &[(String, String)]) {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("../bench-figures");
    std::fs::create_dir_all(&dir).unwrap();
    let text: String = rows
        .iter()
        .map(|(measure, value)| format!("| {measure} | {value} |\n"))
        .collect();
    std::fs::write(dir.join(format!("{name}.md")), text).unwrap();
}
