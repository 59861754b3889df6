//! The object store: objects as JSON values, one global resourceVersion counter, an event
//! history for watches, and the write semantics of the API server (generateName, optimistic
//! concurrency, generation, status subresource, finalizers, delete preconditions).

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use serde_json::{Map, Value, json};
use tokio::sync::broadcast;

use super::patch::{json_patch, merge_patch};
use super::resource::Resource;
use super::selectors::Selectors;
use super::status::{ApiError, quote};
use super::strategy::{FieldValidation, Strategy};
use super::validation::{apply_defaults, validate};

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

const NAME_SUFFIX_ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
const GENERATED_NAME_PREFIX_MAX: usize = 63 - 5;

fn random_suffix() -> String {
    let bytes = uuid::Uuid::new_v4().into_bytes();
    bytes[..5]
        .iter()
        .map(|b| NAME_SUFFIX_ALPHABET[usize::from(*b) % NAME_SUFFIX_ALPHABET.len()] as char)
        .collect()
}

fn now_rfc3339() -> String {
    let now = jiff::Timestamp::now();
    jiff::Timestamp::from_second(now.as_second())
        .map(|t| t.to_string())
        .unwrap_or_else(|_| now.to_string())
}

fn meta(object: &Value) -> &Value {
    object.get("metadata").unwrap_or(&Value::Null)
}

fn meta_str<'a>(object: &'a Value, field: &str) -> &'a str {
    meta(object)
        .get(field)
        .and_then(Value::as_str)
        .unwrap_or("")
}

fn meta_mut(object: &mut Value) -> &mut Map<String, Value> {
    if !object.is_object() {
        *object = json!({});
    }
    let map = object.as_object_mut().expect("made an object above");
    let m = map.entry("metadata").or_insert_with(|| json!({}));
    if !m.is_object() {
        *m = json!({});
    }
    m.as_object_mut().expect("made an object above")
}

fn set_meta(object: &mut Value, field: &str, value: Value) {
    meta_mut(object).insert(field.to_owned(), value);
}

/// The object without metadata and status: what a change of bumps `metadata.generation`.
fn spec_part(object: &Value) -> Value {
    let mut copy = object.clone();
    if let Some(map) = copy.as_object_mut() {
        map.remove("metadata");
        map.remove("status");
        map.remove("apiVersion");
        map.remove("kind");
    }
    copy
}

/// The object without the fields the server rewrites on every write, for no-op detection.
fn comparable(object: &Value) -> Value {
    let mut copy = object.clone();
    if let Some(m) = copy.get_mut("metadata").and_then(Value::as_object_mut) {
        m.remove("resourceVersion");
        m.remove("managedFields");
    }
    copy
}

fn has_finalizers(object: &Value) -> bool {
    meta(object)
        .get("finalizers")
        .and_then(Value::as_array)
        .is_some_and(|f| !f.is_empty())
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

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave a half-written object: every write is a
        // single map insert or removal. Keep serving after one.
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The release and feature gates writes follow now.
    pub(crate) fn strategy(&self) -> Arc<Strategy> {
        // Replacing an `Arc` cannot leave it half-written; keep serving after a panic.
        Arc::clone(
            &self
                .strategy
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }

    /// Makes every later write follow another release or other feature gates; stored objects
    /// stay as they are.
    pub(crate) fn set_strategy(&self, strategy: Strategy) {
        *self
            .strategy
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(strategy);
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

    /// Creates an object (POST).
    pub(crate) fn create(
        &self,
        resource: Resource,
        namespace: Option<&str>,
        mut object: Value,
        options: &WriteOptions,
    ) -> Result<Written, ApiError> {
        let kindish = resource.kindish();
        let strategy = self.strategy();
        check_type_meta(resource, &object)?;
        let warnings = strategy.decode(resource, &mut object, options.field_validation)?;
        strategy.canonicalize(resource, &mut object);
        if resource.namespaced() {
            let body_ns = meta_str(&object, "namespace").to_owned();
            let url_ns = namespace.unwrap_or("");
            if !body_ns.is_empty() && body_ns != url_ns {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
            set_meta(&mut object, "namespace", Value::from(url_ns));
        } else {
            meta_mut(&mut object).remove("namespace");
        }
        if resource == Resource::ResourceClaims
            && let Some(map) = object.as_object_mut()
        {
            map.remove("status");
        }
        apply_defaults(resource, &mut object);

        let mut inner = self.lock();
        let generate = meta_str(&object, "generateName").to_owned();
        if meta_str(&object, "name").is_empty() && !generate.is_empty() {
            let prefix: String = generate.chars().take(GENERATED_NAME_PREFIX_MAX).collect();
            let ns = namespace.unwrap_or("");
            let existing = inner.objects.get(&resource);
            let name = (0..8)
                .map(|_| format!("{prefix}{}", random_suffix()))
                .find(|n| existing.is_none_or(|m| !m.contains_key(&Key::new(Some(ns), n))))
                .ok_or_else(|| ApiError::already_exists(&kindish, &prefix))?;
            set_meta(&mut object, "name", Value::from(name));
        }
        let name = meta_str(&object, "name").to_owned();
        strategy.prepare(resource, &mut object, None);
        let errors = validate(resource, &object, None, strategy.release);
        if !errors.is_empty() {
            return Err(ApiError::invalid(&kindish, &name, &errors));
        }
        let key = Key::new(
            resource.namespaced().then(|| namespace.unwrap_or("")),
            &name,
        );
        if inner
            .objects
            .get(&resource)
            .is_some_and(|m| m.contains_key(&key))
        {
            return Err(ApiError::already_exists(&kindish, &name));
        }
        set_type_meta(resource, &mut object);
        {
            let m = meta_mut(&mut object);
            m.insert("uid".into(), Value::from(uuid::Uuid::new_v4().to_string()));
            m.insert("creationTimestamp".into(), Value::from(now_rfc3339()));
            m.remove("deletionTimestamp");
            m.remove("deletionGracePeriodSeconds");
            if resource.group() == "resource.k8s.io" {
                m.insert("generation".into(), Value::from(1));
            }
        }
        if options.dry_run {
            set_meta(&mut object, "resourceVersion", Value::from(""));
            return Ok(Written { object, warnings });
        }
        let rv = Self::next_rv(&mut inner);
        set_meta(&mut object, "resourceVersion", Value::from(rv.to_string()));
        inner
            .objects
            .entry(resource)
            .or_default()
            .insert(key, object.clone());
        self.emit(
            &mut inner,
            Event {
                resource,
                kind: EventType::Added,
                rv,
                object: object.clone(),
                prev: None,
            },
        );
        Ok(Written { object, warnings })
    }

    /// Replaces an object (PUT) or its status.
    pub(crate) fn update(
        &self,
        resource: Resource,
        key: &Key,
        object: Value,
        target: Target,
        options: &WriteOptions,
    ) -> Result<Written, ApiError> {
        check_type_meta(resource, &object)?;
        let mut inner = self.lock();
        self.update_locked(&mut inner, resource, key, object, target, options)
    }

    #[allow(clippy::too_many_arguments)]
    fn update_locked(
        &self,
        inner: &mut Inner,
        resource: Resource,
        key: &Key,
        mut object: Value,
        target: Target,
        options: &WriteOptions,
    ) -> Result<Written, ApiError> {
        let kindish = resource.kindish();
        let strategy = self.strategy();
        let warnings = strategy.decode(resource, &mut object, options.field_validation)?;
        strategy.canonicalize(resource, &mut object);
        let body_name = meta_str(&object, "name").to_owned();
        if body_name.is_empty() {
            set_meta(&mut object, "name", Value::from(key.name.clone()));
        } else if body_name != key.name {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({body_name}) does not match the name on the URL ({})",
                key.name
            )));
        }
        let body_ns = meta_str(&object, "namespace").to_owned();
        if resource.namespaced() && !body_ns.is_empty() && body_ns != key.namespace {
            return Err(ApiError::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ));
        }
        let Some(old) = inner
            .objects
            .get(&resource)
            .and_then(|m| m.get(key))
            .cloned()
        else {
            return Err(ApiError::not_found(&kindish, &key.name));
        };
        let old_rv = meta_str(&old, "resourceVersion").to_owned();
        let new_rv = meta_str(&object, "resourceVersion").to_owned();
        if !new_rv.is_empty() && new_rv != old_rv {
            return Err(ApiError::conflict(
                &kindish,
                &key.name,
                "the object has been modified; please apply your changes to the latest version and try again",
            ));
        }
        let new_uid = meta_str(&object, "uid").to_owned();
        let old_uid = meta_str(&old, "uid").to_owned();
        if !new_uid.is_empty() && new_uid != old_uid {
            return Err(ApiError::conflict(
                &kindish,
                &key.name,
                &format!(
                    "Precondition failed: UID in precondition: {new_uid}, UID in object meta: {old_uid}"
                ),
            ));
        }

        // What each endpoint may change.
        if resource.has_status() {
            match target {
                Target::Main => {
                    let old_status = old.get("status").cloned();
                    if let Some(map) = object.as_object_mut() {
                        match old_status {
                            Some(s) => map.insert("status".into(), s),
                            None => map.remove("status"),
                        };
                    }
                }
                Target::Status => {
                    let new_status = object.get("status").cloned();
                    object = old.clone();
                    if let Some(map) = object.as_object_mut() {
                        match new_status {
                            Some(s) => map.insert("status".into(), s),
                            None => map.remove("status"),
                        };
                    }
                }
            }
        }
        apply_defaults(resource, &mut object);

        // Fields the server owns.
        set_type_meta(resource, &mut object);
        {
            let old_meta = meta(&old).clone();
            let m = meta_mut(&mut object);
            for field in [
                "uid",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "generation",
            ] {
                match old_meta.get(field) {
                    Some(v) => m.insert(field.into(), v.clone()),
                    None => m.remove(field),
                };
            }
            if resource.namespaced() {
                m.insert("namespace".into(), Value::from(key.namespace.clone()));
            } else {
                m.remove("namespace");
            }
            m.insert("resourceVersion".into(), Value::from(old_rv.clone()));
        }
        // The ResourceSlice strategy compares specs before it drops disabled fields (so a write
        // whose only change is dropped still counts as a new generation); the DeviceClass
        // strategy compares after.
        let compare_first = resource == Resource::ResourceSlices;
        let mut spec_changed = compare_first && spec_part(&object) != spec_part(&old);
        if target == Target::Main {
            strategy.prepare(resource, &mut object, Some(&old));
        }
        if !compare_first {
            spec_changed = spec_part(&object) != spec_part(&old);
        }
        if resource.group() == "resource.k8s.io" && spec_changed {
            let generation = meta(&old)
                .get("generation")
                .and_then(Value::as_i64)
                .unwrap_or(0);
            set_meta(&mut object, "generation", Value::from(generation + 1));
        }

        let errors = validate(resource, &object, Some(&old), strategy.release);
        if !errors.is_empty() {
            return Err(ApiError::invalid(&kindish, &key.name, &errors));
        }
        if comparable(&object) == comparable(&old) || options.dry_run {
            // A write that changes nothing keeps the resourceVersion and sends no event.
            return Ok(Written { object, warnings });
        }

        let rv = Self::next_rv(inner);
        set_meta(&mut object, "resourceVersion", Value::from(rv.to_string()));
        if meta(&object)
            .get("deletionTimestamp")
            .is_some_and(|v| !v.is_null())
            && !has_finalizers(&object)
        {
            // The last finalizer is gone: the deletion completes.
            if let Some(m) = inner.objects.get_mut(&resource) {
                m.remove(key);
            }
            self.emit(
                inner,
                Event {
                    resource,
                    kind: EventType::Deleted,
                    rv,
                    object: object.clone(),
                    prev: Some(old),
                },
            );
            return Ok(Written { object, warnings });
        }
        inner
            .objects
            .entry(resource)
            .or_default()
            .insert(key.clone(), object.clone());
        self.emit(
            inner,
            Event {
                resource,
                kind: EventType::Modified,
                rv,
                object: object.clone(),
                prev: Some(old),
            },
        );
        Ok(Written { object, warnings })
    }

    /// Patches an object (PATCH) or its status. `apply` patches create missing objects.
    pub(crate) fn patch(
        &self,
        resource: Resource,
        key: &Key,
        kind: PatchKind,
        patch: &Value,
        target: Target,
        options: &WriteOptions,
    ) -> Result<Written, ApiError> {
        let kindish = resource.kindish();
        if kind == PatchKind::Apply {
            self.strategy().check_applied(resource, &key.name, patch)?;
        }
        let mut inner = self.lock();
        let current = inner
            .objects
            .get(&resource)
            .and_then(|m| m.get(key))
            .cloned();
        let Some(current) = current else {
            if kind == PatchKind::Apply && target == Target::Main {
                drop(inner);
                let mut object = patch.clone();
                set_meta(&mut object, "name", Value::from(key.name.clone()));
                let ns = resource.namespaced().then_some(key.namespace.as_str());
                return self.create(resource, ns, object, options);
            }
            return Err(ApiError::not_found(&kindish, &key.name));
        };
        let mut patched = current.clone();
        match kind {
            PatchKind::Merge | PatchKind::StrategicMerge | PatchKind::Apply => {
                if !patch.is_object() {
                    return Err(ApiError::bad_request("a merge patch must be a JSON object"));
                }
                merge_patch(&mut patched, patch);
            }
            PatchKind::Json => {
                json_patch(&mut patched, patch).map_err(|e| {
                    ApiError::new(
                        422,
                        "Invalid",
                        format!("the JSON patch cannot be applied: {e}"),
                    )
                })?;
            }
        }
        if kind == PatchKind::Apply {
            // Applied configurations name the type and object; they must agree with the URL.
            check_type_meta(resource, patch)?;
        }
        self.update_locked(&mut inner, resource, key, patched, target, options)
    }

    /// Deletes an object. Objects with finalizers only get a deletionTimestamp.
    pub(crate) fn delete(
        &self,
        resource: Resource,
        key: &Key,
        options: &DeleteOptions,
    ) -> Result<Value, ApiError> {
        let kindish = resource.kindish();
        let mut inner = self.lock();
        let Some(old) = inner
            .objects
            .get(&resource)
            .and_then(|m| m.get(key))
            .cloned()
        else {
            return Err(ApiError::not_found(&kindish, &key.name));
        };
        if let Some(uid) = &options.uid {
            let actual = meta_str(&old, "uid");
            if uid != actual {
                return Err(ApiError::conflict(
                    &kindish,
                    &key.name,
                    &format!(
                        "Precondition failed: UID in precondition: {uid}, UID in object meta: {actual}"
                    ),
                ));
            }
        }
        if let Some(rv) = &options.resource_version {
            let actual = meta_str(&old, "resourceVersion");
            if rv != actual {
                return Err(ApiError::conflict(
                    &kindish,
                    &key.name,
                    &format!(
                        "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {actual}"
                    ),
                ));
            }
        }
        if options.dry_run {
            return Ok(old);
        }
        if has_finalizers(&old)
            && meta(&old)
                .get("deletionTimestamp")
                .is_some_and(|v| !v.is_null())
        {
            // Already being deleted: nothing changes.
            return Ok(old);
        }
        let mut object = old.clone();
        let rv = Self::next_rv(&mut inner);
        set_meta(&mut object, "resourceVersion", Value::from(rv.to_string()));
        if has_finalizers(&old) {
            set_meta(&mut object, "deletionTimestamp", Value::from(now_rfc3339()));
            set_meta(&mut object, "deletionGracePeriodSeconds", Value::from(0));
            inner
                .objects
                .entry(resource)
                .or_default()
                .insert(key.clone(), object.clone());
            self.emit(
                &mut inner,
                Event {
                    resource,
                    kind: EventType::Modified,
                    rv,
                    object: object.clone(),
                    prev: Some(old),
                },
            );
            return Ok(object);
        }
        if let Some(m) = inner.objects.get_mut(&resource) {
            m.remove(key);
        }
        self.emit(
            &mut inner,
            Event {
                resource,
                kind: EventType::Deleted,
                rv,
                object: object.clone(),
                prev: Some(old),
            },
        );
        Ok(object)
    }

    /// Stores an object as given, bypassing validation and concurrency checks, as if another
    /// client had written it. Server-owned fields are filled in when missing.
    pub(crate) fn put_raw(&self, resource: Resource, mut object: Value) -> Result<Value, ApiError> {
        let name = meta_str(&object, "name").to_owned();
        if name.is_empty() {
            return Err(ApiError::bad_request("put_raw needs metadata.name"));
        }
        let namespace = meta_str(&object, "namespace").to_owned();
        if resource.namespaced() && namespace.is_empty() {
            return Err(ApiError::bad_request(format!(
                "put_raw of {resource} {} needs metadata.namespace",
                quote(&name)
            )));
        }
        let key = Key::new(resource.namespaced().then_some(namespace.as_str()), &name);
        set_type_meta(resource, &mut object);
        let mut inner = self.lock();
        let old = inner
            .objects
            .get(&resource)
            .and_then(|m| m.get(&key))
            .cloned();
        {
            let m = meta_mut(&mut object);
            let old_meta = old.as_ref().map(|o| meta(o).clone()).unwrap_or(Value::Null);
            let uid = old_meta
                .get("uid")
                .cloned()
                .unwrap_or_else(|| Value::from(uuid::Uuid::new_v4().to_string()));
            m.entry("uid").or_insert(uid);
            let created = old_meta
                .get("creationTimestamp")
                .cloned()
                .unwrap_or_else(|| Value::from(now_rfc3339()));
            m.entry("creationTimestamp").or_insert(created);
        }
        let rv = Self::next_rv(&mut inner);
        set_meta(&mut object, "resourceVersion", Value::from(rv.to_string()));
        inner
            .objects
            .entry(resource)
            .or_default()
            .insert(key, object.clone());
        let kind = if old.is_some() {
            EventType::Modified
        } else {
            EventType::Added
        };
        self.emit(
            &mut inner,
            Event {
                resource,
                kind,
                rv,
                object: object.clone(),
                prev: old,
            },
        );
        Ok(object)
    }

    /// Removes an object without preconditions or finalizers, as if another client had deleted
    /// it. Returns the removed object.
    pub(crate) fn delete_raw(&self, resource: Resource, key: &Key) -> Option<Value> {
        let mut inner = self.lock();
        let old = inner
            .objects
            .get_mut(&resource)
            .and_then(|m| m.remove(key))?;
        let rv = Self::next_rv(&mut inner);
        let mut object = old.clone();
        set_meta(&mut object, "resourceVersion", Value::from(rv.to_string()));
        self.emit(
            &mut inner,
            Event {
                resource,
                kind: EventType::Deleted,
                rv,
                object: object.clone(),
                prev: Some(old),
            },
        );
        Some(object)
    }
}

fn check_type_meta(resource: Resource, object: &Value) -> Result<(), ApiError> {
    if !object.is_object() {
        return Err(ApiError::bad_request(
            "the request body must be a JSON object",
        ));
    }
    let api_version = object
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or("");
    let kind = object.get("kind").and_then(Value::as_str).unwrap_or("");
    if (!api_version.is_empty() && api_version != resource.api_version())
        || (!kind.is_empty() && kind != resource.kind())
    {
        return Err(ApiError::bad_request(format!(
            "the API version in the data ({api_version}) and the kind ({kind}) do not match the expected {}, Kind={}",
            resource.api_version(),
            resource.kind()
        )));
    }
    Ok(())
}

fn set_type_meta(resource: Resource, object: &mut Value) {
    if let Some(map) = object.as_object_mut() {
        map.insert("apiVersion".into(), Value::from(resource.api_version()));
        map.insert("kind".into(), Value::from(resource.kind()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store(history: usize) -> Store {
        let release = crate::apiserver::KubeRelease::NEWEST;
        Store::new(
            history,
            Strategy::new(release, release.default_feature_gates()),
        )
    }

    fn node(name: &str) -> Value {
        json!({"metadata": {"name": name}, "spec": {}})
    }

    #[test]
    fn generate_name_gets_five_random_characters() {
        let store = store(100);
        let obj = store
            .create(
                Resource::Nodes,
                None,
                json!({"metadata": {"generateName": "node-"}}),
                &WriteOptions::default(),
            )
            .expect("create")
            .object;
        let name = meta_str(&obj, "name");
        assert_eq!(name.len(), 10, "{name}");
        assert!(
            name[5..].bytes().all(|b| NAME_SUFFIX_ALPHABET.contains(&b)),
            "{name}"
        );
    }

    #[test]
    fn stale_update_conflicts_and_noop_keeps_version() {
        let store = store(100);
        let created = store
            .create(Resource::Nodes, None, node("n"), &WriteOptions::default())
            .expect("create")
            .object;
        let key = Key::new(None, "n");
        let same = store
            .update(
                Resource::Nodes,
                &key,
                created.clone(),
                Target::Main,
                &WriteOptions::default(),
            )
            .expect("noop")
            .object;
        assert_eq!(
            meta_str(&same, "resourceVersion"),
            meta_str(&created, "resourceVersion")
        );
        let mut changed = created.clone();
        changed["spec"]["unschedulable"] = json!(true);
        store
            .update(
                Resource::Nodes,
                &key,
                changed.clone(),
                Target::Main,
                &WriteOptions::default(),
            )
            .expect("update");
        let err = store
            .update(
                Resource::Nodes,
                &key,
                changed,
                Target::Main,
                &WriteOptions::default(),
            )
            .expect_err("stale");
        assert_eq!((err.code, err.reason), (409, "Conflict"));
    }

    #[test]
    fn history_compaction_expires_old_watches() {
        let store = store(2);
        for i in 0..5 {
            store
                .create(
                    Resource::Nodes,
                    None,
                    node(&format!("n{i}")),
                    &WriteOptions::default(),
                )
                .expect("create");
        }
        let err = store
            .watch(Resource::Nodes, WatchStart::After(1))
            .expect_err("too old");
        assert_eq!(err.code, 410);
        let ok = store
            .watch(
                Resource::Nodes,
                WatchStart::After(store.resource_version() - 1),
            )
            .expect("recent");
        assert_eq!(ok.backlog.len(), 1);
    }
}
