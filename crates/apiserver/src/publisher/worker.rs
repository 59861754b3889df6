//! The publisher's background task: the worker that waits for a reason to look at the slices
//! (a publish, a watch event, a backoff or overlay expiry, a re-probe), runs reconcile passes
//! (compare, then delete, update, create) and records how they went.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::ResourceSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::Api;
use kube::runtime::reflector::{self, Store};
use kubedev_core::ratelimit::TokenBucket;
use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use tracing::{debug, warn};

use super::overlay::Overlay;
use super::slice_watch::watch_slices;
use super::{Settings, Shared, bump};
use crate::convert::DesiredPool;
use crate::error::Error;
use crate::features::ApiFeature;
use crate::plan::{Accepted, Identity, content_key, desired_spec, plan};
use crate::ratelimit::{Backoff, request_limit};

/// How often a Node that could not be read is looked up again (for the owner reference).
const NODE_LOOKUP_RETRY: Duration = Duration::from_secs(30);
/// Conflicts in a row that are retried at once; after that they back off like other errors.
const MAX_IMMEDIATE_CONFLICTS: u32 = 8;

/// What one reconcile pass did.
enum Pass {
    /// Nothing published yet.
    Idle,
    /// Everything matched the desired state of this revision.
    Converged(u64),
    /// Writes were made; check again.
    Wrote,
    /// A write met a conflict; the object was re-read, check again.
    Conflict,
}

/// The outcome of one write.
pub(super) enum Step {
    Done,
    Conflict,
}

pub(super) struct Worker {
    pub(super) shared: Arc<Shared>,
    pub(super) settings: Settings,
    pub(super) id: Identity,
    pub(super) slices: Api<ResourceSlice>,
    pub(super) nodes: Api<Node>,
    pub(super) cache: Store<ResourceSlice>,
    pub(super) observed: Arc<AtomicU64>,
    pub(super) overlay: Overlay,
    pub(super) accepted: Accepted,
    pub(super) accepted_rev: u64,
    pub(super) owner: Option<OwnerReference>,
    pub(super) node_checked: Option<Instant>,
    pub(super) limiter: TokenBucket,
    pub(super) backoff: Backoff,
    pub(super) conflicts_in_row: u32,
    /// When the API server was last asked what it keeps.
    pub(super) probed: Option<Instant>,
}

pub(super) async fn run(shared: Arc<Shared>, settings: Settings, mut stop: watch::Receiver<bool>) {
    let slices: Api<ResourceSlice> = Api::all(shared.client.clone());
    let (cache, writer) = reflector::store();
    let observed = Arc::new(AtomicU64::new(0));
    let watch_wake = Arc::new(Notify::new());
    let watching = watch_slices(
        slices.clone(),
        shared.clone(),
        writer,
        observed.clone(),
        watch_wake.clone(),
    );
    let worker = Worker {
        id: Identity {
            driver: shared.driver.to_string(),
            node: shared.node.clone(),
        },
        nodes: Api::all(shared.client.clone()),
        slices,
        cache,
        observed,
        overlay: Overlay::default(),
        accepted: Accepted::new(),
        accepted_rev: 0,
        owner: None,
        node_checked: None,
        limiter: request_limit(settings.qps, settings.burst),
        backoff: Backoff::new(settings.backoff_initial, settings.backoff_max),
        conflicts_in_row: 0,
        probed: None,
        shared: shared.clone(),
        settings,
    };
    tokio::select! {
        () = watching => {}
        () = worker.run(&mut stop, &watch_wake) => {}
    }
    shared.status.send_modify(|s| s.stopped = true);
    debug!(driver = %shared.driver, node = %shared.node, "ResourceSlice publisher stopped");
}

impl Worker {
    async fn run(mut self, stop: &mut watch::Receiver<bool>, watch_wake: &Notify) {
        tokio::select! {
            _ = stop.changed() => return,
            ready = self.cache.wait_until_ready() => {
                if ready.is_err() {
                    return;
                }
            }
        }
        let mut due = Some(Instant::now());
        loop {
            // Ask the server again what it keeps now and then: an upgrade or a change of
            // feature gates does not always break the watch.
            let probe_at = self.probed.map(|t| t + self.settings.reprobe_every);
            if let Some(at) = probe_at
                && at <= Instant::now()
            {
                self.shared.reprobe.store(true, Ordering::SeqCst);
                self.probed = Some(Instant::now());
                due = Some(due.map_or(Instant::now(), |d| d.min(Instant::now())));
            }
            let later = Instant::now() + Duration::from_secs(3600);
            let wake_at = due.unwrap_or(later).min(probe_at.unwrap_or(later));
            tokio::select! {
                biased;
                _ = stop.changed() => break,
                () = self.shared.wake.notified() => due = Some(Instant::now()),
                () = watch_wake.notified() => {
                    let at = Instant::now() + self.settings.sync_delay;
                    due = Some(match due {
                        // While backing off, an event does not cut the wait short.
                        Some(d) if self.backoff.failing() => d,
                        Some(d) => d.min(at),
                        None => at,
                    });
                    continue;
                }
                () = tokio::time::sleep_until(wake_at) => {}
            }
            match due {
                Some(d) if d <= Instant::now() => {}
                _ => continue,
            }
            due = None;
            let pass = tokio::select! {
                _ = stop.changed() => break,
                pass = self.sync() => pass,
            };
            let now = Instant::now();
            match pass {
                Ok(Pass::Idle) => {}
                Ok(Pass::Converged(rev)) => {
                    self.backoff.reset();
                    self.conflicts_in_row = 0;
                    self.shared.status.send_modify(|s| {
                        s.synced_rev = s.synced_rev.max(rev);
                        s.last_error = None;
                    });
                    // Check again when our writes leave the overlay: one may have been undone
                    // before the watch showed it.
                    due = self.overlay.next_expiry();
                }
                Ok(Pass::Wrote) => {
                    self.backoff.reset();
                    self.conflicts_in_row = 0;
                    due = Some(now);
                }
                Ok(Pass::Conflict) => {
                    self.conflicts_in_row += 1;
                    due = Some(if self.conflicts_in_row > MAX_IMMEDIATE_CONFLICTS {
                        now + self.backoff.next_delay()
                    } else {
                        now
                    });
                }
                Err(error) => {
                    bump(&self.shared.counters.errors);
                    let delay = self.backoff.next_delay();
                    warn!(%error, retry_in = ?delay, "publishing ResourceSlices failed");
                    self.shared
                        .status
                        .send_modify(|s| s.last_error = Some(kubedev_core::echo::chain(&error)));
                    due = Some(now + delay);
                }
            }
        }
    }

    /// One reconcile pass: compare, then delete, update, create.
    async fn sync(&mut self) -> Result<Pass, Error> {
        let (rev, pools) = {
            let desired = self.shared.desired();
            (desired.rev, desired.pools.clone())
        };
        let Some(mut pools) = pools else {
            return Ok(Pass::Idle);
        };
        let mut rev = rev;
        let reprobe = self.shared.reprobe.swap(false, Ordering::SeqCst);
        // Without shared counters what is published depends on the devices in use.
        let fallback = !self
            .shared
            .api
            .caps()
            .keeps(ApiFeature::PartitionableDevices);
        if reprobe || fallback {
            if reprobe && let Err(e) = self.learn_api().await {
                self.shared.reprobe.store(true, Ordering::SeqCst);
                return Err(e);
            }
            self.shared.rederive()?;
            let desired = self.shared.desired();
            rev = desired.rev;
            if let Some(p) = &desired.pools {
                pools = p.clone();
            }
        }
        self.look_up_node().await;
        if rev != self.accepted_rev {
            self.forget_stale_acceptances(&pools);
            self.accepted_rev = rev;
        }
        let current: Vec<ResourceSlice> = self
            .overlay
            .view(self.cache.state(), self.observed.load(Ordering::SeqCst))
            .into_iter()
            .filter(|s| {
                s.spec.driver == self.id.driver
                    && s.spec.node_name.as_deref() == Some(self.id.node.as_str())
            })
            .collect();
        let plan = plan(
            &self.id,
            self.owner.as_ref(),
            &pools,
            &current,
            &self.accepted,
        );
        if plan.is_empty() {
            return Ok(Pass::Converged(rev));
        }
        debug!(
            driver = %self.id.driver,
            node = %self.id.node,
            deletes = plan.deletes.len(),
            updates = plan.updates.len(),
            creates = plan.creates.len(),
            "reconciling ResourceSlices"
        );
        for slice in &plan.deletes {
            if let Step::Conflict = self.delete(slice).await? {
                return Ok(Pass::Conflict);
            }
        }
        for slice in &plan.updates {
            if let Step::Conflict = self.update(slice).await? {
                return Ok(Pass::Conflict);
            }
        }
        for slice in &plan.creates {
            if let Step::Conflict = self.create(slice).await? {
                return Ok(Pass::Conflict);
            }
        }
        Ok(Pass::Wrote)
    }

    /// Keeps only the server-content records that can still apply to the desired slices.
    fn forget_stale_acceptances(&mut self, pools: &[DesiredPool]) {
        if self.accepted.is_empty() {
            return;
        }
        let id = &self.id;
        let keys: HashSet<String> = pools
            .iter()
            .flat_map(|p| {
                p.slices
                    .iter()
                    .map(move |s| content_key(&desired_spec(id, p, s, 0)))
            })
            .collect();
        self.accepted.retain(|k, _| keys.contains(k));
    }

    /// Looks the Node's UID up for the owner reference: once, and again every little while
    /// as long as it fails.
    async fn look_up_node(&mut self) {
        if self.owner.is_some()
            || self
                .node_checked
                .is_some_and(|t| t.elapsed() < NODE_LOOKUP_RETRY)
        {
            return;
        }
        self.node_checked = Some(Instant::now());
        self.limiter.acquire().await;
        match self.nodes.get(&self.id.node).await {
            Ok(node) => match node.metadata.uid {
                Some(uid) if !uid.is_empty() => {
                    self.owner = Some(OwnerReference {
                        api_version: "v1".into(),
                        kind: "Node".into(),
                        name: self.id.node.clone(),
                        uid,
                        controller: Some(true),
                        block_owner_deletion: None,
                    });
                }
                _ => warn!(
                    node = %self.id.node,
                    "the Node has no UID; publishing ResourceSlices without an owner reference"
                ),
            },
            Err(error) => {
                let error = Error::Node {
                    node: self.id.node.clone(),
                    error: Box::new(error),
                };
                warn!(%error, "publishing ResourceSlices without an owner reference for now");
            }
        }
    }
}
