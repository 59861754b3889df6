//! The device-plugin scenario: registration, capacity, Allocate edits, a kubelet restart, then
//! crash rounds in which the daemon is killed while Allocate calls run or during a fresh start.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use kubedev_testkit::kubelet::KubeletEmulator;

use kubedev_testkit::kubelet::ResourceState;

use super::{
    Backend, DP_CRASH_ROUNDS, DP_KILL_WINDOW, DP_START_KILL_WINDOW, Daemon, NODE, Record, WAIT,
    draw_delay, start,
};

/// The random choices of one device-plugin crash round, all drawn before it acts.
#[derive(Debug)]
struct CrashRoundPlan {
    /// Devices (by index into the advertised IDs) of the concurrent Allocate calls.
    allocations: Vec<usize>,
    kill_after: Duration,
    /// Kill the restarted daemon once more this long after its start.
    start_kill: Option<Duration>,
}

fn plan_crash_round(rng: &mut fastrand::Rng, devices: usize) -> CrashRoundPlan {
    let calls = rng.usize(1..=3);
    CrashRoundPlan {
        allocations: (0..calls).map(|_| rng.usize(..devices)).collect(),
        kill_after: draw_delay(rng, DP_KILL_WINDOW),
        start_kill: rng.bool().then(|| draw_delay(rng, DP_START_KILL_WINDOW)),
    }
}

/// Waits until `resource` was registered after `since` with the devices `ids`, and Allocate
/// answers with the backend's device node.
async fn check_reregistered(
    kubelet: &KubeletEmulator,
    b: &Backend,
    since: Duration,
    ids: &[String],
) -> anyhow::Result<()> {
    ensure!(
        kubelet.wait_registered_since(b.resource, since, WAIT).await,
        "not registered again after kill -9"
    );
    let st = kubelet
        .wait_for(b.resource, WAIT, |r| {
            r.connected && r.devices.keys().eq(ids.iter())
        })
        .await
        .with_context(|| {
            format!(
                "the restarted daemon does not advertise {ids:?}: {:?}",
                kubelet.resource(b.resource)
            )
        })?;
    let id = st.devices.keys().next().context("no device")?;
    let a = kubelet.allocate(b.resource, &[id]).await?;
    ensure!(
        a.devices.iter().any(|d| d.host_path.starts_with(b.node)),
        "Allocate after kill -9 lacks {}: {a:?}",
        b.node
    );
    Ok(())
}

/// One device-plugin scenario (see the module docs).
pub(super) async fn dp_scenario(
    bin: &Path,
    b: &Backend,
    dir: &Path,
    rng: &mut fastrand::Rng,
    rec: &mut Record,
) -> anyhow::Result<()> {
    let root = dir.join(format!("dp-{}", b.name));
    let dp = root.join("device-plugins");
    let config = write_config(b, &root, &dp)?;
    let mut kubelet = KubeletEmulator::start(&dp).await?;
    let mut daemon = start(bin, &config)?;
    let registered = register_allocate_and_restart(&mut kubelet, b, rec).await?;

    // Crash rounds: kill -9 while Allocate calls run, sometimes again during the start-up.
    let crash = CrashRounds {
        bin,
        config: &config,
        backend: b,
        ids: Arc::new(registered.devices.keys().cloned().collect()),
        kubelet: Arc::new(kubelet),
    };
    for _ in 0..DP_CRASH_ROUNDS {
        let plan = plan_crash_round(rng, crash.ids.len());
        daemon = crash.round(&plan, daemon, rec).await?;
    }
    rec.ok(format!(
        "{} random kills ({} in flight, {} in start-up), re-registered, same devices, Allocate answers",
        rec.kills, rec.in_flight, rec.start_up
    ));
    drop(daemon);
    if let Ok(k) = Arc::try_unwrap(crash.kubelet) {
        k.stop().await;
    }
    Ok(())
}

/// Creates the scenario's directories and writes its configuration; returns the
/// configuration file.
fn write_config(b: &Backend, root: &Path, dp: &Path) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(dp)?;
    std::fs::create_dir_all(b.host.join("dev"))?;
    let config = root.join("kubedev.yaml");
    std::fs::write(
        &config,
        format!(
            "nodeName: {NODE}\nhostRoot: {host}\nstateDir: {r}/state\ndevicePlugin:\n  directory: {dp}\n  resources:\n    - name: {res}\nbackends:\n{}",
            b.config,
            host = b.host.display(),
            r = root.display(),
            dp = dp.display(),
            res = b.resource
        ),
    )?;
    Ok(config)
}

/// The daemon registers, Allocate answers with the backend's device node, and after a kubelet
/// restart it registers again with the same devices; returns the resource as first registered.
async fn register_allocate_and_restart(
    kubelet: &mut KubeletEmulator,
    b: &Backend,
    rec: &mut Record,
) -> anyhow::Result<ResourceState> {
    let st = kubelet
        .wait_for(b.resource, WAIT, |r| r.connected && r.capacity > 0)
        .await
        .context("not registered")?;
    rec.ok("registered");
    let id = st.devices.keys().next().context("no device")?.clone();
    let a = kubelet.allocate(b.resource, &[&id]).await?;
    ensure!(
        a.devices.iter().any(|d| d.host_path.starts_with(b.node)),
        "Allocate lacks {}: {a:?}",
        b.node
    );
    rec.ok("allocated, edits checked");
    kubelet.restart().await?;
    let again = kubelet
        .wait_for(b.resource, WAIT, |r| {
            r.connected && r.capacity == st.capacity
        })
        .await
        .context("not re-registered after the kubelet restart")?;
    ensure!(
        again.devices.keys().eq(st.devices.keys()),
        "other devices after the restart"
    );
    rec.ok("kubelet restart, re-registered");
    Ok(st)
}

/// How the Allocate calls of one crash round ended.
#[derive(Default)]
struct AllocateOutcomes {
    /// How long each answered call took.
    answered: Vec<Duration>,
    /// Calls the kill cut off.
    cut: usize,
    /// Calls that never reached the daemon.
    unsent: usize,
    /// The first call that hung or answered without the backend's device node.
    failure: Option<anyhow::Error>,
}

/// Everything a device-plugin crash round needs.
struct CrashRounds<'a> {
    bin: &'a Path,
    config: &'a Path,
    backend: &'a Backend,
    /// The device IDs the daemon advertised first.
    ids: Arc<Vec<String>>,
    kubelet: Arc<KubeletEmulator>,
}

impl CrashRounds<'_> {
    /// One round: concurrent Allocate calls, `kill -9` after the planned delay, a restart
    /// (killed once more during start-up if planned), then the same devices registered again.
    /// Returns the running daemon; counts the kills in `rec` and adds a line that tells what
    /// they hit.
    async fn round(
        &self,
        plan: &CrashRoundPlan,
        daemon: Daemon,
        rec: &mut Record,
    ) -> anyhow::Result<Daemon> {
        let (killed_at, outcomes) = self.allocate_and_kill(plan, daemon).await?;
        rec.kills += 1;
        if outcomes.cut > 0 {
            rec.in_flight += 1;
        }
        let mut line = format!(
            "{} Allocate calls, kill -9 at {killed_at:.1?}: {} answered after {:.1?}, {} cut off, {} not sent",
            plan.allocations.len(),
            outcomes.answered.len(),
            outcomes.answered,
            outcomes.cut,
            outcomes.unsent
        );
        if let Some(e) = outcomes.failure {
            rec.rounds.push(line);
            return Err(e);
        }
        let (daemon, since) = self.restart(plan, &mut line, rec).await?;
        rec.rounds.push(line);
        self.check_reregistered(since, daemon).await
    }

    /// Sends the round's concurrent Allocate calls and kills the daemon after the planned
    /// delay; returns when the kill came (after the calls were sent) and how each call ended.
    async fn allocate_and_kill(
        &self,
        plan: &CrashRoundPlan,
        daemon: Daemon,
    ) -> anyhow::Result<(Duration, AllocateOutcomes)> {
        let sent_at = Instant::now();
        let handles: Vec<_> = plan
            .allocations
            .iter()
            .map(|&i| {
                let (kubelet, ids, resource) = (
                    self.kubelet.clone(),
                    self.ids.clone(),
                    self.backend.resource,
                );
                tokio::spawn(async move {
                    let r =
                        tokio::time::timeout(WAIT, kubelet.allocate(resource, &[ids[i].as_str()]))
                            .await;
                    (r, sent_at.elapsed())
                })
            })
            .collect();
        let killed_at = daemon.kill_after(sent_at, plan.kill_after).await? - sent_at;
        let node = self.backend.node;
        let mut outcomes = AllocateOutcomes::default();
        for h in handles {
            let (r, took) = h.await.context("an Allocate call panicked")?;
            match r {
                Err(_) => {
                    outcomes
                        .failure
                        .get_or_insert(anyhow::anyhow!("an Allocate call hung after kill -9"));
                }
                Ok(Ok(a)) => {
                    if !a.devices.iter().any(|d| d.host_path.starts_with(node)) {
                        outcomes.failure.get_or_insert(anyhow::anyhow!(
                            "Allocate before kill -9 lacks {node}: {a:?}"
                        ));
                    }
                    outcomes.answered.push(took);
                }
                Ok(Err(s))
                    if s.message().starts_with("dialing ")
                        || s.message().contains("is not registered") =>
                {
                    outcomes.unsent += 1
                }
                Ok(Err(_)) => outcomes.cut += 1,
            }
        }
        Ok((killed_at, outcomes))
    }

    /// Starts the daemon again, and kills it once more during its start-up when the plan says
    /// so (telling in `line` whether it had registered); returns the running daemon and the
    /// kubelet's uptime at its start.
    async fn restart(
        &self,
        plan: &CrashRoundPlan,
        line: &mut String,
        rec: &mut Record,
    ) -> anyhow::Result<(Daemon, Duration)> {
        let mut since = self.kubelet.uptime();
        let mut daemon = start(self.bin, self.config)?;
        if let Some(delay) = plan.start_kill {
            let spawned = Instant::now();
            let at = daemon.kill_after(spawned, delay).await? - spawned;
            let registered = self
                .kubelet
                .registrations()
                .iter()
                .find(|r| {
                    r.resource == self.backend.resource && r.rejected.is_none() && r.at >= since
                })
                .map(|r| r.at - since);
            rec.kills += 1;
            rec.start_up += 1;
            line.push_str(&format!(
                "; start-up kill -9 at {at:.1?} ({})",
                match registered {
                    Some(t) => format!("it had registered at {t:.1?}"),
                    None => "before it registered".into(),
                }
            ));
            since = self.kubelet.uptime();
            daemon = start(self.bin, self.config)?;
        }
        Ok((daemon, since))
    }

    /// The restarted daemon registered again with the first devices, and is still running.
    async fn check_reregistered(
        &self,
        since: Duration,
        mut daemon: Daemon,
    ) -> anyhow::Result<Daemon> {
        check_reregistered(&self.kubelet, self.backend, since, &self.ids).await?;
        daemon.check_alive()?;
        Ok(daemon)
    }
}
