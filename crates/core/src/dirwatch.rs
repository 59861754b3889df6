//! Waking up when directory entries come and go: inotify, with a periodic resync as a safety
//! net. Backends use it to notice device nodes and sockets appearing and disappearing, the
//! kubelet servers to notice the kubelet's socket coming back after a restart.
//!
//! A [`DirWatch`] is used in one of two ways:
//!
//! - [`wait`](DirWatch::wait) when any change means "look again": it returns after the next
//!   change (the burst of events that came with it counts once) or after a resync period, and
//!   needs no inotify at all ([`DirWatch::new`] falls back to polling).
//!   [`watch_by_rescan`](crate::rescan::watch_by_rescan) is the whole watch loop built on it.
//! - [`next`](DirWatch::next) when it matters which entry changed: it returns one
//!   [`DirEvent`] at a time, naming the directory and the entry, and follows a watched
//!   directory that is removed and created again.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::{OsStr, OsString};
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use inotify::{Event, EventMask, EventStream, Inotify, WatchDescriptor, WatchMask};

/// How often [`DirWatch::next`] looks whether a watched directory that went away is back.
const GONE_POLL: Duration = Duration::from_millis(50);

/// How long [`DirWatch::next`] pauses after inotify failed before it sets inotify up again.
const REOPEN_PAUSE: Duration = Duration::from_millis(100);

/// Something that happened in a watched directory, as [`DirWatch::next`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum DirEvent {
    /// An entry appeared in `dir` (created or moved in).
    Created {
        /// The watched directory, as it was given to [`DirWatch::watch`].
        dir: PathBuf,
        /// The entry's name in it.
        name: OsString,
    },
    /// An entry disappeared from `dir` (deleted or moved out).
    Deleted {
        /// The watched directory, as it was given to [`DirWatch::watch`].
        dir: PathBuf,
        /// The entry's name in it.
        name: OsString,
    },
    /// A file in `dir` was written and closed; reported only by a watcher made
    /// [`noticing_writes`](DirWatch::noticing_writes).
    Written {
        /// The watched directory, as it was given to [`DirWatch::watch`].
        dir: PathBuf,
        /// The entry's name in it.
        name: OsString,
    },
    /// Events may have been missed — the kernel's queue overflowed, a watched directory was
    /// removed and is back (and watched again), or inotify failed and was set up anew: look at
    /// everything again.
    Rescan,
}

impl DirEvent {
    /// The directory and entry name of a `Created` or `Deleted` event.
    pub fn entry(&self) -> Option<(&Path, &OsStr)> {
        match self {
            DirEvent::Created { dir, name }
            | DirEvent::Deleted { dir, name }
            | DirEvent::Written { dir, name } => Some((dir, name)),
            DirEvent::Rescan => None,
        }
    }
}

/// An inotify instance watching directories for entries created, deleted or moved, or — when
/// inotify is unavailable (no instances left, an unusual kernel) and the watcher was made with
/// [`DirWatch::new`] — nothing, so [`wait`](Self::wait) polls.
#[derive(Debug)]
pub struct DirWatch {
    stream: Option<EventStream<Vec<u8>>>,
    /// The directory each watch stands for.
    dirs: BTreeMap<WatchDescriptor, PathBuf>,
    /// Directories that were watched and went away (removed or moved): [`next`](Self::next)
    /// watches them again once they are back.
    gone: BTreeSet<PathBuf>,
    /// Whether a failure to watch a directory that came back was already logged.
    warned: bool,
    /// Whether files written and closed are reported too.
    writes: bool,
}

impl Default for DirWatch {
    fn default() -> Self {
        Self::new()
    }
}

fn mask(writes: bool) -> WatchMask {
    let writes = if writes {
        WatchMask::CLOSE_WRITE
    } else {
        WatchMask::empty()
    };
    writes
        | WatchMask::CREATE
        | WatchMask::DELETE
        | WatchMask::MOVED_FROM
        | WatchMask::MOVED_TO
        | WatchMask::DELETE_SELF
        | WatchMask::MOVE_SELF
        | WatchMask::ONLYDIR
}

fn open() -> io::Result<EventStream<Vec<u8>>> {
    Inotify::init().and_then(|i| i.into_event_stream(vec![0u8; 8192]))
}

impl DirWatch {
    /// A new watcher; logs and falls back to polling when inotify cannot be set up. Like every
    /// constructor, it must be called within a Tokio runtime.
    pub fn new() -> Self {
        Self::try_new().unwrap_or_else(|error| {
            tracing::warn!(%error, "inotify unavailable; polling instead");
            Self::with_stream(None)
        })
    }

    /// A new watcher, or the error when inotify cannot be set up (no polling fallback).
    pub fn try_new() -> io::Result<Self> {
        open().map(|s| Self::with_stream(Some(s)))
    }

    /// A watcher on `dir`, which must exist; the error names the directory.
    pub fn watching(dir: &Path) -> io::Result<Self> {
        let mut w = Self::try_new().map_err(|e| watch_error(dir, &e))?;
        w.try_watch(dir)?;
        Ok(w)
    }

    fn with_stream(stream: Option<EventStream<Vec<u8>>>) -> Self {
        DirWatch {
            stream,
            dirs: BTreeMap::new(),
            gone: BTreeSet::new(),
            warned: false,
            writes: false,
        }
    }

    /// The same watcher, also noticing files written in place (a file written and closed:
    /// [`DirEvent::Written`]), for directories of files whose content matters (configuration,
    /// policy modules) rather than of device nodes, which are written all the time. Call it
    /// before watching a directory.
    pub fn noticing_writes(mut self) -> Self {
        self.writes = true;
        self
    }

    /// Whether this watcher has no inotify and [`wait`](Self::wait) only polls.
    pub fn is_polling(&self) -> bool {
        self.stream.is_none()
    }

    /// Watches `dir` (a real path on this machine) if it exists. Adding a directory that is
    /// already watched is harmless, so callers of [`wait`](Self::wait) re-add their directories
    /// after every wake-up (which also picks up directories that were re-created).
    pub fn watch(&mut self, dir: &Path) {
        if self.stream.is_none() {
            return;
        }
        if let Err(error) = self.try_watch(dir) {
            tracing::debug!(%error, "cannot watch directory");
        }
    }

    /// Watches `dir`, or says why it cannot (the error names the directory): it does not exist,
    /// is no directory, or inotify is unavailable.
    pub fn try_watch(&mut self, dir: &Path) -> io::Result<()> {
        let Some(stream) = &self.stream else {
            let e = io::Error::new(io::ErrorKind::Unsupported, "inotify is unavailable");
            return Err(watch_error(dir, &e));
        };
        let wd = stream
            .watches()
            .add(dir, mask(self.writes))
            .map_err(|e| watch_error(dir, &e))?;
        self.dirs.insert(wd, dir.to_path_buf());
        self.gone.remove(dir);
        Ok(())
    }

    /// Waits for the next change in a watched directory (the burst of events that arrived with
    /// it is drained, so a burst wakes the caller once) or for `resync` to pass, whichever is
    /// first. Should reading inotify fail, it polls from then on.
    pub async fn wait(&mut self, resync: Duration) {
        let Some(stream) = &mut self.stream else {
            tokio::time::sleep(resync).await;
            return;
        };
        let mut burst = Vec::new();
        tokio::select! {
            ev = stream.next() => match ev {
                Some(Ok(ev)) => {
                    burst.push(ev);
                    while let Some(Some(Ok(ev))) = stream.next().now_or_never() {
                        burst.push(ev);
                    }
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
        for ev in burst {
            self.translate(ev);
        }
    }

    /// The next change in a watched directory.
    ///
    /// A watched directory that is removed (or moved away) is not an event of its own: the
    /// watcher looks for it every 50 ms, watches it again once it is back and then reports
    /// [`DirEvent::Rescan`], since entries may have come and gone meanwhile. When reading inotify
    /// fails, it is set up again with the same directories, and that is a `Rescan` too.
    ///
    /// Cancel-safe: dropping the future loses no event. Without inotify it waits until
    /// inotify can be set up, so use it on a watcher from [`try_new`](Self::try_new) or
    /// [`watching`](Self::watching), and [`wait`](Self::wait) where polling is enough.
    pub async fn next(&mut self) -> DirEvent {
        loop {
            if self.stream.is_none() {
                if self.reopen() {
                    return DirEvent::Rescan;
                }
                tokio::time::sleep(REOPEN_PAUSE).await;
                continue;
            }
            if self.rewatch_returned() {
                return DirEvent::Rescan;
            }
            let poll_gone = !self.gone.is_empty();
            let Some(stream) = &mut self.stream else {
                continue;
            };
            let ev = tokio::select! {
                ev = stream.next() => ev,
                () = tokio::time::sleep(GONE_POLL), if poll_gone => continue,
            };
            match ev {
                Some(Ok(ev)) => {
                    if let Some(ev) = self.translate(ev) {
                        return ev;
                    }
                }
                Some(Err(error)) => {
                    tracing::warn!(%error, "reading inotify events failed; setting it up again");
                    self.stream = None;
                    tokio::time::sleep(REOPEN_PAUSE).await;
                }
                None => {
                    tracing::warn!("inotify stream ended; setting it up again");
                    self.stream = None;
                }
            }
        }
    }

    /// What `ev` means to the caller; keeps the watched and gone directories up to date.
    fn translate(&mut self, ev: Event<OsString>) -> Option<DirEvent> {
        if ev.mask.contains(EventMask::Q_OVERFLOW) {
            return Some(DirEvent::Rescan);
        }
        // Events of a watch already given up (its last `IGNORED`) are nobody's.
        let dir = self.dirs.get(&ev.wd)?.clone();
        if ev
            .mask
            .intersects(EventMask::DELETE_SELF | EventMask::MOVE_SELF | EventMask::IGNORED)
        {
            self.dirs.remove(&ev.wd);
            if ev.mask.contains(EventMask::MOVE_SELF)
                && let Some(stream) = &self.stream
            {
                // The watch would follow the directory to its new name.
                let _ = stream.watches().remove(ev.wd);
            }
            if !self.dirs.values().any(|d| *d == dir) {
                self.gone.insert(dir);
            }
            return None;
        }
        let name = ev.name?;
        if ev.mask.intersects(EventMask::CREATE | EventMask::MOVED_TO) {
            Some(DirEvent::Created { dir, name })
        } else if ev
            .mask
            .intersects(EventMask::DELETE | EventMask::MOVED_FROM)
        {
            Some(DirEvent::Deleted { dir, name })
        } else if ev.mask.contains(EventMask::CLOSE_WRITE) {
            Some(DirEvent::Written { dir, name })
        } else {
            None
        }
    }

    /// Watches the gone directories that are back; true when one was.
    fn rewatch_returned(&mut self) -> bool {
        let back: Vec<PathBuf> = self.gone.iter().filter(|d| d.is_dir()).cloned().collect();
        let mut any = false;
        for dir in back {
            match self.try_watch(&dir) {
                Ok(()) => any = true,
                Err(error) if !self.warned => {
                    tracing::warn!(%error, "watching a re-created directory failed; retrying");
                    self.warned = true;
                }
                Err(_) => {}
            }
        }
        if any {
            self.warned = false;
        }
        any
    }

    /// Sets inotify up again with every directory watched so far; true when it worked.
    fn reopen(&mut self) -> bool {
        let stream = match open() {
            Ok(s) => s,
            Err(error) => {
                if !self.warned {
                    tracing::warn!(%error, "setting up inotify failed; retrying");
                    self.warned = true;
                }
                return false;
            }
        };
        self.warned = false;
        self.stream = Some(stream);
        let dirs: BTreeSet<PathBuf> = std::mem::take(&mut self.dirs).into_values().collect();
        for dir in dirs {
            if self.try_watch(&dir).is_err() {
                self.gone.insert(dir);
            }
        }
        true
    }
}

fn watch_error(dir: &Path, error: &io::Error) -> io::Error {
    io::Error::new(error.kind(), format!("watching {}: {error}", dir.display()))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn created(dir: &Path, name: &str) -> DirEvent {
        DirEvent::Created {
            dir: dir.to_path_buf(),
            name: name.into(),
        }
    }

    #[tokio::test]
    async fn a_watcher_noticing_writes_reports_a_file_written_in_place() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("kubedev.yaml");
        std::fs::write(&file, "a: 1\n").unwrap();
        let mut plain = DirWatch::try_new().unwrap();
        plain.try_watch(dir.path()).unwrap();
        let mut w = DirWatch::try_new().unwrap().noticing_writes();
        w.try_watch(dir.path()).unwrap();
        std::fs::write(&file, "a: 2\n").unwrap();
        assert_eq!(
            w.next().await,
            DirEvent::Written {
                dir: dir.path().to_path_buf(),
                name: "kubedev.yaml".into()
            }
        );
        // A watcher of device directories is not woken by writes.
        assert!(
            tokio::time::timeout(Duration::from_millis(200), plain.next())
                .await
                .is_err()
        );
    }

    #[tokio::test]
    async fn reports_creation_deletion_and_directory_recreation() {
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("plugins");
        std::fs::create_dir(&sub).unwrap();
        let mut w = DirWatch::watching(&sub).unwrap();
        std::fs::write(sub.join("kubelet.sock"), "").unwrap();
        assert_eq!(w.next().await, created(&sub, "kubelet.sock"));
        std::fs::remove_file(sub.join("kubelet.sock")).unwrap();
        assert_eq!(
            w.next().await,
            DirEvent::Deleted {
                dir: sub.clone(),
                name: "kubelet.sock".into()
            }
        );
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
        assert_eq!(w.next().await, created(&sub, "a"));
    }

    #[tokio::test]
    async fn names_the_directory_of_each_event_and_keeps_reporting_after_one_is_gone() {
        let root = tempfile::tempdir().unwrap();
        let (a, b) = (root.path().join("a"), root.path().join("b"));
        std::fs::create_dir(&a).unwrap();
        std::fs::create_dir(&b).unwrap();
        let mut w = DirWatch::try_new().unwrap();
        w.try_watch(&a).unwrap();
        w.try_watch(&b).unwrap();
        std::fs::write(b.join("x"), "").unwrap();
        assert_eq!(w.next().await, created(&b, "x"));
        std::fs::remove_file(b.join("x")).unwrap();
        std::fs::remove_dir(&b).unwrap();
        assert_eq!(
            w.next().await,
            DirEvent::Deleted {
                dir: b.clone(),
                name: "x".into()
            }
        );
        // `b` is gone; `a` is still watched.
        std::fs::write(a.join("y"), "").unwrap();
        let ev = tokio::time::timeout(Duration::from_secs(5), w.next())
            .await
            .unwrap();
        assert_eq!(ev.entry(), Some((a.as_path(), OsStr::new("y"))));
    }

    #[tokio::test]
    async fn watching_a_missing_directory_names_it() {
        let root = tempfile::tempdir().unwrap();
        let missing = root.path().join("missing");
        let err = DirWatch::watching(&missing).unwrap_err();
        assert!(
            crate::echo::chain(&err).contains(&*missing.to_string_lossy()),
            "{err}"
        );
    }

    #[tokio::test]
    async fn wait_wakes_on_a_change_or_after_the_resync() {
        let root = tempfile::tempdir().unwrap();
        let mut w = DirWatch::new();
        w.watch(root.path());
        let start = tokio::time::Instant::now();
        w.wait(Duration::from_millis(50)).await;
        assert!(start.elapsed() >= Duration::from_millis(50));
        let path = root.path().join("node");
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            std::fs::write(path, "").unwrap();
        });
        let start = tokio::time::Instant::now();
        w.wait(Duration::from_secs(30)).await;
        assert!(start.elapsed() < Duration::from_secs(30));
    }
}
