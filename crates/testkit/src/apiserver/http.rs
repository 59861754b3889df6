//! The HTTP side: URL routing in the Kubernetes REST layout, verbs, query parameters, JSON
//! bodies, and watch streams of newline-delimited JSON events.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Query, Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::sync::{broadcast, mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;

use super::faults::Faults;
use super::resource::{Resource, Verb};
use super::selectors::{FieldSelector, LabelSelector, Selectors};
use super::status::ApiError;
use super::store::{
    DeleteOptions, Event, EventType, Key, PatchKind, Store, Target, WatchStart, WriteOptions,
    Written,
};
use super::strategy::FieldValidation;

/// Largest request body accepted.
const MAX_BODY: usize = 64 * 1024 * 1024;
/// How long a watch lasts when the client does not say.
const DEFAULT_WATCH_TIMEOUT: Duration = Duration::from_secs(1800);

/// Everything the handlers share.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) store: Store,
    pub(crate) faults: Faults,
    /// Bumped to end every open watch.
    pub(crate) drop_watches: watch::Sender<u64>,
    pub(crate) shutdown: CancellationToken,
    pub(crate) bookmark_interval: Duration,
    pub(crate) open_watches: AtomicUsize,
    pub(crate) address: String,
}

fn json_response(code: u16, body: &Value) -> Response {
    let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = (status, body.to_string()).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

fn error_response(error: &ApiError) -> Response {
    let mut response = json_response(error.code, &error.to_status());
    if error.code == 429 {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    response
}

/// The parsed target of a resource request.
#[derive(Debug)]
struct Route {
    resource: Resource,
    namespace: Option<String>,
    name: Option<String>,
    status: bool,
}

fn parse_route(path: &str) -> Result<Option<Route>, ApiError> {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group_version, rest) = match segments.as_slice() {
        ["api", "v1", rest @ ..] => ("v1".to_owned(), rest),
        ["apis", group, version, rest @ ..] => (format!("{group}/{version}"), rest),
        _ => return Ok(None),
    };
    let (namespace, rest) = match rest {
        ["namespaces", ns, rest @ ..] if !rest.is_empty() => (Some((*ns).to_owned()), rest),
        _ => (None, rest),
    };
    let (plural, name, status) = match rest {
        [plural] => (*plural, None, false),
        [plural, name] => (*plural, Some((*name).to_owned()), false),
        [plural, name, "status"] => (*plural, Some((*name).to_owned()), true),
        _ => return Ok(None),
    };
    let Some(resource) = Resource::from_path(&group_version, plural) else {
        return Ok(None);
    };
    if namespace.is_some() && !resource.namespaced() {
        return Ok(None);
    }
    if resource.namespaced() && namespace.is_none() && name.is_some() {
        return Ok(None);
    }
    if status && !resource.has_status() {
        return Ok(None);
    }
    Ok(Some(Route {
        resource,
        namespace,
        name,
        status,
    }))
}

fn not_found_path(path: &str) -> ApiError {
    ApiError::new(
        404,
        "NotFound",
        format!("the server could not find the requested resource ({path})"),
    )
}

/// Entry point for every request.
pub(crate) async fn handle(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    let path = request.uri().path().to_owned();
    if let Some(response) = discovery(&shared, &path) {
        return response;
    }
    let route = match parse_route(&path) {
        Ok(Some(route)) => route,
        Ok(None) => return error_response(&not_found_path(&path)),
        Err(e) => return error_response(&e),
    };
    let query: HashMap<String, String> = Query::try_from_uri(request.uri())
        .map(|q| q.0)
        .unwrap_or_default();
    let is_watch = matches!(query.get("watch").map(String::as_str), Some("true" | "1"));
    let verb = match (request.method(), route.name.is_some(), route.status) {
        (&Method::GET, false, _) if is_watch => Verb::Watch,
        (&Method::GET, false, _) => Verb::List,
        (&Method::GET, true, false) => Verb::Get,
        (&Method::GET, true, true) => Verb::GetStatus,
        (&Method::POST, false, _) => Verb::Create,
        (&Method::PUT, true, false) => Verb::Update,
        (&Method::PUT, true, true) => Verb::UpdateStatus,
        (&Method::PATCH, true, false) => Verb::Patch,
        (&Method::PATCH, true, true) => Verb::PatchStatus,
        (&Method::DELETE, true, false) => Verb::Delete,
        (&Method::DELETE, false, _) => Verb::DeleteCollection,
        (method, _, _) => {
            return error_response(&ApiError::new(
                405,
                "MethodNotAllowed",
                format!(
                    "the server does not allow this method on the requested resource ({method} {path})"
                ),
            ));
        }
    };

    let (latency, fault) = shared.faults.admit(verb, route.resource);
    if !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }
    if let Some(fault) = fault {
        return error_response(&fault.to_error(verb, route.resource));
    }

    let content_type = request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let body = match axum::body::to_bytes(request.into_body(), MAX_BODY).await {
        Ok(b) => b,
        Err(e) => {
            return error_response(&ApiError::bad_request(format!(
                "cannot read the request body: {e}"
            )));
        }
    };
    match serve(&shared, verb, &route, &query, &content_type, &body) {
        Ok(Served::Json(code, value)) => json_response(code, &value),
        Ok(Served::Written(code, written)) => {
            let mut response = json_response(code, &written.object);
            for warning in &written.warnings {
                if let Ok(value) = HeaderValue::from_str(&warning_header(warning)) {
                    response.headers_mut().append(header::WARNING, value);
                }
            }
            response
        }
        Ok(Served::Watch(request)) => start_watch(shared, request),
        Err(e) => error_response(&e),
    }
}

enum Served {
    Json(u16, Value),
    /// A write, with its warnings.
    Written(u16, Written),
    Watch(WatchRequest),
}

/// A `Warning` header value (RFC 7234 form, code 299, no agent), as the API server sends it.
fn warning_header(text: &str) -> String {
    let escaped = text.replace('\\', "\\\\").replace('"', "\\\"");
    format!("299 - \"{escaped}\"")
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

fn selectors(resource: Resource, query: &HashMap<String, String>) -> Result<Selectors, ApiError> {
    Ok(Selectors {
        labels: LabelSelector::parse(query.get("labelSelector").map(String::as_str).unwrap_or(""))?,
        fields: FieldSelector::parse(
            query.get("fieldSelector").map(String::as_str).unwrap_or(""),
            resource,
        )?,
    })
}

fn key(route: &Route) -> Key {
    Key::new(
        route.namespace.as_deref(),
        route.name.as_deref().unwrap_or(""),
    )
}

fn serve(
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
            let selectors = selectors(resource, query)?;
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
        Verb::Patch | Verb::PatchStatus => {
            let media = content_type.split(';').next().unwrap_or("").trim();
            let kind = match media {
                "application/merge-patch+json" => PatchKind::Merge,
                "application/strategic-merge-patch+json" => PatchKind::StrategicMerge,
                "application/json-patch+json" => PatchKind::Json,
                "application/apply-patch+yaml" | "application/apply-patch+json" => PatchKind::Apply,
                other => {
                    return Err(ApiError::new(
                        415,
                        "UnsupportedMediaType",
                        format!(
                            "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, application/strategic-merge-patch+json (got {other:?})"
                        ),
                    ));
                }
            };
            let patch = if kind == PatchKind::Apply {
                if query.get("fieldManager").is_none_or(String::is_empty) {
                    return Err(ApiError::new(
                        422,
                        "Invalid",
                        "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch",
                    ));
                }
                match serde_json::from_slice(body) {
                    Ok(v) => v,
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
                        })?
                    }
                }
            } else {
                parse_json(body)?
            };
            let existed = store.get(resource, &key(route)).is_some();
            let options = write_options(query)?;
            let patched = store.patch(resource, &key(route), kind, &patch, target, &options)?;
            Ok(Served::Written(if existed { 200 } else { 201 }, patched))
        }
        Verb::Delete => {
            let mut options = if body.is_empty() {
                DeleteOptions::default()
            } else {
                DeleteOptions::from_body(&parse_json(body)?)
            };
            options.dry_run |= dry_run(query);
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
        Verb::DeleteCollection => {
            let selectors = selectors(resource, query)?;
            let mut options = if body.is_empty() {
                DeleteOptions::default()
            } else {
                DeleteOptions::from_body(&parse_json(body)?)
            };
            options.dry_run |= dry_run(query);
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
    }
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

/// A parsed watch request.
#[derive(Debug)]
pub(crate) struct WatchRequest {
    resource: Resource,
    namespace: Option<String>,
    selectors: Selectors,
    start: WatchStart,
    bookmarks: bool,
    initial_events: bool,
    timeout: Duration,
}

impl WatchRequest {
    fn parse(
        resource: Resource,
        route: &Route,
        query: &HashMap<String, String>,
    ) -> Result<Self, ApiError> {
        let flag = |name: &str| matches!(query.get(name).map(String::as_str), Some("true" | "1"));
        let initial_events = flag("sendInitialEvents");
        if initial_events
            && query.get("resourceVersionMatch").map(String::as_str) != Some("NotOlderThan")
        {
            return Err(ApiError::new(
                422,
                "Invalid",
                "ListOptions.meta.k8s.io \"\" is invalid: resourceVersionMatch: Forbidden: sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
            ));
        }
        if initial_events && !flag("allowWatchBookmarks") {
            return Err(ApiError::new(
                422,
                "Invalid",
                "ListOptions.meta.k8s.io \"\" is invalid: allowWatchBookmarks: Forbidden: sendInitialEvents requires setting allowWatchBookmarks to true",
            ));
        }
        let rv = query
            .get("resourceVersion")
            .map(String::as_str)
            .unwrap_or("");
        let start = if initial_events || rv.is_empty() || rv == "0" {
            WatchStart::CurrentState
        } else {
            let from: u64 = rv.parse().map_err(|_| {
                ApiError::bad_request(format!("invalid resource version {rv:?}: not a number"))
            })?;
            WatchStart::After(from)
        };
        let timeout = query
            .get("timeoutSeconds")
            .and_then(|t| t.parse::<u64>().ok())
            .filter(|t| *t > 0)
            .map_or(DEFAULT_WATCH_TIMEOUT, Duration::from_secs);
        Ok(Self {
            resource,
            namespace: route.namespace.clone(),
            selectors: selectors(resource, query)?,
            start,
            bookmarks: flag("allowWatchBookmarks"),
            initial_events,
            timeout,
        })
    }

    /// The line to send for a stored event, if this watch sees it.
    fn translate(&self, event: &Event) -> Option<Bytes> {
        if event.resource != self.resource {
            return None;
        }
        if let Some(ns) = &self.namespace
            && event
                .object
                .pointer("/metadata/namespace")
                .and_then(Value::as_str)
                != Some(ns.as_str())
        {
            return None;
        }
        let now = self.selectors.matches(self.resource, &event.object);
        let before = event
            .prev
            .as_ref()
            .map(|p| self.selectors.matches(self.resource, p));
        let kind = match (event.kind, before, now) {
            (EventType::Added, _, true) => EventType::Added,
            (EventType::Modified, Some(true), true) => EventType::Modified,
            (EventType::Modified, Some(false) | None, true) => EventType::Added,
            (EventType::Modified, Some(true), false) => EventType::Deleted,
            (EventType::Deleted, _, true) => EventType::Deleted,
            _ => return None,
        };
        Some(event_line(kind.as_str(), &event.object))
    }

    fn bookmark(&self, rv: u64, initial_end: bool) -> Bytes {
        let mut metadata = json!({"resourceVersion": rv.to_string()});
        if initial_end {
            metadata["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        let object = json!({
            "apiVersion": self.resource.api_version(),
            "kind": self.resource.kind(),
            "metadata": metadata,
        });
        event_line("BOOKMARK", &object)
    }
}

fn event_line(kind: &str, object: &Value) -> Bytes {
    let mut line = json!({"type": kind, "object": object}).to_string();
    line.push('\n');
    Bytes::from(line)
}

type Chunk = Result<Bytes, Infallible>;

fn start_watch(shared: Arc<Shared>, request: WatchRequest) -> Response {
    let (tx, rx) = mpsc::channel::<Chunk>(256);
    // Subscribed before the answer goes out: a watch whose client has its headers always ends
    // on a later drop (or restart), never misses it.
    let dropped = shared.drop_watches.subscribe();
    let setup = shared.store.watch(request.resource, request.start);
    tokio::spawn(async move {
        shared.open_watches.fetch_add(1, Ordering::SeqCst);
        match setup {
            Ok(setup) => run_watch(&shared, &request, setup, dropped, &tx).await,
            Err(error) => {
                // Like the API server: the watch opens, reports the error as an event, and ends.
                let _ = tx.send(Ok(event_line("ERROR", &error.to_status()))).await;
            }
        }
        shared.open_watches.fetch_sub(1, Ordering::SeqCst);
    });
    let mut response = Response::new(Body::from_stream(ReceiverStream::new(rx)));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response.headers_mut().insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("no-cache, private"),
    );
    response
}

async fn run_watch(
    shared: &Shared,
    request: &WatchRequest,
    setup: super::store::WatchSetup,
    mut dropped: watch::Receiver<u64>,
    tx: &mpsc::Sender<Chunk>,
) {
    let mut live = setup.live;
    let mut position = setup.rv;
    for event in &setup.backlog {
        if let Some(line) = request.translate(event)
            && tx.send(Ok(line)).await.is_err()
        {
            return;
        }
    }
    if request.initial_events && tx.send(Ok(request.bookmark(position, true))).await.is_err() {
        return;
    }
    let deadline = tokio::time::sleep(request.timeout);
    tokio::pin!(deadline);
    let mut ticker = tokio::time::interval(shared.bookmark_interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticker.tick().await;
    loop {
        tokio::select! {
            () = tx.closed() => return,
            () = shared.shutdown.cancelled() => return,
            _ = dropped.changed() => return,
            () = &mut deadline => return,
            _ = ticker.tick(), if request.bookmarks => {
                // Every event up to `now` is already in the channel (events are sent under the
                // store lock that also hands out resourceVersions): drain them first so the
                // bookmark never runs ahead of what this watch has seen.
                let now = shared.store.resource_version();
                let mut pending = Vec::new();
                loop {
                    match live.try_recv() {
                        Ok(event) => pending.push(event),
                        Err(broadcast::error::TryRecvError::Empty) => break,
                        Err(_) => return,
                    }
                }
                for event in &pending {
                    if event.rv <= position {
                        continue;
                    }
                    position = event.rv;
                    if let Some(line) = request.translate(event)
                        && tx.send(Ok(line)).await.is_err()
                    {
                        return;
                    }
                }
                if dropped.has_changed().unwrap_or(true) {
                    // Dropped (or compacted) meanwhile: a bookmark now could skip a 410.
                    return;
                }
                position = position.max(now);
                if tx.send(Ok(request.bookmark(position, false))).await.is_err() {
                    return;
                }
            }
            received = live.recv() => match received {
                Ok(event) => {
                    if event.rv <= position {
                        continue;
                    }
                    position = event.rv;
                    if let Some(line) = request.translate(&event)
                        && tx.send(Ok(line)).await.is_err()
                    {
                        return;
                    }
                }
                Err(broadcast::error::RecvError::Lagged(_)) => {
                    // This watch fell too far behind; end it so the client resumes from the
                    // last resourceVersion it saw (the history still has those events).
                    return;
                }
                Err(broadcast::error::RecvError::Closed) => return,
            },
        }
    }
}

fn discovery(shared: &Shared, path: &str) -> Option<Response> {
    let group_version = json!({"groupVersion": "resource.k8s.io/v1", "version": "v1"});
    let resource_entry = |r: Resource, verbs: &[&str]| {
        json!({
            "name": r.plural(),
            "singularName": r.kind().to_ascii_lowercase(),
            "namespaced": r.namespaced(),
            "kind": r.kind(),
            "verbs": verbs,
        })
    };
    let all_verbs = [
        "create",
        "delete",
        "deletecollection",
        "get",
        "list",
        "patch",
        "update",
        "watch",
    ];
    let status_entry = |r: Resource| json!({"name": format!("{}/status", r.plural()), "singularName": "", "namespaced": r.namespaced(), "kind": r.kind(), "verbs": ["get", "patch", "update"]});
    let release = shared.store.strategy().release;
    let body = match path.trim_end_matches('/') {
        "/version" => json!({
            "major": release.major().to_string(),
            "minor": release.minor().to_string(),
            "emulationMajor": release.major().to_string(),
            "emulationMinor": release.minor().to_string(),
            "minCompatibilityMajor": release.major().to_string(),
            "minCompatibilityMinor": (release.minor() - 1).to_string(),
            "gitVersion": release.git_version(),
            "gitCommit": "",
            "gitTreeState": "clean",
            "buildDate": "",
            "goVersion": "",
            "compiler": "kubedev",
            "platform": "linux/amd64",
        }),
        "/api" => json!({
            "kind": "APIVersions",
            "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": shared.address}],
        }),
        "/apis" => json!({
            "kind": "APIGroupList",
            "apiVersion": "v1",
            "groups": [
                {"name": "resource.k8s.io", "versions": [group_version], "preferredVersion": group_version},
                {"name": "events.k8s.io", "versions": [{"groupVersion": "events.k8s.io/v1", "version": "v1"}], "preferredVersion": {"groupVersion": "events.k8s.io/v1", "version": "v1"}},
            ],
        }),
        "/apis/resource.k8s.io" => json!({
            "kind": "APIGroup",
            "apiVersion": "v1",
            "name": "resource.k8s.io",
            "versions": [group_version],
            "preferredVersion": group_version,
        }),
        "/api/v1" => json!({
            "kind": "APIResourceList",
            "groupVersion": "v1",
            "resources": [
                resource_entry(Resource::Nodes, &all_verbs),
                status_entry(Resource::Nodes),
                resource_entry(Resource::Pods, &all_verbs),
                status_entry(Resource::Pods),
            ],
        }),
        "/apis/resource.k8s.io/v1" => json!({
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": "resource.k8s.io/v1",
            "resources": [
                resource_entry(Resource::DeviceClasses, &all_verbs),
                resource_entry(Resource::ResourceClaims, &all_verbs),
                status_entry(Resource::ResourceClaims),
                resource_entry(Resource::ResourceSlices, &all_verbs),
            ],
        }),
        "/apis/events.k8s.io/v1" => json!({
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": "events.k8s.io/v1",
            "resources": [resource_entry(Resource::Events, &all_verbs)],
        }),
        "/healthz" | "/readyz" | "/livez" => return Some((StatusCode::OK, "ok").into_response()),
        _ => return None,
    };
    Some(json_response(200, &body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_follow_the_rest_layout() {
        let r = parse_route("/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c/status")
            .expect("parse")
            .expect("route");
        assert_eq!(
            (
                r.resource,
                r.namespace.as_deref(),
                r.name.as_deref(),
                r.status
            ),
            (Resource::ResourceClaims, Some("ns"), Some("c"), true)
        );
        let r = parse_route("/api/v1/nodes/n1")
            .expect("parse")
            .expect("route");
        assert_eq!(
            (r.resource, r.name.as_deref()),
            (Resource::Nodes, Some("n1"))
        );
        let r = parse_route("/apis/resource.k8s.io/v1/resourceclaims")
            .expect("parse")
            .expect("route");
        assert_eq!(
            (r.resource, r.namespace, r.name),
            (Resource::ResourceClaims, None, None)
        );
        let r = parse_route("/api/v1/namespaces/ns/pods/p")
            .expect("parse")
            .expect("route");
        assert_eq!(
            (r.resource, r.namespace.as_deref(), r.name.as_deref()),
            (Resource::Pods, Some("ns"), Some("p"))
        );
        for missing in [
            "/apis/resource.k8s.io/v1/namespaces/ns/resourceslices",
            "/apis/resource.k8s.io/v1/resourceslices/s/status",
            "/apis/resource.k8s.io/v1beta1/resourceslices",
            "/api/v1/configmaps",
            "/apis/resource.k8s.io/v1/resourceclaims/c",
        ] {
            assert!(parse_route(missing).expect("parse").is_none(), "{missing}");
        }
    }
}
