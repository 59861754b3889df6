//! Each verb on a resource route served from the store: get, list, create, update, the four
//! patch kinds, delete and delete-collection (a watch is only parsed here and streamed by
//! [`super::watch`]).

use std::collections::HashMap;

use axum::body::Bytes;
use serde_json::{Value, json};

use super::watch::WatchRequest;
use super::{Route, Shared};
use crate::apiserver::resource::{Resource, Verb};
use crate::apiserver::selectors::Selectors;
use crate::apiserver::status::ApiError;
use crate::apiserver::store::{
    DeleteOptions, Key, PatchKind, Store, Target, WriteOptions, Written,
};
use crate::apiserver::strategy::FieldValidation;

/// What a verb served.
pub(super) enum Served {
    Json(u16, Value),
    /// A write, with its warnings.
    Written(u16, Written),
    Watch(WatchRequest),
}

fn parse_json(body: &Bytes) -> Result<Value, ApiError> {
    serde_json::from_slice(body).map_err(|e| {
        ApiError::bad_request(format!(
            "the request body is not valid JSON: {}",
            kubedev_core::echo::chain(&e)
        ))
    })
}

fn dry_run(query: &HashMap<String, String>) -> bool {
    query.get("dryRun").is_some_and(|v| !v.is_empty())
}

fn write_options(query: &HashMap<String, String>) -> Result<WriteOptions, ApiError> {
    Ok(WriteOptions {
        dry_run: dry_run(query),
        field_validation: FieldValidation::parse(query.get("fieldValidation").map(String::as_str))?,
    })
}

fn key(route: &Route) -> Key {
    Key::new(
        route.namespace.as_deref(),
        route.name.as_deref().unwrap_or(""),
    )
}

/// Serves `verb` on `route` with the request's query, content type and body.
pub(super) fn serve(
    shared: &Shared,
    verb: Verb,
    route: &Route,
    query: &HashMap<String, String>,
    content_type: &str,
    body: &Bytes,
) -> Result<Served, ApiError> {
    let store = &shared.store;
    let resource = route.resource;
    let target = if route.status {
        Target::Status
    } else {
        Target::Main
    };
    match verb {
        Verb::Get | Verb::GetStatus => store
            .get(resource, &key(route))
            .map(|v| Served::Json(200, v))
            .ok_or_else(|| {
                ApiError::not_found(&resource.kindish(), route.name.as_deref().unwrap_or(""))
            }),
        Verb::List => {
            let selectors = Selectors::from_query(resource, query)?;
            let (items, rv) = store.list(resource, route.namespace.as_deref(), &selectors);
            Ok(Served::Json(200, list_body(resource, items, rv)))
        }
        Verb::Watch => Ok(Served::Watch(WatchRequest::parse(resource, route, query)?)),
        Verb::Create => {
            let object = parse_json(body)?;
            let options = write_options(query)?;
            let created = store.create(resource, route.namespace.as_deref(), object, &options)?;
            Ok(Served::Written(201, created))
        }
        Verb::Update | Verb::UpdateStatus => {
            let object = parse_json(body)?;
            let options = write_options(query)?;
            Ok(Served::Written(
                200,
                store.update(resource, &key(route), object, target, &options)?,
            ))
        }
        Verb::Patch | Verb::PatchStatus => patch(store, route, query, content_type, body, target),
        Verb::Delete => delete(store, route, query, body),
        Verb::DeleteCollection => delete_collection(store, route, query, body),
    }
}

/// A patch of the kind the content type names: 200 with the object, or 201 when an apply
/// patch created it.
fn patch(
    store: &Store,
    route: &Route,
    query: &HashMap<String, String>,
    content_type: &str,
    body: &Bytes,
    target: Target,
) -> Result<Served, ApiError> {
    let resource = route.resource;
    let kind = patch_kind(content_type)?;
    let patch = if kind == PatchKind::Apply {
        apply_patch(query, body)?
    } else {
        parse_json(body)?
    };
    let existed = store.get(resource, &key(route)).is_some();
    let options = write_options(query)?;
    let patched = store.patch(resource, &key(route), kind, &patch, target, &options)?;
    Ok(Served::Written(if existed { 200 } else { 201 }, patched))
}

/// The patch kind of the media type in `content_type`; 415 for any other.
fn patch_kind(content_type: &str) -> Result<PatchKind, ApiError> {
    let media = content_type.split(';').next().unwrap_or("").trim();
    match media {
        "application/merge-patch+json" => Ok(PatchKind::Merge),
        "application/strategic-merge-patch+json" => Ok(PatchKind::StrategicMerge),
        "application/json-patch+json" => Ok(PatchKind::Json),
        "application/apply-patch+yaml" | "application/apply-patch+json" => Ok(PatchKind::Apply),
        other => Err(ApiError::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, application/strategic-merge-patch+json (got {other:?})"
            ),
        )),
    }
}

/// The body of an apply patch, JSON or YAML; the query must name a field manager.
fn apply_patch(query: &HashMap<String, String>, body: &Bytes) -> Result<Value, ApiError> {
    if query.get("fieldManager").is_none_or(String::is_empty) {
        return Err(ApiError::new(
            422,
            "Invalid",
            "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch",
        ));
    }
    match serde_json::from_slice(body) {
        Ok(v) => Ok(v),
        Err(_) => {
            let text = std::str::from_utf8(body).map_err(|e| {
                ApiError::bad_request(format!(
                    "the apply patch is not UTF-8: {}",
                    kubedev_core::echo::chain(&e)
                ))
            })?;
            serde_saphyr::from_str::<Value>(text).map_err(|e| {
                ApiError::bad_request(format!(
                    "the apply patch is not valid YAML: {}",
                    kubedev_core::echo::chain(&e)
                ))
            })
        }
    }
}

/// The options of a delete: the body's `DeleteOptions`, if any, and the query's `dryRun`.
fn delete_options(
    query: &HashMap<String, String>,
    body: &Bytes,
) -> Result<DeleteOptions, ApiError> {
    let mut options = if body.is_empty() {
        DeleteOptions::default()
    } else {
        DeleteOptions::from_body(&parse_json(body)?)
    };
    options.dry_run |= dry_run(query);
    Ok(options)
}

/// Deletes the route's object: a `Status` of success, or the object itself while finalizers
/// hold it.
fn delete(
    store: &Store,
    route: &Route,
    query: &HashMap<String, String>,
    body: &Bytes,
) -> Result<Served, ApiError> {
    let resource = route.resource;
    let options = delete_options(query, body)?;
    let object = store.delete(resource, &key(route), &options)?;
    let pending = object
        .pointer("/metadata/deletionTimestamp")
        .is_some_and(|v| !v.is_null());
    if pending {
        // Finalizers hold the object: the API server answers with the object itself.
        Ok(Served::Json(200, object))
    } else {
        Ok(Served::Json(200, delete_status(resource, &object)))
    }
}

/// Deletes every object of the route's collection the selectors match: the list of the deleted
/// objects.
fn delete_collection(
    store: &Store,
    route: &Route,
    query: &HashMap<String, String>,
    body: &Bytes,
) -> Result<Served, ApiError> {
    let resource = route.resource;
    let selectors = Selectors::from_query(resource, query)?;
    let options = delete_options(query, body)?;
    let (items, _) = store.list(resource, route.namespace.as_deref(), &selectors);
    let mut deleted = Vec::new();
    for item in items {
        let ns = item.pointer("/metadata/namespace").and_then(Value::as_str);
        let name = item
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or("");
        match store.delete(
            resource,
            &Key::new(ns.filter(|_| resource.namespaced()), name),
            &options,
        ) {
            Ok(object) => deleted.push(object),
            // Someone else deleted it in between: nothing to do.
            Err(e) if e.code == 404 => {}
            Err(e) => return Err(e),
        }
    }
    let rv = store.resource_version();
    Ok(Served::Json(200, list_body(resource, deleted, rv)))
}

fn list_body(resource: Resource, items: Vec<Value>, rv: u64) -> Value {
    json!({
        "apiVersion": resource.api_version(),
        "kind": resource.list_kind(),
        "metadata": {"resourceVersion": rv.to_string()},
        "items": items,
    })
}

fn delete_status(resource: Resource, object: &Value) -> Value {
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "details": {
            "name": object.pointer("/metadata/name").cloned().unwrap_or(Value::Null),
            "group": resource.group(),
            "kind": resource.plural(),
            "uid": object.pointer("/metadata/uid").cloned().unwrap_or(Value::Null),
        },
    })
}
