//! The watches soak: what a long-running daemon sees while no claim comes, compressed in time.
//! The static backend polls its devices' presence every 10 ms (the default is 200 ms), one
//! device goes missing and comes back every event and is republished each time, the
//! configuration file is replaced every second event (alternating the poll interval, so the
//! backend and its watch are rebuilt), and the API server drops every watch every tenth event,
//! as its watch timeouts do. 20,000 events are about 120,000 presence polls (6.7 hours at the
//! default interval), 10,000 configuration reloads and 2,000 dropped watches.
//!
//! Memory may grow by at most [`MAX_GROWTH_KIB`] here: a reload that kept 2.2 KiB (the
//! watcher tasks it stopped, before they were reaped) grew it by 440 KiB over CI's 400 events.

use std::path::Path;
use std::time::Instant;

use anyhow::{Context as _, bail};
use kubedev_testkit::apiserver::Resource;

use super::dra::{FLAKY, Node};
use super::{Args, Probe, Soak, WAIT, Workload};

/// Presence poll interval of the soak, in milliseconds.
const POLL_MS: u64 = 10;
/// Events before the first measurement that counts, and between two measurements.
const EVERY: u64 = 200;
/// The most resident memory may grow over this soak, in KiB (tighter than the others: it runs
/// fewer, smaller steps).
pub(super) const MAX_GROWTH_KIB: u64 = 384;

/// Runs the watches soak with `bin`.
pub(super) async fn run(bin: &Path, args: &Args) -> anyhow::Result<Soak> {
    let node = Node::new(args.parent_dir(), POLL_MS).await?;
    let daemon = node.start(bin).await?;
    let probe = Probe {
        pid: daemon.0.id(),
        smaps: args.smaps_dir.clone().map(|d| (d, "watches")),
        metrics_port: node.metrics_port,
        checkpoint: Some(node.path().join("state").join("kubedev-checkpoint.json")),
        api_port: Some(node.api.addr().port()),
        dirs: vec![node.path().join("cdi")],
    };
    let mut work = Watches {
        node,
        event: 0,
        applied: 0,
    };
    work.applied = work.reloads_applied()?;
    let mut pace = args.clone();
    pace.warmup = EVERY;
    pace.sample_every = EVERY;
    let (samples, new_series, per_second) =
        super::drive(&probe, &mut work, &pace, args.watch_events, |_| false).await?;
    daemon.stop()?;
    work.node.kubelet.stop().await;
    work.node.api.shutdown().await;
    Ok(Soak {
        what: format!(
            "watches, {} events after {EVERY} of warm-up (presence polled every {POLL_MS} ms, a \
             device flapping each event, the configuration replaced every 2nd, the API \
             server's watches dropped every 10th)",
            args.watch_events
        ),
        unit: "events",
        samples,
        new_series,
        per_second,
    })
}

struct Watches {
    node: Node,
    /// Events so far.
    event: u64,
    /// Configuration reloads applied so far, as the daemon counts them.
    applied: u64,
}

impl Workload for Watches {
    async fn step(&mut self) -> anyhow::Result<u64> {
        self.event += 1;
        let before = self.slices();
        self.node.set_present(FLAKY, self.event.is_multiple_of(2))?;
        self.wait("the flapping device to be published", |w| {
            Ok(w.slices() != before)
        })
        .await?;
        if self.event.is_multiple_of(2) {
            self.replace_config()?;
            let want = self.applied + 1;
            self.wait("the configuration to be reloaded", |w| {
                Ok(w.reloads_applied()? >= want)
            })
            .await?;
            self.applied = want;
        }
        if self.event.is_multiple_of(10) {
            self.node.api.drop_watches();
        }
        Ok(1)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.node.path().join("daemon.log")).unwrap_or_default()
    }
}

impl Watches {
    /// The driver's ResourceSlices as the API server holds them.
    fn slices(&self) -> String {
        serde_json::to_string(&self.node.api.objects(Resource::ResourceSlices)).unwrap_or_default()
    }

    /// Replaces the configuration file (written beside it, renamed over it, as a ConfigMap
    /// volume does), alternating the presence poll interval.
    fn replace_config(&self) -> anyhow::Result<()> {
        let path = self.node.path().join("kubedev.yaml");
        let text = std::fs::read_to_string(&path)?;
        let (from, to) = if text.contains(&format!("pollIntervalMs: {POLL_MS}\n")) {
            (POLL_MS, POLL_MS + 1)
        } else {
            (POLL_MS + 1, POLL_MS)
        };
        let next = text.replace(
            &format!("pollIntervalMs: {from}\n"),
            &format!("pollIntervalMs: {to}\n"),
        );
        let tmp = self.node.path().join(".kubedev.yaml.new");
        std::fs::write(&tmp, next)?;
        std::fs::rename(&tmp, &path).context("replacing the configuration")
    }

    /// Configuration reloads the daemon applied, from its metrics.
    fn reloads_applied(&self) -> anyhow::Result<u64> {
        let body = super::metrics(self.node.metrics_port)?;
        Ok(body
            .lines()
            .filter(|l| l.starts_with("kubedev_config_reloads_total") && l.contains("applied"))
            .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
            .sum::<f64>() as u64)
    }

    /// Waits until `done` holds, or fails naming `what`.
    async fn wait(
        &self,
        what: &str,
        done: impl Fn(&Watches) -> anyhow::Result<bool>,
    ) -> anyhow::Result<()> {
        let started = Instant::now();
        while !done(self)? {
            if started.elapsed() > WAIT {
                bail!("event {}: waited {WAIT:?} for {what}", self.event);
            }
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
        Ok(())
    }
}
