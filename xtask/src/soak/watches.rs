//! The watches soak: what a long-running daemon sees while no claim comes, compressed in time.
//! The static backend polls its devices' presence every 10 ms (the default is 200 ms), one
//! device goes missing and comes back every event and is republished each time, the
//! configuration file is replaced every second event (alternating the poll interval, so the
//! backend and its watch are rebuilt), and the API server drops every watch every tenth event,
//! as its watch timeouts do. Beside it the usb, vfio and nvidia backends watch a fake machine
//! (`soak/hardware.rs`): each event unplugs and replugs a USB key, removes and restores a VFIO
//! group node, or loses and restores a GPU through the NVML stand-in (probed every 10 ms), in
//! turn, and every 25th an Xid taints a GPU that is healthy by then (every other time or so: it
//! is tainted until its recheck a second later); each change must show in the ResourceSlices
//! (the publisher's request limit is lifted so the soak is not paced by it). 20,000 events are
//! about 120,000 presence polls (6.7 hours at the default interval), 10,000 configuration
//! reloads, 2,000 dropped watches, 6,667 changes of each kind of hardware and some 400 Xids.
//!
//! Memory may grow by at most [`MAX_GROWTH_KIB`] here: a reload that kept 2.2 KiB (the
//! watcher tasks it stopped, before they were reaped) grew it by 440 KiB over CI's 400 events.

use std::path::Path;
use std::time::Instant;

use anyhow::{Context as _, bail};
use kubedev_testkit::apiserver::Resource;

use super::dra::{FLAKY, NODE, Node};
use super::hardware::{Hardware, Part, XID_DEVICE, XID_EVERY};
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
    let hardware = Hardware::new(args.parent_dir())?;
    let node = Node::with_slice_qps(args.parent_dir(), POLL_MS, &hardware.config(), 0).await?;
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
        hardware,
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
    let (removals, xids) = (work.hardware.removals, work.hardware.xids);
    work.node.kubelet.stop().await;
    work.node.api.shutdown().await;
    Ok(Soak {
        what: format!(
            "watches, {} events after {EVERY} of warm-up (presence polled every {POLL_MS} ms, a \
             device flapping each event, the configuration replaced every 2nd, the API \
             server's watches dropped every 10th; in all {} USB replugs, {} VFIO group nodes and \
             {} GPUs lost and back, {} Xids)",
            args.watch_events, removals[0], removals[1], removals[2], xids
        ),
        unit: "events",
        samples,
        new_series,
        per_second,
    })
}

struct Watches {
    node: Node,
    hardware: Hardware,
    /// Events so far.
    event: u64,
    /// Configuration reloads applied so far, as the daemon counts them.
    applied: u64,
}

impl Workload for Watches {
    async fn step(&mut self) -> anyhow::Result<u64> {
        self.event += 1;
        let before = self.slices(NODE);
        self.node.set_present(FLAKY, self.event.is_multiple_of(2))?;
        let part = Part::of_event(self.event);
        let pool = format!("{NODE}-{}", part.backend());
        self.hardware.set(part, false)?;
        self.wait(
            "the flapping device and the part taken away to be published",
            |w| Ok(w.slices(NODE) != before && w.tainted(&pool, part.device()) == Some(true)),
        )
        .await?;
        self.hardware.set(part, true)?;
        self.wait("the part brought back to be published", |w| {
            Ok(w.tainted(&pool, part.device()) == Some(false))
        })
        .await?;
        let nvidia = format!("{NODE}-nvidia");
        if self.event.is_multiple_of(XID_EVERY) && self.tainted(&nvidia, XID_DEVICE) == Some(false)
        {
            self.hardware.xid()?;
            self.wait("the Xid to be published", |w| {
                Ok(w.tainted(&nvidia, XID_DEVICE) == Some(true))
            })
            .await?;
        }
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
    /// The ResourceSlices of pool `pool` as the API server holds them.
    fn slices(&self, pool: &str) -> String {
        let slices: Vec<serde_json::Value> = self
            .node
            .api
            .objects(Resource::ResourceSlices)
            .into_iter()
            .filter(|s| s["spec"]["pool"]["name"] == pool)
            .collect();
        serde_json::to_string(&slices).unwrap_or_default()
    }

    /// Whether device `device` of pool `pool` is published with a taint (`None`: it is not
    /// published).
    fn tainted(&self, pool: &str, device: &str) -> Option<bool> {
        let slices = self.node.api.objects(Resource::ResourceSlices);
        let found = slices
            .iter()
            .filter(|s| s["spec"]["pool"]["name"] == pool)
            .filter_map(|s| s["spec"]["devices"].as_array())
            .flatten()
            .find(|d| d["name"] == device)?;
        Some(found["taints"].as_array().is_some_and(|t| !t.is_empty()))
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
