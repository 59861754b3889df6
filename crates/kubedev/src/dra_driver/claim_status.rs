//! Claim device status (KEP-4817): after a prepare, this driver's devices go into the claim's
//! `status.devices` (condition `Ready`, the backend's data and network interface); after an
//! unprepare they are taken out again.
//!
//! The writes never hold up the kubelet: they are queued and made in the background, one at a
//! time, claims in the order they changed. The queue holds at most one change per claim, the
//! newest: a claim unprepared before its prepare was written only has its clearing made (so a
//! claim's clearing never lands before its own earlier write, and a node preparing claims
//! faster than the API server takes their status keeps one entry per claim, not one per
//! call). A write that may succeed later is tried a few times with a growing pause; one for a
//! claim that is gone is dropped at once.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use kubedev_core::{ClaimRef, ClaimUid, PreparedDevice};
use parking_lot::Mutex;
use tokio::sync::mpsc;

use super::claim_source::{CLAIM_GONE, ClaimSource};

/// One change of a claim's device status.
#[derive(Debug)]
pub(crate) enum StatusChange {
    /// The claim's devices are prepared, as the backend answered.
    Prepared(ClaimRef, Vec<PreparedDevice>),
    /// The claim is unprepared.
    Unprepared(ClaimRef),
}

impl StatusChange {
    fn claim(&self) -> &ClaimRef {
        match self {
            StatusChange::Prepared(c, _) | StatusChange::Unprepared(c) => c,
        }
    }
}

/// Pauses between the attempts of one write; after the last it is given up (and logged).
const RETRY_PAUSES: [Duration; 3] = [
    Duration::from_millis(200),
    Duration::from_secs(1),
    Duration::from_secs(5),
];

/// Above this many slots, an empty queue gives its memory back.
const KEEP_CAPACITY: usize = 64;

/// Claims with a change not yet written: their UIDs in the order they changed, and each one's
/// newest change.
#[derive(Debug, Default)]
struct Pending {
    order: VecDeque<ClaimUid>,
    changes: HashMap<ClaimUid, StatusChange>,
}

impl Pending {
    /// Queues `change`, replacing the claim's change not yet written.
    fn push(&mut self, change: StatusChange) {
        let uid = change.claim().uid.clone();
        if self.changes.insert(uid.clone(), change).is_none() {
            self.order.push_back(uid);
        }
    }

    /// The oldest claim's change.
    fn pop(&mut self) -> Option<StatusChange> {
        let change = loop {
            let uid = self.order.pop_front()?;
            if let Some(c) = self.changes.remove(&uid) {
                break c;
            }
        };
        if self.order.is_empty() {
            if self.order.capacity() > KEEP_CAPACITY {
                self.order.shrink_to(KEEP_CAPACITY);
            }
            if self.changes.capacity() > KEEP_CAPACITY {
                self.changes.shrink_to(KEEP_CAPACITY);
            }
        }
        Some(change)
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.changes.len()
    }
}

/// The queue of status writes and the task making them.
#[derive(Debug, Clone)]
pub(crate) struct StatusWriter {
    pending: Arc<Mutex<Pending>>,
    /// Wakes the task; it ends when every handle is dropped.
    wake: mpsc::Sender<()>,
}

impl StatusWriter {
    /// Starts the background writer over `claims` (within a Tokio runtime); it ends when every
    /// handle is dropped.
    pub(crate) fn start(claims: Arc<dyn ClaimSource>) -> Self {
        let pending = Arc::new(Mutex::new(Pending::default()));
        let (wake, rx) = mpsc::channel(1);
        tokio::spawn(write_all(claims, pending.clone(), rx));
        StatusWriter { pending, wake }
    }

    /// Queues `change`, replacing the same claim's change not yet written.
    pub(crate) fn send(&self, change: StatusChange) {
        self.pending.lock().push(change);
        // Full: the task is woken already and will find this change.
        let _ = self.wake.try_send(());
    }

    /// How many claims have a change not yet written.
    #[cfg(test)]
    fn queued(&self) -> usize {
        self.pending.lock().len()
    }
}

async fn write_all(
    claims: Arc<dyn ClaimSource>,
    pending: Arc<Mutex<Pending>>,
    mut wake: mpsc::Receiver<()>,
) {
    while wake.recv().await.is_some() {
        loop {
            let Some(change) = pending.lock().pop() else {
                break;
            };
            write(claims.as_ref(), &change).await;
        }
    }
}

/// Makes one change, trying again while the failure may pass.
async fn write(claims: &dyn ClaimSource, change: &StatusChange) {
    let claim = change.claim();
    let what = match change {
        StatusChange::Prepared(..) => "writing",
        StatusChange::Unprepared(_) => "clearing",
    };
    let mut pauses = RETRY_PAUSES.iter();
    loop {
        let result = match change {
            StatusChange::Prepared(c, devices) => claims.report_prepared(c, devices).await,
            StatusChange::Unprepared(c) => claims.report_unprepared(c).await,
        };
        let error = match result {
            Ok(()) => return,
            Err(e) if e.reason() == CLAIM_GONE => {
                tracing::debug!(claim = %claim, error = %e, "{what} the claim's device status: the claim is gone");
                return;
            }
            Err(e) => e,
        };
        match pauses.next() {
            Some(pause) if error.is_retryable() => {
                tracing::debug!(claim = %claim, %error, "{what} the claim's device status failed; trying again");
                tokio::time::sleep(*pause).await;
            }
            _ => {
                tracing::warn!(claim = %claim, %error, "{what} the claim's device status failed; given up (the devices stay prepared)");
                return;
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use async_trait::async_trait;
    use kubedev_core::AllocatedDevice;
    use kubedev_kubelet_grpc::dra::ClaimError;
    use tokio::sync::Notify;

    use super::*;

    /// Records every write; the first write waits until released, so changes pile up behind
    /// it. Claims named `gone-*` are not in the cluster.
    #[derive(Default)]
    struct Recording {
        writes: Mutex<Vec<String>>,
        attempts: AtomicUsize,
        release: Notify,
    }

    impl Recording {
        async fn gate(&self, claim: &ClaimRef, what: &str) -> Result<(), ClaimError> {
            if self.attempts.fetch_add(1, Ordering::SeqCst) == 0 {
                self.release.notified().await;
            }
            if claim.name.as_str().starts_with("gone-") {
                return Err(ClaimError::permanent(
                    CLAIM_GONE,
                    format!("claim {claim} not found"),
                ));
            }
            self.writes.lock().push(format!("{what} {}", claim.name));
            Ok(())
        }
    }

    #[async_trait]
    impl ClaimSource for Recording {
        async fn allocated_devices(
            &self,
            _: &ClaimRef,
        ) -> Result<Vec<AllocatedDevice>, ClaimError> {
            Ok(vec![])
        }

        async fn report_prepared(
            &self,
            claim: &ClaimRef,
            _: &[PreparedDevice],
        ) -> Result<(), ClaimError> {
            self.gate(claim, "write").await
        }

        async fn report_unprepared(&self, claim: &ClaimRef) -> Result<(), ClaimError> {
            self.gate(claim, "clear").await
        }
    }

    fn claim(name: &str) -> ClaimRef {
        ClaimRef::parse(&format!("uid-{name}"), "default", name).unwrap()
    }

    async fn settle(recording: &Recording, writes: usize) -> Vec<String> {
        for _ in 0..500 {
            if recording.writes.lock().len() >= writes {
                break;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        recording.writes.lock().clone()
    }

    #[tokio::test]
    async fn a_claim_unprepared_before_its_write_is_only_cleared_and_the_queue_stays_one_per_claim()
    {
        let recording = Arc::new(Recording::default());
        let writer = StatusWriter::start(recording.clone());
        // The first write holds the writer while 1000 claims come and go behind it.
        writer.send(StatusChange::Prepared(claim("first"), vec![]));
        tokio::time::sleep(Duration::from_millis(20)).await;
        for i in 0..1000 {
            let c = claim(&format!("c{i}"));
            writer.send(StatusChange::Prepared(c.clone(), vec![]));
            writer.send(StatusChange::Unprepared(c));
        }
        assert_eq!(writer.queued(), 1000, "one queued change per claim");
        recording.release.notify_one();
        let writes = settle(&recording, 1001).await;
        assert_eq!(writes.len(), 1001, "{writes:?}");
        assert_eq!(writes[0], "write first");
        assert!(
            writes[1..].iter().all(|w| w.starts_with("clear ")),
            "only clearings after the first write: {:?}",
            &writes[..5]
        );
        assert_eq!(writes[1], "clear c0", "claims in the order they changed");
        assert_eq!(writer.queued(), 0);
        assert!(writer.pending.lock().order.capacity() <= KEEP_CAPACITY);
    }

    #[tokio::test]
    async fn a_gone_claim_is_not_tried_again() {
        let recording = Arc::new(Recording::default());
        let writer = StatusWriter::start(recording.clone());
        recording.release.notify_one();
        writer.send(StatusChange::Prepared(claim("gone-a"), vec![]));
        writer.send(StatusChange::Prepared(claim("b"), vec![]));
        // Were the gone claim retried, b would wait behind its pauses (6.2 s in all), longer
        // than `settle` waits, and the gone claim would be tried four times.
        let writes = settle(&recording, 1).await;
        assert_eq!(writes, vec!["write b".to_string()]);
        assert_eq!(recording.attempts.load(Ordering::SeqCst), 2);
    }
}
