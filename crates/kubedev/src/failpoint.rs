//! Fail points: named steps at which the daemon aborts on purpose, for crash-safety tests.
//!
//! `KUBEDEV_FAILPOINTS` holds a comma-separated list of step names; the process aborts (no
//! unwinding, no cleanup — like `kill -9`) the first time it reaches one of them. Unset, every
//! check is a cheap lookup in an empty set.

use std::collections::HashSet;
use std::sync::OnceLock;

/// The environment variable that arms fail points.
pub const ENV: &str = "KUBEDEV_FAILPOINTS";

/// The steps of prepare and unprepare at which a fail point can fire.
pub const STEPS: [&str; 5] = [
    "after-prepare-started",
    "after-device-prepare",
    "after-cdi-write",
    "before-prepare-completed",
    "during-unprepare",
];

fn armed() -> &'static HashSet<String> {
    static ARMED: OnceLock<HashSet<String>> = OnceLock::new();
    ARMED.get_or_init(|| {
        std::env::var(ENV)
            .map(|v| {
                v.split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default()
    })
}

/// Aborts the process when `step` is armed.
pub fn hit(step: &str) {
    if armed().contains(step) {
        eprintln!("kubedev: fail point {step:?} reached; aborting");
        std::process::abort();
    }
}
