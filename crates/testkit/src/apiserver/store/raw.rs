//! Writes of the test handle that bypass the API's semantics, as if another client had
//! written or deleted an object.

use serde_json::Value;

use super::object::{meta, meta_mut, meta_str, now_rfc3339, set_meta, set_type_meta};
use super::{Event, EventType, Key, Store};
use crate::apiserver::resource::Resource;
use crate::apiserver::status::{ApiError, quote};

impl Store {
    /// Stores an object as given, bypassing validation and concurrency checks, as if another
    /// client had written it. Server-owned fields are filled in when missing, and defaults are
    /// applied as the API server applies them to every object it stores (so a later update
    /// through the API sees the same spec).
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
        crate::apiserver::validation::apply_defaults(resource, &mut object);
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
