//! Waiting for the kernel (and udev) to show the effect of a sysfs write.
//!
//! Binding a driver or creating an mdev happens inside the write, but the `/dev/vfio` node is
//! made by devtmpfs and given its permissions by udev a little later; so each change is
//! followed by a bounded wait for what the next step needs.

use std::time::{Duration, Instant};

use crate::error::VfioError;

/// Polls `done` (1 ms at first, backing off to 20 ms) until it is true or `timeout` passes.
pub(crate) fn wait_until(
    timeout: Duration,
    what: &str,
    mut done: impl FnMut() -> bool,
) -> Result<(), VfioError> {
    let start = Instant::now();
    let mut pause = Duration::from_millis(1);
    loop {
        if done() {
            return Ok(());
        }
        if start.elapsed() >= timeout {
            return Err(VfioError::Timeout {
                what: what.to_owned(),
                timeout_ms: timeout.as_millis() as u64,
            });
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(20));
    }
}
