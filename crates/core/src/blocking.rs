//! [`blocking`]: blocking work (the file system, a vendor library) run off the async threads.

/// Runs `f` on the runtime's threads for blocking work and waits for its result. For work
/// that finishes (a file written, a device probed); a loop that runs as long as the daemon
/// belongs on a thread of its own ([`dedicated`]): the daemon keeps few threads for blocking
/// work, and a loop would hold one of them for good.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let sum = kubedev_core::blocking(|| (1..=4).sum::<u32>()).await;
/// assert_eq!(sum, Ok(10));
/// # }
/// ```
pub async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, BlockingError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| BlockingError(crate::echo::chain(&e)))
}

/// Runs `f` on a new thread named `name` and waits for its result: for blocking work that runs
/// as long as the daemon (a watch of a vendor library's events), which would otherwise hold
/// one of the few threads [`blocking`] shares.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let n = kubedev_core::dedicated("count", || (1..=4).count()).await;
/// assert_eq!(n, Ok(4));
/// # }
/// ```
pub async fn dedicated<T: Send + 'static>(
    name: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, BlockingError> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name(name.to_string())
        .spawn(move || {
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
            let _ = tx.send(result);
        })
        .map_err(|e| BlockingError(format!("starting thread {name}: {e}")))?;
    match rx.await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(panic)) => Err(BlockingError(format!(
            "thread {name} panicked: {}",
            panic_text(panic.as_ref())
        ))),
        Err(_) => Err(BlockingError(format!(
            "thread {name} ended without a result"
        ))),
    }
}

fn panic_text(payload: &(dyn std::any::Any + Send)) -> &str {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(no message)")
}

/// A blocking task that panicked or was cancelled before it finished.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a blocking task failed: {0}")]
pub struct BlockingError(String);

impl From<BlockingError> for crate::error::PrepareError {
    fn from(e: BlockingError) -> Self {
        crate::error::PrepareError::Other(e.to_string())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_panicking_task_is_an_error_that_says_so() {
        let err = blocking(|| -> u32 { panic!("sysfs went away") })
            .await
            .unwrap_err();
        assert!(
            err.to_string().starts_with("a blocking task failed: "),
            "{err}"
        );
        assert!(err.to_string().contains("sysfs went away"), "{err}");
    }

    #[tokio::test]
    async fn a_dedicated_thread_that_panics_is_an_error_naming_it() {
        let err = dedicated("nvml-events", || -> u32 { panic!("driver unloaded") })
            .await
            .unwrap_err();
        assert!(err.to_string().contains("nvml-events"), "{err}");
        assert!(err.to_string().contains("driver unloaded"), "{err}");
    }
}
