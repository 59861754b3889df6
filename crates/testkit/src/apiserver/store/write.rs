//! The API's writes: create (generateName, server-owned fields), update and status update
//! (optimistic concurrency, generation, finalizers), patch and delete (preconditions,
//! finalizers, deletionTimestamp).

use serde_json::Value;

use super::object::{
    GENERATED_NAME_PREFIX_MAX, check_type_meta, comparable, has_finalizers, meta, meta_mut,
    meta_str, now_rfc3339, random_suffix, set_meta, set_type_meta, spec_part,
};
use super::{
    DeleteOptions, Event, EventType, Inner, Key, PatchKind, Store, Target, WriteOptions, Written,
};
use crate::apiserver::patch::{json_patch, merge_patch};
use crate::apiserver::resource::Resource;
use crate::apiserver::status::{ApiError, FieldError, Kindish};
use crate::apiserver::strategy::Strategy;
use crate::apiserver::validation::{apply_defaults, validate};

impl Store {
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
        let mut errors = validate(resource, &object, None, strategy.release);
        if resource == Resource::ResourceClaims {
            errors.extend(self.admin_access_errors(&object, namespace.unwrap_or("")));
        }
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
        check_name_and_namespace(resource, key, &mut object)?;
        let Some(old) = inner
            .objects
            .get(&resource)
            .and_then(|m| m.get(key))
            .cloned()
        else {
            return Err(ApiError::not_found(&kindish, &key.name));
        };
        check_preconditions(&kindish, key, &old, &object)?;
        restrict_to_target(resource, target, &old, &mut object);
        apply_defaults(resource, &mut object);
        keep_server_fields(resource, key, &old, &mut object);
        bump_generation(&strategy, resource, target, &old, &mut object);

        let errors = validate(resource, &object, Some(&old), strategy.release);
        if !errors.is_empty() {
            return Err(ApiError::invalid(&kindish, &key.name, &errors));
        }
        if comparable(&object) == comparable(&old) || options.dry_run {
            // A write that changes nothing keeps the resourceVersion and sends no event.
            return Ok(Written { object, warnings });
        }
        Ok(self.commit_update(inner, resource, key, object, old, warnings))
    }

    /// Stores an update that changes something under a new resourceVersion and sends its
    /// event; when the last finalizer of an object being deleted is gone, the deletion
    /// completes instead.
    fn commit_update(
        &self,
        inner: &mut Inner,
        resource: Resource,
        key: &Key,
        mut object: Value,
        old: Value,
        warnings: Vec<String>,
    ) -> Written {
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
            return Written { object, warnings };
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
        Written { object, warnings }
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

    /// The API server's check of a new claim's admin access: a request with `adminAccess` is
    /// refused unless its namespace carries `resource.kubernetes.io/admin-access: "true"`.
    fn admin_access_errors(&self, claim: &Value, namespace: &str) -> Vec<FieldError> {
        const LABEL: &str = "resource.kubernetes.io/admin-access";
        if self.namespace_has_label(namespace, LABEL, "true") {
            return Vec::new();
        }
        let requests = claim
            .pointer("/spec/devices/requests")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or(&[]);
        requests
            .iter()
            .enumerate()
            .filter(|(_, r)| r.pointer("/exactly/adminAccess") == Some(&Value::Bool(true)))
            .map(|(i, _)| {
                FieldError::forbidden(
                    &format!("spec.devices.requests[{i}].exactly.adminAccess"),
                    &format!(
                        "admin access to devices requires the `{LABEL}: true` label on the \
                         containing namespace"
                    ),
                )
            })
            .collect()
    }
}

/// The name in the body must be empty (it is filled in) or the one on the URL; a namespace in
/// the body must be the one on the URL.
fn check_name_and_namespace(
    resource: Resource,
    key: &Key,
    object: &mut Value,
) -> Result<(), ApiError> {
    let body_name = meta_str(object, "name").to_owned();
    if body_name.is_empty() {
        set_meta(object, "name", Value::from(key.name.clone()));
    } else if body_name != key.name {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({body_name}) does not match the name on the URL ({})",
            key.name
        )));
    }
    let body_ns = meta_str(object, "namespace").to_owned();
    if resource.namespaced() && !body_ns.is_empty() && body_ns != key.namespace {
        return Err(ApiError::bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        ));
    }
    Ok(())
}

/// The resourceVersion and UID preconditions of an update, against the stored object.
fn check_preconditions(
    kindish: &Kindish,
    key: &Key,
    old: &Value,
    object: &Value,
) -> Result<(), ApiError> {
    let old_rv = meta_str(old, "resourceVersion").to_owned();
    let new_rv = meta_str(object, "resourceVersion").to_owned();
    if !new_rv.is_empty() && new_rv != old_rv {
        return Err(ApiError::conflict(
            kindish,
            &key.name,
            "the object has been modified; please apply your changes to the latest version and try again",
        ));
    }
    let new_uid = meta_str(object, "uid").to_owned();
    let old_uid = meta_str(old, "uid").to_owned();
    if !new_uid.is_empty() && new_uid != old_uid {
        return Err(ApiError::conflict(
            kindish,
            &key.name,
            &format!(
                "Precondition failed: UID in precondition: {new_uid}, UID in object meta: {old_uid}"
            ),
        ));
    }
    Ok(())
}

/// What each endpoint may change: the main endpoint keeps the stored status, the status
/// subresource keeps everything but the status.
fn restrict_to_target(resource: Resource, target: Target, old: &Value, object: &mut Value) {
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
                *object = old.clone();
                if let Some(map) = object.as_object_mut() {
                    match new_status {
                        Some(s) => map.insert("status".into(), s),
                        None => map.remove("status"),
                    };
                }
            }
        }
    }
}

/// Fields the server owns: type meta, identity and deletion fields, the generation, the
/// namespace of the URL and the stored resourceVersion.
fn keep_server_fields(resource: Resource, key: &Key, old: &Value, object: &mut Value) {
    let old_rv = meta_str(old, "resourceVersion").to_owned();
    set_type_meta(resource, object);
    {
        let old_meta = meta(old).clone();
        let m = meta_mut(object);
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
}

/// Runs the strategy's update preparation (main endpoint) and bumps `metadata.generation` of a
/// `resource.k8s.io` object whose spec changed.
fn bump_generation(
    strategy: &Strategy,
    resource: Resource,
    target: Target,
    old: &Value,
    object: &mut Value,
) {
    // The ResourceSlice strategy compares specs before it drops disabled fields (so a write
    // whose only change is dropped still counts as a new generation); the DeviceClass
    // strategy compares after.
    let compare_first = resource == Resource::ResourceSlices;
    let mut spec_changed = compare_first && spec_part(object) != spec_part(old);
    if target == Target::Main {
        strategy.prepare(resource, object, Some(old));
    }
    if !compare_first {
        spec_changed = spec_part(object) != spec_part(old);
    }
    if resource.group() == "resource.k8s.io" && spec_changed {
        let generation = meta(old)
            .get("generation")
            .and_then(Value::as_i64)
            .unwrap_or(0);
        set_meta(object, "generation", Value::from(generation + 1));
    }
}
