//! Claim device status (KEP-4817): after a prepare, this driver's devices go into the claim's
//! `status.devices` (condition `Ready`, the backend's data and network interface); after an
//! unprepare they are taken out again.
//!
//! The writes never hold up the kubelet: they are queued and made in the background, started in
//! the order the claims changed, a few claims at a time, and one at a time while the kubelet
//! waits for a prepare or unprepare (whose own requests to the API server come first). The
//! queue holds at most one change per claim, the newest: a claim unprepared before its prepare
//! was written only has its clearing made, and one claim never has two writes under way (so a
//! claim's clearing never lands before its own earlier write, and a node preparing claims
//! faster than the API server takes their status keeps one entry per claim, not one per
//! call). A write that may succeed later is tried a few times with a growing pause, while other
//! claims' writes go on; one for a claim that is gone is dropped at once.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::StreamExt as _;
use futures::stream::FuturesUnordered;
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

/// Claims whose writes are under way at once while no kubelet call is: each is one request to
/// the API server (within the claim reader's own bound on requests in flight), so the status of
/// a burst of claims lands several times sooner than one write at a time, and a claim whose
/// write waits to be tried again holds up no other.
const MAX_WRITES_IN_FLIGHT: usize = 8;

/// Claims whose writes are under way at once while the kubelet waits for a prepare or an
/// unprepare: the kubelet's call has a deadline and reads claims from the same API server, a
/// status write has none, so writes take no more of the server than before then.
const WRITES_BESIDE_A_KUBELET_CALL: usize = 1;

/// Above this many slots, an empty queue gives its memory back.
const KEEP_CAPACITY: usize = 64;

/// Claims with a change not yet written: their UIDs in the order they changed, each one's
/// newest change, and the claims whose write is under way.
#[derive(Debug, Default)]
struct Pending {
    /// Claims with a change to start, oldest first; none of them is in `writing`.
    order: VecDeque<ClaimUid>,
    changes: HashMap<ClaimUid, StatusChange>,
    writing: HashSet<ClaimUid>,
}

impl Pending {
    /// Queues `change`, replacing the claim's change not yet written. A claim whose write is
    /// under way gets its place in the order when that write ends.
    fn push(&mut self, change: StatusChange) {
        let uid = change.claim().uid.clone();
        let queued = self.changes.contains_key(&uid);
        let writing = self.writing.contains(&uid);
        self.changes.insert(uid.clone(), change);
        if !queued && !writing {
            self.order.push_back(uid);
        }
    }

    /// The oldest claim's change, its claim now counted as being written.
    fn pop(&mut self) -> Option<StatusChange> {
        let change = loop {
            let uid = self.order.pop_front()?;
            if let Some(c) = self.changes.remove(&uid) {
                self.writing.insert(uid);
                break c;
            }
        };
        self.shrink_when_idle();
        Some(change)
    }

    /// The write of `uid` ended: a newer change queued meanwhile goes to the end of the order.
    fn finish(&mut self, uid: &ClaimUid) {
        self.writing.remove(uid);
        if self.changes.contains_key(uid) {
            self.order.push_back(uid.clone());
        }
        self.shrink_when_idle();
    }

    /// Gives back the memory of a burst once nothing is queued.
    fn shrink_when_idle(&mut self) {
        if self.order.is_empty() {
            if self.order.capacity() > KEEP_CAPACITY {
                self.order.shrink_to(KEEP_CAPACITY);
            }
            if self.changes.capacity() > KEEP_CAPACITY {
                self.changes.shrink_to(KEEP_CAPACITY);
            }
        }
        if self.writing.is_empty() && self.writing.capacity() > KEEP_CAPACITY {
            self.writing.shrink_to(KEEP_CAPACITY);
        }
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
    /// Claims the kubelet is waiting for (prepares and unprepares under way).
    kubelet_waits: Arc<AtomicUsize>,
}

/// Counts one claim the kubelet is waiting for, until dropped.
#[derive(Debug)]
pub(crate) struct KubeletWaits(Arc<AtomicUsize>);

impl Drop for KubeletWaits {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl StatusWriter {
    /// Starts the background writer over `claims` (within a Tokio runtime); it ends when every
    /// handle is dropped.
    pub(crate) fn start(claims: Arc<dyn ClaimSource>) -> Self {
        let pending = Arc::new(Mutex::new(Pending::default()));
        let (wake, rx) = mpsc::channel(1);
        let kubelet_waits = Arc::new(AtomicUsize::new(0));
        tokio::spawn(write_all(
            claims,
            pending.clone(),
            rx,
            kubelet_waits.clone(),
        ));
        StatusWriter {
            pending,
            wake,
            kubelet_waits,
        }
    }

    /// Marks a prepare or unprepare the kubelet waits for, until the guard is dropped: writes
    /// are made one at a time meanwhile.
    pub(crate) fn kubelet_waits(&self) -> KubeletWaits {
        self.kubelet_waits.fetch_add(1, Ordering::SeqCst);
        KubeletWaits(self.kubelet_waits.clone())
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

/// Makes the queued changes, [`MAX_WRITES_IN_FLIGHT`] at a time (one while the kubelet waits
/// for a claim), until every handle is dropped and nothing is left to write.
async fn write_all(
    claims: Arc<dyn ClaimSource>,
    pending: Arc<Mutex<Pending>>,
    mut wake: mpsc::Receiver<()>,
    kubelet_waits: Arc<AtomicUsize>,
) {
    let mut writing = FuturesUnordered::new();
    let mut open = true;
    loop {
        let most = if kubelet_waits.load(Ordering::SeqCst) > 0 {
            WRITES_BESIDE_A_KUBELET_CALL
        } else {
            MAX_WRITES_IN_FLIGHT
        };
        while writing.len() < most {
            let Some(change) = pending.lock().pop() else {
                break;
            };
            let claims = claims.clone();
            writing.push(async move {
                write(claims.as_ref(), &change).await;
                change.claim().uid.clone()
            });
        }
        if writing.is_empty() {
            // Nothing under way, so nothing is queued either.
            if !open || wake.recv().await.is_none() {
                return;
            }
            continue;
        }
        tokio::select! {
            Some(uid) = writing.next() => pending.lock().finish(&uid),
            woken = wake.recv(), if open => open = woken.is_some(),
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
    use async_trait::async_trait;
    use kubedev_core::AllocatedDevice;
    use kubedev_kubelet_grpc::dra::ClaimError;
    use tokio::sync::watch;

    use super::*;

    /// Records every write as it ends, and how many were under way at once. Writes of the
    /// claims in `held` (all, with `*`) wait until released; claims named `gone-*` are not in
    /// the cluster.
    struct Recording {
        writes: Mutex<Vec<String>>,
        attempts: AtomicUsize,
        held: HashSet<String>,
        released: watch::Sender<bool>,
        under_way: AtomicUsize,
        most_under_way: AtomicUsize,
        /// How long each write takes.
        takes: Duration,
    }

    impl Recording {
        fn holding(held: &[&str], takes: Duration) -> Arc<Self> {
            Arc::new(Recording {
                writes: Mutex::default(),
                attempts: AtomicUsize::new(0),
                held: held.iter().map(|h| (*h).to_string()).collect(),
                released: watch::channel(false).0,
                under_way: AtomicUsize::new(0),
                most_under_way: AtomicUsize::new(0),
                takes,
            })
        }

        fn release(&self) {
            self.released.send_replace(true);
        }

        async fn gate(&self, claim: &ClaimRef, what: &str) -> Result<(), ClaimError> {
            self.attempts.fetch_add(1, Ordering::SeqCst);
            let now = self.under_way.fetch_add(1, Ordering::SeqCst) + 1;
            self.most_under_way.fetch_max(now, Ordering::SeqCst);
            if self.held.contains("*") || self.held.contains(claim.name.as_str()) {
                let mut released = self.released.subscribe();
                released.wait_for(|r| *r).await.unwrap();
            }
            tokio::time::sleep(self.takes).await;
            self.under_way.fetch_sub(1, Ordering::SeqCst);
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
        for _ in 0..1000 {
            if recording.writes.lock().len() >= writes {
                break;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        recording.writes.lock().clone()
    }

    async fn wait_for_attempts(recording: &Recording, attempts: usize) {
        for _ in 0..1000 {
            if recording.attempts.load(Ordering::SeqCst) >= attempts {
                return;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        panic!("fewer than {attempts} writes started");
    }

    #[tokio::test]
    async fn a_claim_unprepared_before_its_write_is_only_cleared_and_the_queue_stays_one_per_claim()
    {
        let recording = Recording::holding(&["*"], Duration::ZERO);
        let writer = StatusWriter::start(recording.clone());
        // The first writes take every slot while 1000 claims come and go behind them.
        for i in 0..MAX_WRITES_IN_FLIGHT {
            writer.send(StatusChange::Prepared(claim(&format!("first{i}")), vec![]));
        }
        wait_for_attempts(&recording, MAX_WRITES_IN_FLIGHT).await;
        for i in 0..1000 {
            let c = claim(&format!("c{i}"));
            writer.send(StatusChange::Prepared(c.clone(), vec![]));
            writer.send(StatusChange::Unprepared(c));
        }
        assert_eq!(writer.queued(), 1000, "one queued change per claim");
        recording.release();
        let writes = settle(&recording, MAX_WRITES_IN_FLIGHT + 1000).await;
        assert_eq!(
            writes.len(),
            MAX_WRITES_IN_FLIGHT + 1000,
            "{:?}",
            &writes[..5]
        );
        let (first, rest) = writes.split_at(MAX_WRITES_IN_FLIGHT);
        assert!(
            first.iter().all(|w| w.starts_with("write first")),
            "{first:?}"
        );
        assert!(
            rest.iter().all(|w| w.starts_with("clear c")),
            "only clearings after the first writes: {:?}",
            &rest[..5]
        );
        let at = |w: &str| rest.iter().position(|x| x == w).unwrap();
        assert!(
            at("clear c0") < at("clear c999"),
            "claims in the order they changed"
        );
        assert_eq!(writer.queued(), 0);
        let pending = writer.pending.lock();
        assert!(pending.order.capacity() <= KEEP_CAPACITY);
        assert!(pending.writing.is_empty());
    }

    #[tokio::test]
    async fn writes_run_side_by_side_within_the_bound_and_a_held_claim_holds_up_no_other() {
        let recording = Recording::holding(&["slow"], Duration::from_millis(5));
        let writer = StatusWriter::start(recording.clone());
        writer.send(StatusChange::Prepared(claim("slow"), vec![]));
        for i in 0..100 {
            writer.send(StatusChange::Prepared(claim(&format!("c{i}")), vec![]));
        }
        // One at a time, these 100 writes would wait behind the held one.
        let writes = settle(&recording, 100).await;
        assert_eq!(writes.len(), 100, "{writes:?}");
        assert!(!writes.contains(&"write slow".to_string()));
        let most = recording.most_under_way.load(Ordering::SeqCst);
        assert!(
            most > 1 && most <= MAX_WRITES_IN_FLIGHT,
            "{most} writes under way at once"
        );
        recording.release();
        assert_eq!(settle(&recording, 101).await.len(), 101);
    }

    #[tokio::test]
    async fn writes_go_one_at_a_time_while_the_kubelet_waits_for_a_claim() {
        let recording = Recording::holding(&[], Duration::from_millis(5));
        let writer = StatusWriter::start(recording.clone());
        let waiting = writer.kubelet_waits();
        for i in 0..30 {
            writer.send(StatusChange::Prepared(claim(&format!("a{i}")), vec![]));
        }
        assert_eq!(settle(&recording, 30).await.len(), 30);
        assert_eq!(recording.most_under_way.load(Ordering::SeqCst), 1);
        drop(waiting);
        for i in 0..30 {
            writer.send(StatusChange::Prepared(claim(&format!("b{i}")), vec![]));
        }
        assert_eq!(settle(&recording, 60).await.len(), 60);
        assert!(recording.most_under_way.load(Ordering::SeqCst) > 1);
    }

    #[tokio::test]
    async fn a_claim_changed_while_its_write_is_under_way_is_written_again_after_it() {
        let recording = Recording::holding(&["x"], Duration::ZERO);
        let writer = StatusWriter::start(recording.clone());
        writer.send(StatusChange::Prepared(claim("x"), vec![]));
        wait_for_attempts(&recording, 1).await;
        writer.send(StatusChange::Unprepared(claim("x")));
        writer.send(StatusChange::Prepared(claim("y"), vec![]));
        assert_eq!(settle(&recording, 1).await, vec!["write y".to_string()]);
        // The clearing waits for the write under way; it does not start beside it.
        assert_eq!(recording.attempts.load(Ordering::SeqCst), 2);
        recording.release();
        assert_eq!(
            settle(&recording, 3).await,
            vec![
                "write y".to_string(),
                "write x".to_string(),
                "clear x".to_string()
            ]
        );
        assert!(writer.pending.lock().writing.is_empty());
    }

    #[tokio::test]
    async fn a_gone_claim_is_not_tried_again() {
        let recording = Recording::holding(&[], Duration::ZERO);
        let writer = StatusWriter::start(recording.clone());
        writer.send(StatusChange::Prepared(claim("gone-a"), vec![]));
        writer.send(StatusChange::Prepared(claim("b"), vec![]));
        // Were the gone claim retried, it would be tried four times over 6.2 s, longer than
        // `settle` waits.
        let writes = settle(&recording, 1).await;
        assert_eq!(writes, vec!["write b".to_string()]);
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(recording.attempts.load(Ordering::SeqCst), 2);
    }
}
