//! Fail points: named steps at which the daemon aborts or pauses on purpose, for crash-safety
//! tests.
//!
//! `KUBEDEV_FAILPOINTS` holds a comma-separated list of step names; the process aborts (no
//! unwinding, no cleanup — like `kill -9`) the first time it reaches one of them. A step written
//! `<step>=pause:<ms>` pauses that long there instead (to hold an operation in flight, e.g.
//! while a second instance starts); one written `<step>=fail` makes the step fail with an
//! error where the step can ([`fails`]). Unset, every check is a cheap lookup in an empty map.

use std::collections::HashMap;
use std::sync::OnceLock;
use std::time::Duration;

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

/// What an armed step does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    Abort,
    Pause(Duration),
    Fail,
}

fn parse(v: &str) -> HashMap<String, Action> {
    v.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| match s.split_once("=pause:") {
            None if s.ends_with("=fail") => (s.trim_end_matches("=fail").to_string(), Action::Fail),
            Some((step, ms)) => match ms.parse::<u64>() {
                Ok(ms) => (step.to_string(), Action::Pause(Duration::from_millis(ms))),
                // A malformed pause still marks the step: abort, which a test notices.
                Err(_) => (step.to_string(), Action::Abort),
            },
            None => (s.to_string(), Action::Abort),
        })
        .collect()
}

fn armed() -> &'static HashMap<String, Action> {
    static ARMED: OnceLock<HashMap<String, Action>> = OnceLock::new();
    ARMED.get_or_init(|| std::env::var(ENV).map(|v| parse(&v)).unwrap_or_default())
}

/// Aborts the process when `step` is armed to abort; pauses when it is armed to pause.
pub async fn reached(step: &str) {
    match armed().get(step) {
        None => {}
        Some(Action::Abort) => {
            eprintln!("kubedev: fail point {step:?} reached; aborting");
            std::process::abort();
        }
        Some(Action::Pause(d)) => tokio::time::sleep(*d).await,
        Some(Action::Fail) => {}
    }
}

/// Whether `step` is armed to fail (`<step>=fail`): the caller then fails as the step would.
/// The first backend watch of the daemon fails at `backend-watch`; the discovery of every
/// backend when the daemon starts (not a later one) at `startup-discovery`.
pub fn fails(step: &str) -> bool {
    armed().get(step) == Some(&Action::Fail)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_abort_or_pause() {
        let m = parse(
            " after-cdi-write , after-prepare-started=pause:250,during-unprepare=pause:x,backend-watch=fail",
        );
        assert_eq!(m["after-cdi-write"], Action::Abort);
        assert_eq!(
            m["after-prepare-started"],
            Action::Pause(Duration::from_millis(250))
        );
        assert_eq!(m["during-unprepare"], Action::Abort);
        assert_eq!(m["backend-watch"], Action::Fail);
        assert_eq!(m.len(), 4);
    }
}
