//! Watch streams: a watch request's parameters, the stored events it sees as
//! newline-delimited JSON lines, bookmarks, and the task that feeds one stream until the client
//! leaves, the server stops, watches are dropped or the watch times out.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderValue, header};
use axum::response::Response;
use serde_json::{Value, json};
use tokio::sync::{broadcast, mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;

use super::{Route, Shared};
use crate::apiserver::resource::Resource;
use crate::apiserver::selectors::Selectors;
use crate::apiserver::status::ApiError;
use crate::apiserver::store::{Event, EventType, WatchSetup, WatchStart};

/// How long a watch lasts when the client does not say.
const DEFAULT_WATCH_TIMEOUT: Duration = Duration::from_secs(1800);

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
    /// The watch the query asks for on `resource` (in the route's namespace, if any).
    pub(super) fn parse(
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
            selectors: Selectors::from_query(resource, query)?,
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

    /// A `BOOKMARK` line at `rv`, marking the end of the initial events when `initial_end`.
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

/// One line of a watch stream: the event `kind` with `object`.
fn event_line(kind: &str, object: &Value) -> Bytes {
    let mut line = json!({"type": kind, "object": object}).to_string();
    line.push('\n');
    Bytes::from(line)
}

type Chunk = Result<Bytes, Infallible>;

/// Opens a watch stream for `request` and starts the task that feeds it.
pub(super) fn start_watch(shared: Arc<Shared>, request: WatchRequest) -> Response {
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
    setup: WatchSetup,
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
                let sent = send_bookmark(shared, request, &mut live, &mut position, &dropped, tx);
                if !sent.await {
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

/// Sends the events already stored, then a bookmark at the store's resourceVersion; false when
/// the watch must end instead.
async fn send_bookmark(
    shared: &Shared,
    request: &WatchRequest,
    live: &mut broadcast::Receiver<Arc<Event>>,
    position: &mut u64,
    dropped: &watch::Receiver<u64>,
    tx: &mpsc::Sender<Chunk>,
) -> bool {
    // Every event up to `now` is already in the channel (events are sent under the store lock
    // that also hands out resourceVersions): drain them first so the bookmark never runs ahead
    // of what this watch has seen.
    let now = shared.store.resource_version();
    let mut pending = Vec::new();
    loop {
        match live.try_recv() {
            Ok(event) => pending.push(event),
            Err(broadcast::error::TryRecvError::Empty) => break,
            Err(_) => return false,
        }
    }
    for event in &pending {
        if event.rv <= *position {
            continue;
        }
        *position = event.rv;
        if let Some(line) = request.translate(event)
            && tx.send(Ok(line)).await.is_err()
        {
            return false;
        }
    }
    if dropped.has_changed().unwrap_or(true) {
        // Dropped (or compacted) meanwhile: a bookmark now could skip a 410.
        return false;
    }
    *position = (*position).max(now);
    tx.send(Ok(request.bookmark(*position, false)))
        .await
        .is_ok()
}
