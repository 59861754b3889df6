//! Writing the checkpoint: one group-commit task applies the changes that arrive while a write
//! is in flight together with the next write, so concurrent prepares share fsyncs instead of
//! queueing for one each. After each write the records are published to the driver's view,
//! which the kubelet's calls read without waiting for a write in flight.

use std::sync::Arc;

use kubedev_core::ClaimUid;
use parking_lot::Mutex;
use tokio::sync::{mpsc, oneshot};

use super::{DraDriver, Recorded, blocking};
use crate::checkpoint::{Change, CheckpointStore};

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
pub(super) type Commit = (Change, oneshot::Sender<Result<(), String>>);

/// The group-commit task: applies the changes received on `rx` to `store`, in batches.
pub(super) async fn committer(
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

impl DraDriver {
    /// Persists one checkpoint change (possibly together with concurrent ones).
    pub(super) async fn commit(&self, change: Change) -> Result<(), String> {
        let (tx, rx) = oneshot::channel();
        self.commits
            .send((change, tx))
            .map_err(|_| "the checkpoint writer stopped".to_string())?;
        rx.await
            .map_err(|_| "the checkpoint writer stopped".to_string())?
    }

    /// Runs `f` on the checkpoint store off the async threads.
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
