//! Waking up when directory entries come and go: inotify, with a periodic resync as a safety
//! net. Backends use it to notice device nodes and sockets appearing and disappearing.

use std::path::Path;
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use inotify::{EventStream, Inotify, WatchMask};

/// An inotify instance watching directories for entries created, deleted or moved, or — when
/// inotify is unavailable (no instances left, an unusual kernel) — nothing, so callers poll.
#[derive(Debug)]
pub struct DirWatch {
    stream: Option<EventStream<Vec<u8>>>,
}

impl Default for DirWatch {
    fn default() -> Self {
        Self::new()
    }
}

impl DirWatch {
    /// A new watcher; logs and falls back to polling when inotify cannot be set up.
    pub fn new() -> Self {
        let stream = Inotify::init().and_then(|i| i.into_event_stream(vec![0u8; 4096]));
        match stream {
            Ok(s) => DirWatch { stream: Some(s) },
            Err(error) => {
                tracing::warn!(%error, "inotify unavailable; polling instead");
                DirWatch { stream: None }
            }
        }
    }

    /// Watches `dir` (a real path on this machine) if it exists. Adding a directory that is
    /// already watched is harmless, so callers re-add their directories after every wake-up
    /// (which also picks up directories that were re-created).
    pub fn watch(&mut self, dir: &Path) {
        let Some(stream) = &self.stream else {
            return;
        };
        let mask = WatchMask::CREATE
            | WatchMask::DELETE
            | WatchMask::MOVED_FROM
            | WatchMask::MOVED_TO
            | WatchMask::DELETE_SELF
            | WatchMask::MOVE_SELF
            | WatchMask::ONLYDIR;
        if let Err(error) = stream.watches().add(dir, mask) {
            tracing::debug!(dir = %dir.display(), %error, "cannot watch directory");
        }
    }

    /// Waits for the next change in a watched directory (the burst of events that arrived with
    /// it is drained) or for `resync` to pass, whichever is first.
    pub async fn wait(&mut self, resync: Duration) {
        let Some(stream) = &mut self.stream else {
            tokio::time::sleep(resync).await;
            return;
        };
        tokio::select! {
            ev = stream.next() => match ev {
                Some(Ok(_)) => {
                    while let Some(Some(Ok(_))) = stream.next().now_or_never() {}
                }
                Some(Err(error)) => {
                    tracing::warn!(%error, "reading inotify events failed; polling instead");
                    self.stream = None;
                }
                None => {
                    tracing::warn!("inotify stream ended; polling instead");
                    self.stream = None;
                }
            },
            () = tokio::time::sleep(resync) => {}
        }
    }
}
