//! The HTTP side: URL routing in the Kubernetes REST layout, verbs, query parameters, JSON
//! bodies, and watch streams of newline-delimited JSON events. Each request goes through
//! [`handle`]: discovery paths (module `discovery`), or a route and a verb served from the
//! store (module `verbs`) or as a watch stream (module `watch`).

mod discovery;
mod verbs;
mod watch;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use axum::extract::{Query, Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::Value;
use tokio::sync::watch as notify;
use tokio_util::sync::CancellationToken;

use self::discovery::discovery;
use self::verbs::{Served, serve};
use self::watch::start_watch;
use super::faults::Faults;
use super::resource::{Resource, Verb};
use super::status::ApiError;
use super::store::Store;

/// Largest request body accepted.
const MAX_BODY: usize = 64 * 1024 * 1024;

/// Everything the handlers share.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) store: Store,
    pub(crate) faults: Faults,
    /// Bumped to end every open watch.
    pub(crate) drop_watches: notify::Sender<u64>,
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
    let verb = match verb_of(request.method(), &route, &query, &path) {
        Ok(verb) => verb,
        Err(e) => return error_response(&e),
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
        Ok(served) => served_response(shared, served),
        Err(e) => error_response(&e),
    }
}

/// The verb of a request on `route` with `method` (a watch when the query says so); 405 for a
/// method the route does not allow.
fn verb_of(
    method: &Method,
    route: &Route,
    query: &HashMap<String, String>,
    path: &str,
) -> Result<Verb, ApiError> {
    let is_watch = matches!(query.get("watch").map(String::as_str), Some("true" | "1"));
    Ok(match (method, route.name.is_some(), route.status) {
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
            return Err(ApiError::new(
                405,
                "MethodNotAllowed",
                format!(
                    "the server does not allow this method on the requested resource ({method} {path})"
                ),
            ));
        }
    })
}

/// The response for what a verb served: JSON, a written object with its warnings as `Warning`
/// headers, or a watch stream.
fn served_response(shared: Arc<Shared>, served: Served) -> Response {
    match served {
        Served::Json(code, value) => json_response(code, &value),
        Served::Written(code, written) => {
            let mut response = json_response(code, &written.object);
            for warning in &written.warnings {
                if let Ok(value) = HeaderValue::from_str(&warning_header(warning)) {
                    response.headers_mut().append(header::WARNING, value);
                }
            }
            response
        }
        Served::Watch(request) => start_watch(shared, request),
    }
}

/// A `Warning` header value (RFC 7234 form, code 299, no agent), as the API server sends it.
fn warning_header(text: &str) -> String {
    let escaped = text.replace('\\', "\\\\").replace('"', "\\\"");
    format!("299 - \"{escaped}\"")
}

#[cfg(test)]
mod tests;
