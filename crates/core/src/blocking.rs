//! [`blocking`]: blocking work (the file system, a vendor library) run off the async threads.

/// Runs `f` on the runtime's threads for blocking work and waits for its result.
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

/// A blocking task that panicked or was cancelled before it finished.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a blocking task failed: {0}")]
pub struct BlockingError(String);

impl From<BlockingError> for crate::PrepareError {
    fn from(e: BlockingError) -> Self {
        crate::PrepareError::Other(e.to_string())
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
}
