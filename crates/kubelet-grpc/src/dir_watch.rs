//! Watches a kubelet socket directory (inotify) to notice kubelet restarts.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use futures::StreamExt;
use inotify::{EventMask, EventStream, Inotify, WatchMask};

use crate::Error;

/// Something that happened in the watched directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum DirEvent {
    /// A file appeared (created or moved in).
    Created(OsString),
    /// A file disappeared (deleted or moved out).
    Deleted(OsString),
    /// The directory itself was removed and is back, or events were lost: look again.
    Rescan,
}

/// An inotify watch on one directory that survives the directory being removed and re-created.
pub(crate) struct DirWatch {
    dir: PathBuf,
    stream: EventStream<Vec<u8>>,
}

impl std::fmt::Debug for DirWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirWatch").field("dir", &self.dir).finish()
    }
}

fn mask() -> WatchMask {
    WatchMask::CREATE
        | WatchMask::DELETE
        | WatchMask::MOVED_FROM
        | WatchMask::MOVED_TO
        | WatchMask::DELETE_SELF
        | WatchMask::MOVE_SELF
}

impl DirWatch {
    /// Starts watching `dir`, which must exist.
    pub(crate) fn new(dir: &Path) -> Result<Self, Error> {
        let err = |error| Error::Watch {
            path: dir.to_path_buf(),
            error,
        };
        let inotify = Inotify::init().map_err(err)?;
        inotify.watches().add(dir, mask()).map_err(err)?;
        let stream = inotify.into_event_stream(vec![0u8; 8192]).map_err(err)?;
        Ok(DirWatch {
            dir: dir.to_path_buf(),
            stream,
        })
    }

    /// The next event. Errors reading inotify become `Rescan` after a short pause.
    pub(crate) async fn next(&mut self) -> DirEvent {
        loop {
            match self.stream.next().await {
                Some(Ok(ev)) => {
                    if ev.mask.contains(EventMask::Q_OVERFLOW) {
                        return DirEvent::Rescan;
                    }
                    if ev
                        .mask
                        .intersects(EventMask::DELETE_SELF | EventMask::MOVE_SELF)
                        || ev.mask.contains(EventMask::IGNORED)
                    {
                        self.rewatch().await;
                        return DirEvent::Rescan;
                    }
                    let Some(name) = ev.name else { continue };
                    if ev.mask.intersects(EventMask::CREATE | EventMask::MOVED_TO) {
                        return DirEvent::Created(name);
                    }
                    if ev
                        .mask
                        .intersects(EventMask::DELETE | EventMask::MOVED_FROM)
                    {
                        return DirEvent::Deleted(name);
                    }
                }
                Some(Err(e)) => {
                    tracing::warn!(dir = %self.dir.display(), error = %e, "inotify read failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    self.rewatch().await;
                    return DirEvent::Rescan;
                }
                None => {
                    self.rewatch().await;
                    return DirEvent::Rescan;
                }
            }
        }
    }

    /// Waits until the directory exists again and watches it anew.
    async fn rewatch(&mut self) {
        let mut warned = false;
        loop {
            if self.dir.is_dir() {
                match DirWatch::new(&self.dir) {
                    Ok(w) => {
                        *self = w;
                        return;
                    }
                    Err(e) if !warned => {
                        tracing::warn!(error = %e, "re-watching directory failed; retrying");
                        warned = true;
                    }
                    Err(_) => {}
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn reports_creation_deletion_and_directory_recreation() {
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("plugins");
        std::fs::create_dir(&sub).unwrap();
        let mut w = DirWatch::new(&sub).unwrap();
        std::fs::write(sub.join("kubelet.sock"), "").unwrap();
        assert_eq!(w.next().await, DirEvent::Created("kubelet.sock".into()));
        std::fs::remove_file(sub.join("kubelet.sock")).unwrap();
        assert_eq!(w.next().await, DirEvent::Deleted("kubelet.sock".into()));
        std::fs::remove_dir(&sub).unwrap();
        let again = sub.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(200)).await;
            std::fs::create_dir(&again).unwrap();
        });
        assert_eq!(
            tokio::time::timeout(Duration::from_secs(5), w.next())
                .await
                .unwrap(),
            DirEvent::Rescan
        );
        std::fs::write(sub.join("a"), "").unwrap();
        assert_eq!(w.next().await, DirEvent::Created("a".into()));
    }
}
