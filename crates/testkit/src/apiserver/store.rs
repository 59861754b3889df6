//! The object store: objects as JSON values, one global resourceVersion counter, an event
//! history for watches, and the write semantics of the API server (generateName, optimistic
//! concurrency, generation, status subresource, finalizers, delete preconditions).
//!
//! This module holds the types, reads and watches; `write` holds the API's writes, `raw` the
//! test handle's, and `object` the helpers for an object's metadata.

mod object;
pub(crate) use object::now_rfc3339;
mod raw;
mod write;

use parking_lot::{Mutex, MutexGuard, RwLock};
use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use serde_json::Value;
use tokio::sync::broadcast;

use super::resource::Resource;
use super::selectors::Selectors;
use super::status::ApiError;
use super::strategy::{FieldValidation, Strategy};
use object::meta_str;

/// The kind of a watch event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// One change to one object.
#[derive(Debug)]
pub(crate) struct Event {
    pub(crate) resource: Resource,
    pub(crate) kind: EventType,
    pub(crate) rv: u64,
    /// The object after the change (for deletions: the last state, with the deletion's
    /// resourceVersion).
    pub(crate) object: Value,
    /// The object before the change, for modifications (so selector transitions can be seen).
    pub(crate) prev: Option<Value>,
}

/// Which object a request names.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Key {
    pub(crate) namespace: String,
    pub(crate) name: String,
}

impl Key {
    pub(crate) fn new(namespace: Option<&str>, name: &str) -> Self {
        Self {
            namespace: namespace.unwrap_or("").to_owned(),
            name: name.to_owned(),
        }
    }
}

/// How a PATCH body is to be applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PatchKind {
    Merge,
    StrategicMerge,
    Json,
    Apply,
}

/// Where a write lands: the object itself or its status subresource.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Target {
    Main,
    Status,
}

/// Where a watch starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WatchStart {
    /// Synthetic ADDED events for the current state, then changes (resourceVersion unset or
    /// `0`, or `sendInitialEvents=true`).
    CurrentState,
    /// Changes after this resourceVersion.
    After(u64),
}

/// What a new watch receives before live events.
#[derive(Debug)]
pub(crate) struct WatchSetup {
    /// Events to send first (synthetic ADDED events or history).
    pub(crate) backlog: Vec<Arc<Event>>,
    /// The resourceVersion at which the backlog ends.
    pub(crate) rv: u64,
    pub(crate) live: broadcast::Receiver<Arc<Event>>,
}

#[derive(Debug)]
struct Inner {
    rv: u64,
    objects: BTreeMap<Resource, BTreeMap<Key, Value>>,
    history: VecDeque<Arc<Event>>,
    history_limit: usize,
    /// Every event after this resourceVersion is still in `history`.
    compacted: u64,
}

/// The emulator's state, shared by the HTTP handlers and the test handle.
#[derive(Debug)]
pub(crate) struct Store {
    inner: Mutex<Inner>,
    events: broadcast::Sender<Arc<Event>>,
    /// The release and feature gates writes follow; replaced when the server restarts as
    /// another release or with other gates. Each request reads it once, at its start.
    strategy: RwLock<Arc<Strategy>>,
    /// The labels of namespaces, by name (namespaces themselves are not served; a namespace
    /// without an entry has no labels).
    namespace_labels: RwLock<BTreeMap<String, BTreeMap<String, String>>>,
}

/// Options of a create, update or patch.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct WriteOptions {
    /// Answer as if written, store nothing.
    pub(crate) dry_run: bool,
    /// What to do with fields the release's types do not have.
    pub(crate) field_validation: FieldValidation,
}

impl WriteOptions {
    #[cfg(test)]
    pub(crate) fn dry_run() -> Self {
        Self {
            dry_run: true,
            ..Self::default()
        }
    }
}

/// A successful write: the object as stored (or as it would be, for a dry run) and the
/// warnings for the `Warning` response headers.
#[derive(Debug, Clone)]
pub(crate) struct Written {
    pub(crate) object: Value,
    pub(crate) warnings: Vec<String>,
}

/// Options of a DELETE request.
#[derive(Debug, Clone, Default)]
pub(crate) struct DeleteOptions {
    pub(crate) uid: Option<String>,
    pub(crate) resource_version: Option<String>,
    pub(crate) dry_run: bool,
}

impl DeleteOptions {
    pub(crate) fn from_body(body: &Value) -> Self {
        let pre = body.get("preconditions");
        let text = |k: &str| {
            pre.and_then(|p| p.get(k))
                .and_then(Value::as_str)
                .map(str::to_owned)
        };
        let dry_run = body
            .get("dryRun")
            .and_then(Value::as_array)
            .is_some_and(|a| !a.is_empty());
        Self {
            uid: text("uid"),
            resource_version: text("resourceVersion"),
            dry_run,
        }
    }
}

impl Store {
    pub(crate) fn new(history_limit: usize, strategy: Strategy) -> Self {
        let (events, _) = broadcast::channel(4096);
        Self {
            strategy: RwLock::new(Arc::new(strategy)),
            namespace_labels: RwLock::default(),
            inner: Mutex::new(Inner {
                rv: 1,
                objects: BTreeMap::new(),
                history: VecDeque::new(),
                history_limit: history_limit.max(1),
                compacted: 1,
            }),
            events,
        }
    }

    /// Sets the labels of `namespace`.
    pub(crate) fn set_namespace_labels(&self, namespace: &str, labels: BTreeMap<String, String>) {
        self.namespace_labels
            .write()
            .insert(namespace.to_string(), labels);
    }

    /// Whether `namespace` carries `key` with `value`.
    pub(crate) fn namespace_has_label(&self, namespace: &str, key: &str, value: &str) -> bool {
        self.namespace_labels
            .read()
            .get(namespace)
            .and_then(|l| l.get(key))
            .is_some_and(|v| v == value)
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave a half-written object: every write is a
        // single map insert or removal. Keep serving after one.
        self.inner.lock()
    }

    /// The release and feature gates writes follow now.
    pub(crate) fn strategy(&self) -> Arc<Strategy> {
        // Replacing an `Arc` cannot leave it half-written; keep serving after a panic.
        Arc::clone(&self.strategy.read())
    }

    /// Makes every later write follow another release or other feature gates; stored objects
    /// stay as they are.
    pub(crate) fn set_strategy(&self, strategy: Strategy) {
        *self.strategy.write() = Arc::new(strategy);
    }

    /// The newest resourceVersion handed out.
    pub(crate) fn resource_version(&self) -> u64 {
        self.lock().rv
    }

    /// Forgets the event history and makes every resourceVersion handed out so far too old to
    /// resume a watch from (410). The counter moves on by one so that a fresh list returns a
    /// resourceVersion that can be watched. `then` runs before the lock is released, so nothing
    /// can observe the new resourceVersion before it.
    pub(crate) fn compact(&self, then: impl FnOnce()) {
        let mut inner = self.lock();
        inner.history.clear();
        let rv = Self::next_rv(&mut inner);
        inner.compacted = rv;
        then();
    }

    fn emit(&self, inner: &mut Inner, event: Event) {
        let event = Arc::new(event);
        inner.history.push_back(Arc::clone(&event));
        while inner.history.len() > inner.history_limit {
            if let Some(old) = inner.history.pop_front() {
                inner.compacted = old.rv;
            }
        }
        // Nobody listening is fine.
        let _ = self.events.send(event);
    }

    fn next_rv(inner: &mut Inner) -> u64 {
        inner.rv += 1;
        inner.rv
    }

    pub(crate) fn get(&self, resource: Resource, key: &Key) -> Option<Value> {
        self.lock()
            .objects
            .get(&resource)
            .and_then(|m| m.get(key))
            .cloned()
    }

    /// Objects of a resource, optionally in one namespace, that pass the selectors, with the
    /// resourceVersion of the snapshot.
    pub(crate) fn list(
        &self,
        resource: Resource,
        namespace: Option<&str>,
        selectors: &Selectors,
    ) -> (Vec<Value>, u64) {
        let inner = self.lock();
        let items = inner
            .objects
            .get(&resource)
            .map(|m| {
                m.iter()
                    .filter(|(k, _)| namespace.is_none_or(|ns| k.namespace == ns))
                    .filter(|(_, v)| selectors.matches(resource, v))
                    .map(|(_, v)| v.clone())
                    .collect()
            })
            .unwrap_or_default();
        (items, inner.rv)
    }

    /// Registers a watch and returns what it must send before live events.
    pub(crate) fn watch(
        &self,
        resource: Resource,
        start: WatchStart,
    ) -> Result<WatchSetup, ApiError> {
        let inner = self.lock();
        let live = self.events.subscribe();
        let backlog = match start {
            WatchStart::CurrentState => inner
                .objects
                .get(&resource)
                .map(|m| {
                    m.values()
                        .map(|v| {
                            let rv = meta_str(v, "resourceVersion").parse().unwrap_or(inner.rv);
                            Arc::new(Event {
                                resource,
                                kind: EventType::Added,
                                rv,
                                object: v.clone(),
                                prev: None,
                            })
                        })
                        .collect()
                })
                .unwrap_or_default(),
            WatchStart::After(from) => {
                if from < inner.compacted {
                    return Err(ApiError::expired(from, inner.compacted));
                }
                inner
                    .history
                    .iter()
                    .filter(|e| e.rv > from && e.resource == resource)
                    .cloned()
                    .collect()
            }
        };
        Ok(WatchSetup {
            backlog,
            rv: inner.rv,
            live,
        })
    }
}

#[cfg(test)]
mod tests;
