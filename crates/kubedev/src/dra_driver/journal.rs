//! The driver's journal: the checkpoint store, the view of its records as last persisted, and
//! the one way changes reach the file. One group-commit task applies the changes that arrive
//! while a write is in flight together with the next write, so concurrent prepares share fsyncs
//! instead of queueing for one each. After each write the records are published to the view,
//! which the kubelet's calls read without waiting for a write in flight.

use std::sync::Arc;

use kubedev_core::ClaimUid;
use parking_lot::Mutex;
use tokio::sync::{mpsc, oneshot};

use super::blocking;
use crate::checkpoint::{Change, CheckpointStore, Claims};

/// The checkpoint's records by claim UID, as last persisted.
type Recorded = Arc<parking_lot::RwLock<Claims>>;

/// Copies `store`'s records to `recorded`: those of `uids`, or all of them (`None`).
fn publish(store: &CheckpointStore, recorded: &Recorded, uids: Option<&[ClaimUid]>) {
    let Some(uids) = uids else {
        *recorded.write() = store.claims().clone();
        return;
    };
    let mut view = recorded.write();
    for uid in uids {
        match store.get(uid.as_str()) {
            Some(record) => {
                view.insert(uid.clone(), record.clone());
            }
            None => {
                view.remove(uid.as_str());
            }
        }
    }
}

/// A change to persist, and where to say whether it was.
type Commit = (Change, oneshot::Sender<Result<(), String>>);

/// The group-commit task: applies the changes received on `rx` to `store`, in batches.
async fn committer(
    store: Arc<Mutex<CheckpointStore>>,
    recorded: Recorded,
    mut rx: mpsc::UnboundedReceiver<Commit>,
) {
    const MAX_BATCH: usize = 1024;
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(c) => batch.push(c),
                Err(_) => break,
            }
        }
        let (changes, replies): (Vec<Change>, Vec<_>) = batch.into_iter().unzip();
        let (store, recorded) = (store.clone(), recorded.clone());
        let outcome = kubedev_core::blocking(move || {
            let uids: Vec<ClaimUid> = changes.iter().map(|c| c.uid().clone()).collect();
            let mut store = store.lock();
            let reads = store.file_reads();
            let outcome = store.apply(changes);
            let only_these = store.file_reads() == reads;
            publish(&store, &recorded, only_these.then_some(&uids[..]));
            outcome
        })
        .await;
        match outcome {
            Ok(Ok(results)) => {
                for (reply, r) in replies.into_iter().zip(results) {
                    let _ = reply.send(r.map_err(|e| kubedev_core::echo::chain(&e)));
                }
            }
            Ok(Err(e)) => {
                let msg = format!("writing the checkpoint: {}", kubedev_core::echo::chain(&e));
                for reply in replies {
                    let _ = reply.send(Err(msg.clone()));
                }
            }
            Err(e) => {
                for reply in replies {
                    let _ = reply.send(Err(format!(
                        "writing the checkpoint: {}",
                        kubedev_core::echo::chain(&e)
                    )));
                }
            }
        }
    }
}

/// The checkpoint as the driver uses it; see the module docs.
pub(super) struct Journal {
    store: Arc<Mutex<CheckpointStore>>,
    recorded: Recorded,
    commits: mpsc::UnboundedSender<Commit>,
}

impl Journal {
    /// The journal of `store`. Must be called within a Tokio runtime: it starts the
    /// group-commit task, which ends when the journal is dropped.
    pub(super) fn start(store: CheckpointStore) -> Journal {
        let recorded: Recorded = Arc::new(parking_lot::RwLock::new(store.claims().clone()));
        let store = Arc::new(Mutex::new(store));
        let (commits, rx) = mpsc::unbounded_channel();
        tokio::spawn(committer(store.clone(), recorded.clone(), rx));
        Journal {
            store,
            recorded,
            commits,
        }
    }

    /// The records as last persisted; never waits for a write in flight (hold it briefly).
    pub(super) fn recorded(&self) -> parking_lot::RwLockReadGuard<'_, Claims> {
        self.recorded.read()
    }

    /// The store itself, for reads that must see what is being written (waits for a write in
    /// flight; hold it briefly).
    pub(super) fn stored(&self) -> parking_lot::MutexGuard<'_, CheckpointStore> {
        self.store.lock()
    }

    /// Persists one checkpoint change (possibly together with concurrent ones).
    pub(super) async fn commit(&self, change: Change) -> Result<(), String> {
        let (tx, rx) = oneshot::channel();
        self.commits
            .send((change, tx))
            .map_err(|_| "the checkpoint writer stopped".to_string())?;
        rx.await
            .map_err(|_| "the checkpoint writer stopped".to_string())?
    }

    /// Runs `f` on the checkpoint store off the async threads, then publishes its records.
    pub(super) async fn with_store<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut CheckpointStore) -> Result<T, String> + Send + 'static,
    ) -> Result<T, String> {
        let (store, recorded) = (self.store.clone(), self.recorded.clone());
        blocking(move || {
            let mut store = store.lock();
            let outcome = f(&mut store);
            publish(&store, &recorded, None);
            outcome
        })
        .await
    }
}
