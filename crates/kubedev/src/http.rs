//! The daemon's HTTP endpoint: `/metrics` (Prometheus), `/healthz` (every socket the daemon
//! serves answers) and `/readyz` (registered with the kubelet and, in DRA mode, published).

use parking_lot::RwLock;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use http_body_util::Full;
use hyper::body::Bytes;
use hyper::{Request, Response, StatusCode};
use kubedev_kubelet_grpc::device_plugin::PluginStatus;
use kubedev_kubelet_grpc::dra::DraStatus;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;

/// What `/healthz` and `/readyz` look at; the runtime fills it in as servers start.
#[derive(Default)]
pub(crate) struct Probes {
    sockets: RwLock<Vec<PathBuf>>,
    device_plugins: RwLock<Vec<(String, watch::Receiver<PluginStatus>)>>,
    dra: RwLock<Option<(String, watch::Receiver<DraStatus>)>>,
    published: AtomicBool,
    slices: RwLock<Option<Arc<dyn kubedev_core::Publisher>>>,
    notices: RwLock<Vec<String>>,
    /// Notices that come and go, by key.
    keyed_notices: RwLock<std::collections::BTreeMap<String, String>>,
    /// Set once every configured server has been started (and added here).
    started: AtomicBool,
}

impl std::fmt::Debug for Probes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Probes")
            .field("published", &self.published)
            .finish_non_exhaustive()
    }
}

impl Probes {
    /// Empty probes: healthy, and not ready until [`Probes::set_started`].
    pub(crate) fn new() -> Arc<Self> {
        Arc::default()
    }

    /// A socket the daemon serves; `/healthz` connects to it.
    pub(crate) fn add_socket(&self, path: PathBuf) {
        self.sockets.write().push(path);
    }

    /// Forgets a socket (its server stopped).
    pub(crate) fn remove_socket(&self, path: &std::path::Path) {
        self.sockets.write().retain(|p| p != path);
    }

    /// Forgets a device-plugin server (it stopped).
    pub(crate) fn remove_device_plugin(&self, resource: &str) {
        self.device_plugins.write().retain(|(r, _)| r != resource);
    }

    /// A device-plugin server whose registration `/readyz` waits for.
    pub(crate) fn add_device_plugin(
        &self,
        resource: String,
        status: watch::Receiver<PluginStatus>,
    ) {
        self.device_plugins.write().push((resource, status));
    }

    /// The DRA plugin whose registration, and first successful publication, `/readyz` waits
    /// for.
    pub(crate) fn set_dra(&self, driver: String, status: watch::Receiver<DraStatus>) {
        *self.dra.write() = Some((driver, status));
    }

    /// The ResourceSlice publisher whose sync state `/readyz` reports.
    pub(crate) fn set_slices(&self, publisher: Arc<dyn kubedev_core::Publisher>) {
        *self.slices.write() = Some(publisher);
    }

    /// Says every configured server has been started and added: until then `/readyz` fails
    /// (an empty list of servers is not "all registered").
    pub(crate) fn set_started(&self) {
        self.started.store(true, Ordering::Relaxed);
    }

    /// Records the outcome of handing an inventory to the ResourceSlice publisher.
    pub(crate) fn set_published(&self, ok: bool) {
        self.published.store(ok, Ordering::Relaxed);
    }

    /// Something an operator must know that does not make the daemon unready (state lost and
    /// rebuilt at start-up); `/readyz` shows it below its verdict.
    pub(crate) fn add_notice(&self, notice: String) {
        self.notices.write().push(notice);
    }

    /// Sets (`Some`) or clears (`None`) the notice under `key`: for conditions that can end,
    /// such as an API feature the server lacks.
    pub(crate) fn set_notice(&self, key: &str, notice: Option<String>) {
        let mut map = self.keyed_notices.write();
        match notice {
            Some(n) => {
                map.insert(key.to_owned(), n);
            }
            None => {
                map.remove(key);
            }
        }
    }

    /// The notices: those added, oldest first, then those set by key, in key order.
    pub(crate) fn notices(&self) -> Vec<String> {
        let mut all = self.notices.read().clone();
        all.extend(self.keyed_notices.read().values().cloned());
        all
    }

    /// `Ok` when every socket accepts a connection; otherwise which ones do not.
    pub(crate) async fn healthy(&self) -> Result<(), String> {
        let sockets = self.sockets.read().clone();
        let mut bad = Vec::new();
        for s in sockets {
            match tokio::time::timeout(Duration::from_secs(1), tokio::net::UnixStream::connect(&s))
                .await
            {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => bad.push(format!("{}: {e}", s.display())),
                Err(_) => bad.push(format!("{}: no answer within 1 s", s.display())),
            }
        }
        if bad.is_empty() {
            Ok(())
        } else {
            Err(bad.join("\n"))
        }
    }

    /// `Ok` when every server is registered (and DRA has published); otherwise what is missing.
    pub(crate) fn ready(&self) -> Result<(), String> {
        let mut missing = Vec::new();
        if !self.started.load(Ordering::Relaxed) {
            missing.push(
                "starting: not every configured kubelet server has been started yet".to_string(),
            );
        }
        for (r, s) in self.device_plugins.read().iter() {
            let s = s.borrow();
            if !s.registered {
                missing.push(match &s.last_error {
                    Some(e) => format!("device plugin {r} is not registered: {e}"),
                    None => format!("device plugin {r} is not registered yet"),
                });
            }
        }
        if let Some((driver, s)) = &*self.dra.read() {
            let s = s.borrow();
            if !s.registered {
                missing.push(match &s.last_error {
                    Some(e) => format!("DRA driver {driver} is not registered: {e}"),
                    None => format!("DRA driver {driver} is not registered yet"),
                });
            }
            if !self.published.load(Ordering::Relaxed) {
                missing.push(format!(
                    "DRA driver {driver} has not published its ResourceSlices"
                ));
            } else if let Some(p) = &*self.slices.read() {
                match p.sync_state() {
                    kubedev_core::SyncState::Synced => {}
                    kubedev_core::SyncState::Failing(e) => missing.push(format!(
                        "DRA driver {driver}: writing ResourceSlices fails: {e}"
                    )),
                    _ => missing.push(format!(
                        "DRA driver {driver}: ResourceSlices are not written yet"
                    )),
                }
            }
        }
        if missing.is_empty() {
            Ok(())
        } else {
            Err(missing.join("\n"))
        }
    }
}

fn text(status: StatusCode, body: String, content_type: &str) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    if let Ok(v) = hyper::header::HeaderValue::from_str(content_type) {
        r.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
    }
    r
}

async fn answer(
    req: Request<hyper::body::Incoming>,
    metrics: Arc<Metrics>,
    probes: Arc<Probes>,
) -> Response<Full<Bytes>> {
    const PLAIN: &str = "text/plain; charset=utf-8";
    if req.method() != hyper::Method::GET && req.method() != hyper::Method::HEAD {
        return text(StatusCode::METHOD_NOT_ALLOWED, "GET only\n".into(), PLAIN);
    }
    match req.uri().path() {
        "/metrics" => text(
            StatusCode::OK,
            metrics.encode(),
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        ),
        "/healthz" => match probes.healthy().await {
            Ok(()) => text(StatusCode::OK, "ok\n".into(), PLAIN),
            Err(e) => text(StatusCode::SERVICE_UNAVAILABLE, format!("{e}\n"), PLAIN),
        },
        "/readyz" => {
            let notes: String = probes
                .notices()
                .iter()
                .map(|n| format!("note: {n}\n"))
                .collect();
            match probes.ready() {
                Ok(()) => text(StatusCode::OK, format!("ok\n{notes}"), PLAIN),
                Err(e) => text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("{e}\n{notes}"),
                    PLAIN,
                ),
            }
        }
        _ => text(
            StatusCode::NOT_FOUND,
            "not found: try /metrics, /healthz or /readyz\n".into(),
            PLAIN,
        ),
    }
}

/// Binds `address` and serves until `cancel` fires; returns the bound address (useful with
/// port 0) once listening.
pub(crate) async fn serve(
    address: &str,
    metrics: Arc<Metrics>,
    probes: Arc<Probes>,
    cancel: CancellationToken,
) -> anyhow::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(address)
        .await
        .with_context(|| format!("metrics.address {address}: binding"))?;
    let bound = listener.local_addr()?;
    tokio::spawn(async move {
        loop {
            let stream = tokio::select! {
                _ = cancel.cancelled() => break,
                r = listener.accept() => match r {
                    Ok((s, _)) => s,
                    Err(e) => {
                        tracing::warn!(error = %kubedev_core::echo::Chain(&e), "metrics endpoint: accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                },
            };
            let (m, p) = (metrics.clone(), probes.clone());
            let stop = cancel.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req| {
                    let (m, p) = (m.clone(), p.clone());
                    async move { Ok::<_, std::convert::Infallible>(answer(req, m, p).await) }
                });
                let conn = hyper::server::conn::http1::Builder::new()
                    .timer(hyper_util::rt::TokioTimer::new())
                    .header_read_timeout(Duration::from_secs(5))
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), svc);
                tokio::select! {
                    _ = stop.cancelled() => {}
                    r = conn => if let Err(e) = r {
                        tracing::debug!(error = %kubedev_core::echo::Chain(&e), "metrics endpoint: connection ended");
                    },
                }
            });
        }
    });
    Ok(bound)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use kubedev_core::{Inventory, PublishError, SyncState};

    struct Fixed(SyncState);

    #[async_trait::async_trait]
    impl kubedev_core::Publisher for Fixed {
        async fn publish(&self, _: &Inventory) -> Result<(), PublishError> {
            Ok(())
        }
        fn sync_state(&self) -> SyncState {
            self.0.clone()
        }
    }

    #[test]
    fn ready_only_when_registered_and_the_slices_are_written() {
        let probes = Probes::new();
        let e = probes.ready().unwrap_err();
        assert!(e.contains("starting"), "{e}");
        probes.set_started();
        assert!(probes.ready().is_ok(), "nothing to wait for");
        let (tx, rx) = watch::channel(DraStatus::default());
        probes.set_dra("gpu.example.com".into(), rx);
        probes.set_slices(Arc::new(Fixed(SyncState::Failing(
            "503 from the API server".into(),
        ))));
        let e = probes.ready().unwrap_err();
        assert!(e.contains("not registered yet"), "{e}");
        assert!(e.contains("has not published"), "{e}");
        tx.send_modify(|s| s.registered = true);
        probes.set_published(true);
        let e = probes.ready().unwrap_err();
        assert!(e.contains("writing ResourceSlices fails: 503"), "{e}");
        probes.set_slices(Arc::new(Fixed(SyncState::Synced)));
        assert!(probes.ready().is_ok());
    }
}
