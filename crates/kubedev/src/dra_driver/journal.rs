//! The driver's journal: the checkpoint store, the view of its records as last persisted, and
//! the one way changes reach the file. One group-commit task applies the changes that arrive
//! while a write is in flight together with the next write, so concurrent prepares share fsyncs
//! instead of queueing for one each. After each write the records are published to the view,
//! which the kubelet's calls read without waiting for a write in flight.

use std::sync::Arc;

use std::collections::HashMap;

use kubedev_core::{ClaimUid, DeviceName, PoolName};
use parking_lot::Mutex;
use tokio::sync::{mpsc, oneshot};

use super::{StepError, blocking};
use crate::checkpoint::{Change, CheckpointStore, ClaimRecord, Claims};

/// One claim's hold on a device in the recorded view.
#[derive(Debug, Clone)]
struct Hold {
    uid: ClaimUid,
    admin_access: bool,
}

/// The checkpoint's records by claim UID as last persisted, and for each device the claims
/// whose records hold it, so a device's holders are found without going through every claim.
#[derive(Debug, Default)]
pub(super) struct Recorded {
    claims: Claims,
    holders: HashMap<PoolName, HashMap<DeviceName, Vec<Hold>>>,
}

impl Recorded {
    /// The view of `claims`.
    fn of(claims: &Claims) -> Recorded {
        let mut view = Recorded::default();
        for record in claims.values() {
            view.insert(record.clone());
        }
        view
    }

    /// The record of the claim with UID `uid`.
    pub(super) fn get(&self, uid: &str) -> Option<&ClaimRecord> {
        self.claims.get(uid)
    }

    /// The claims whose records hold device `device` of pool `pool`, each with whether it
    /// holds it with admin access.
    pub(super) fn holders<'a>(
        &'a self,
        pool: &str,
        device: &str,
    ) -> impl Iterator<Item = (&'a ClaimRecord, bool)> + 'a {
        self.holders
            .get(pool)
            .and_then(|devices| devices.get(device))
            .into_iter()
            .flatten()
            .filter_map(|h| Some((self.claims.get(&h.uid)?, h.admin_access)))
    }

    /// Adds (or replaces) `record`.
    fn insert(&mut self, record: ClaimRecord) {
        let uid = record.claim.uid.clone();
        self.remove(&uid);
        for d in &record.devices {
            self.holders
                .entry(d.device.pool.clone())
                .or_default()
                .entry(d.device.device.clone())
                .or_default()
                .push(Hold {
                    uid: uid.clone(),
                    admin_access: d.admin_access,
                });
        }
        self.claims.insert(uid, record);
    }

    /// Removes the record of the claim with UID `uid`, and its holds.
    fn remove(&mut self, uid: &ClaimUid) {
        let Some(old) = self.claims.remove(uid) else {
            return;
        };
        for d in &old.devices {
            let Some(devices) = self.holders.get_mut(d.device.pool.as_str()) else {
                continue;
            };
            if let Some(holds) = devices.get_mut(d.device.device.as_str()) {
                holds.retain(|h| &h.uid != uid);
                if holds.is_empty() {
                    devices.remove(d.device.device.as_str());
                }
            }
            if devices.is_empty() {
                self.holders.remove(d.device.pool.as_str());
            }
        }
    }
}

/// The recorded view, shared by the driver and the group-commit task.
type SharedRecorded = Arc<parking_lot::RwLock<Recorded>>;

/// Copies `store`'s records to `recorded`: those of `uids`, or all of them (`None`).
fn publish(store: &CheckpointStore, recorded: &SharedRecorded, uids: Option<&[ClaimUid]>) {
    let Some(uids) = uids else {
        *recorded.write() = Recorded::of(store.claims());
        return;
    };
    let mut view = recorded.write();
    for uid in uids {
        match store.get(uid.as_str()) {
            Some(record) => view.insert(record.clone()),
            None => view.remove(uid),
        }
    }
}

/// A change to persist, and where to say whether it was.
type Commit = (Change, oneshot::Sender<Result<(), StepError>>);

/// The group-commit task: applies the changes received on `rx` to `store`, in batches.
async fn committer(
    store: Arc<Mutex<CheckpointStore>>,
    recorded: SharedRecorded,
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
                    let _ = reply.send(r.map_err(StepError::from));
                }
            }
            Ok(Err(e)) => {
                let e = Arc::new(e);
                for reply in replies {
                    let _ = reply.send(Err(StepError::Checkpoint(e.clone())));
                }
            }
            Err(e) => {
                for reply in replies {
                    let _ = reply.send(Err(StepError::Task(e.clone())));
                }
            }
        }
    }
}

/// The checkpoint as the driver uses it; see the module docs.
pub(super) struct Journal {
    store: Arc<Mutex<CheckpointStore>>,
    recorded: SharedRecorded,
    commits: mpsc::UnboundedSender<Commit>,
}

impl Journal {
    /// The journal of `store`. Must be called within a Tokio runtime: it starts the
    /// group-commit task, which ends when the journal is dropped.
    pub(super) fn start(store: CheckpointStore) -> Journal {
        let recorded: SharedRecorded =
            Arc::new(parking_lot::RwLock::new(Recorded::of(store.claims())));
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
    pub(super) fn recorded(&self) -> parking_lot::RwLockReadGuard<'_, Recorded> {
        self.recorded.read()
    }

    /// The store itself, for reads that must see what is being written (waits for a write in
    /// flight; hold it briefly).
    pub(super) fn stored(&self) -> parking_lot::MutexGuard<'_, CheckpointStore> {
        self.store.lock()
    }

    /// Persists one checkpoint change (possibly together with concurrent ones).
    pub(super) async fn commit(&self, change: Change) -> Result<(), StepError> {
        let (tx, rx) = oneshot::channel();
        self.commits
            .send((change, tx))
            .map_err(|_| StepError::WriterStopped)?;
        rx.await.map_err(|_| StepError::WriterStopped)?
    }

    /// Runs `f` on the checkpoint store off the async threads, then publishes its records.
    pub(super) async fn with_store<T: Send + 'static, E: Into<StepError> + Send + 'static>(
        &self,
        f: impl FnOnce(&mut CheckpointStore) -> Result<T, E> + Send + 'static,
    ) -> Result<T, StepError> {
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use kubedev_core::{AllocatedDevice, ClaimRef, DeviceRef};

    use super::*;
    use crate::checkpoint::ClaimState;

    fn record(uid: &str, devices: &[(&str, bool)]) -> ClaimRecord {
        ClaimRecord {
            claim: ClaimRef::parse(uid, "default", &format!("claim-{uid}")).unwrap(),
            state: ClaimState::PrepareCompleted,
            devices: devices
                .iter()
                .map(|&(name, admin_access)| {
                    AllocatedDevice::new(DeviceRef::new(
                        PoolName::new("node-a").unwrap(),
                        DeviceName::new(name).unwrap(),
                    ))
                    .with_admin_access(admin_access)
                })
                .collect(),
            prepared: Vec::new(),
            cdi_file: None,
            owner: None,
            pod_claim_name: None,
        }
    }

    fn holders(view: &Recorded, device: &str) -> Vec<(String, bool)> {
        view.holders("node-a", device)
            .map(|(r, admin)| (r.claim.uid.to_string(), admin))
            .collect()
    }

    #[test]
    fn each_device_knows_its_holders_and_forgets_them_with_the_record() {
        let mut view = Recorded::default();
        view.insert(record("a", &[("gpu-0", false), ("gpu-1", false)]));
        view.insert(record("b", &[("gpu-1", true)]));
        assert_eq!(holders(&view, "gpu-0"), [("a".to_string(), false)]);
        assert_eq!(
            holders(&view, "gpu-1"),
            [("a".to_string(), false), ("b".to_string(), true)]
        );
        assert!(holders(&view, "gpu-2").is_empty());
        assert!(view.holders("node-b", "gpu-0").next().is_none());

        // A record replaced with other devices holds only those.
        view.insert(record("a", &[("gpu-2", false)]));
        assert!(holders(&view, "gpu-0").is_empty());
        assert_eq!(holders(&view, "gpu-1"), [("b".to_string(), true)]);
        assert_eq!(holders(&view, "gpu-2"), [("a".to_string(), false)]);

        // Removing every record leaves nothing behind.
        view.remove(&ClaimUid::new("a").unwrap());
        view.remove(&ClaimUid::new("b").unwrap());
        view.remove(&ClaimUid::new("never-recorded").unwrap());
        assert!(view.claims.is_empty());
        assert!(view.holders.is_empty(), "{:?}", view.holders);
    }

    #[test]
    fn the_view_of_a_store_indexes_every_record() {
        let mut claims = Claims::new();
        for r in [
            record("a", &[("gpu-0", false)]),
            record("b", &[("gpu-0", true)]),
        ] {
            claims.insert(r.claim.uid.clone(), r);
        }
        let view = Recorded::of(&claims);
        assert_eq!(view.get("a").map(|r| r.devices.len()), Some(1));
        assert_eq!(holders(&view, "gpu-0").len(), 2);
    }
}
