//! The ResourceSlice watch against an API-server emulator that refuses to list: how often it
//! tries again, and what it logs.
#![allow(clippy::unwrap_used)]

use parking_lot::Mutex;
use std::sync::Arc;
use std::time::Duration;

use kubedev_apiserver::SlicePublisher;
use kubedev_core::{Device, DeviceName, DriverName, Inventory, Pool, PoolName, Publisher};
use kubedev_testkit::apiserver::{ApiServer, Fault, Resource, Verb};
use serde_json::json;

const DRIVER: &str = "gpu.example.com";
const NODE: &str = "node-a";

/// Everything logged on this test's thread, as text lines.
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Logs {
    type Writer = Logs;
    fn make_writer(&'a self) -> Logs {
        self.clone()
    }
}

impl Logs {
    /// Collects this thread's log lines until the guard is dropped.
    fn capture(&self) -> tracing::subscriber::DefaultGuard {
        let subscriber = tracing_subscriber::fmt()
            .with_writer(self.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::DEBUG)
            .finish();
        tracing::subscriber::set_default(subscriber)
    }

    /// The lines at `level` that contain `text`.
    fn lines(&self, level: &str, text: &str) -> Vec<String> {
        let all = String::from_utf8_lossy(&self.0.lock()).into_owned();
        all.lines()
            .filter(|l| l.contains(&format!(" {level} ")) && l.contains(text))
            .map(str::to_owned)
            .collect()
    }
}

async fn server_with_node() -> ApiServer {
    let server = ApiServer::start().await.unwrap();
    server
        .put_raw(
            Resource::Nodes,
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}}),
        )
        .unwrap();
    server
}

fn publisher(server: &ApiServer) -> SlicePublisher {
    SlicePublisher::new(
        server.client().unwrap(),
        DriverName::new(DRIVER).unwrap(),
        NODE,
    )
    .unwrap()
    .with_sync_delay(Duration::from_millis(20))
}

#[tokio::test]
async fn a_watch_that_keeps_failing_retries_less_and_less_often_and_logs_once() {
    let logs = Logs::default();
    let _capture = logs.capture();
    let server = server_with_node().await;
    server.fail_next(
        Verb::List,
        Resource::ResourceSlices,
        10_000,
        Fault::InternalError,
    );
    let publisher = publisher(&server);
    let task = publisher.start().unwrap();
    tokio::time::sleep(Duration::from_secs(12)).await;
    // 0.5 s doubling, ±25%: attempts near 0, 0.5, 1.5, 3.5 and 7.5 s; the next at 11.6 s at the
    // earliest. Retrying about once a second would have made 8 or more.
    let lists = server.request_count(Verb::List, Resource::ResourceSlices);
    assert!(
        (4..=6).contains(&lists),
        "{lists} list requests in 12 s:\n{}",
        logs.lines("WARN", "").join("\n")
    );
    let warnings = logs.lines("WARN", "ResourceSlice watch");
    assert_eq!(
        warnings.len(),
        1,
        "one warning for the first failure, no more within a minute:\n{}",
        warnings.join("\n")
    );
    assert!(
        warnings[0].contains("ResourceSlice watch failed") && warnings[0].contains("retry_in"),
        "{}",
        warnings[0]
    );
    assert!(
        publisher
            .last_error()
            .is_some_and(|e| e.contains("watching ResourceSlices")),
        "{:?}",
        publisher.last_error()
    );
    task.stop().await;
}

#[tokio::test]
async fn a_watch_that_recovers_says_so_once() {
    let logs = Logs::default();
    let _capture = logs.capture();
    let server = server_with_node().await;
    server.fail_next(
        Verb::List,
        Resource::ResourceSlices,
        3,
        Fault::InternalError,
    );
    let publisher = publisher(&server);
    let task = publisher.start().unwrap();
    let gpu = Device::new(DeviceName::new("gpu-0").unwrap());
    publisher
        .publish(&Inventory::new(vec![Pool::new(
            PoolName::new(NODE).unwrap(),
            vec![gpu],
        )]))
        .await
        .unwrap();
    publisher
        .wait_synced(Duration::from_secs(20))
        .await
        .unwrap();
    assert_eq!(
        server.request_count(Verb::List, Resource::ResourceSlices),
        4,
        "three failed lists, then one that worked"
    );
    let warnings = logs.lines("WARN", "ResourceSlice watch");
    assert_eq!(warnings.len(), 1, "{}", warnings.join("\n"));
    let recovered = logs.lines("INFO", "ResourceSlice watch recovered");
    assert_eq!(recovered.len(), 1, "{}", recovered.join("\n"));
    assert!(recovered[0].contains("failures=3"), "{}", recovered[0]);
    assert_eq!(publisher.last_error(), None);
    task.stop().await;
}
