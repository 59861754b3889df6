//! The device-plugin scenario: registration, capacity, Allocate edits, a kubelet restart, then
//! crash rounds in which the daemon is killed while Allocate calls run or during a fresh start.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use kubedev_testkit::kubelet::KubeletEmulator;

use super::{
    Backend, DP_CRASH_ROUNDS, DP_KILL_WINDOW, DP_START_KILL_WINDOW, NODE, Record, WAIT, draw_delay,
    start,
};

/// The random choices of one device-plugin crash round, all drawn before it acts.
#[derive(Debug)]
struct DpPlan {
    /// Devices (by index into the advertised IDs) of the concurrent Allocate calls.
    allocations: Vec<usize>,
    kill_after: Duration,
    /// Kill the restarted daemon once more this long after its start.
    start_kill: Option<Duration>,
}

fn plan_dp_round(rng: &mut fastrand::Rng, devices: usize) -> DpPlan {
    let calls = rng.usize(1..=3);
    DpPlan {
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
    std::fs::create_dir_all(&dp)?;
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
    let mut kubelet = KubeletEmulator::start(&dp).await?;
    let mut daemon = start(bin, &config)?;
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

    // Crash rounds: kill -9 while Allocate calls run, sometimes again during the start-up.
    let ids: Arc<Vec<String>> = Arc::new(st.devices.keys().cloned().collect());
    let kubelet = Arc::new(kubelet);
    for _ in 0..DP_CRASH_ROUNDS {
        let plan = plan_dp_round(rng, ids.len());
        let sent_at = Instant::now();
        let handles: Vec<_> = plan
            .allocations
            .iter()
            .map(|&i| {
                let (kubelet, ids, resource) = (kubelet.clone(), ids.clone(), b.resource);
                tokio::spawn(async move {
                    let r =
                        tokio::time::timeout(WAIT, kubelet.allocate(resource, &[ids[i].as_str()]))
                            .await;
                    (r, sent_at.elapsed())
                })
            })
            .collect();
        let killed_at = daemon.kill_after(sent_at, plan.kill_after).await? - sent_at;
        let (mut answered, mut cut, mut unsent) = (Vec::new(), 0, 0);
        let mut failure = None;
        for h in handles {
            let (r, took) = h.await.context("an Allocate call panicked")?;
            match r {
                Err(_) => {
                    failure.get_or_insert(anyhow::anyhow!("an Allocate call hung after kill -9"));
                }
                Ok(Ok(a)) => {
                    if !a.devices.iter().any(|d| d.host_path.starts_with(b.node)) {
                        failure.get_or_insert(anyhow::anyhow!(
                            "Allocate before kill -9 lacks {}: {a:?}",
                            b.node
                        ));
                    }
                    answered.push(took);
                }
                Ok(Err(s))
                    if s.message().starts_with("dialing ")
                        || s.message().contains("is not registered") =>
                {
                    unsent += 1
                }
                Ok(Err(_)) => cut += 1,
            }
        }
        rec.kills += 1;
        if cut > 0 {
            rec.in_flight += 1;
        }
        let mut line = format!(
            "{} Allocate calls, kill -9 at {killed_at:.1?}: {} answered after {answered:.1?}, {cut} cut off, {unsent} not sent",
            plan.allocations.len(),
            answered.len()
        );
        if let Some(e) = failure {
            rec.rounds.push(line);
            return Err(e);
        }
        let mut since = kubelet.uptime();
        daemon = start(bin, &config)?;
        if let Some(delay) = plan.start_kill {
            let spawned = Instant::now();
            let at = daemon.kill_after(spawned, delay).await? - spawned;
            let registered = kubelet
                .registrations()
                .iter()
                .find(|r| r.resource == b.resource && r.rejected.is_none() && r.at >= since)
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
            since = kubelet.uptime();
            daemon = start(bin, &config)?;
        }
        rec.rounds.push(line);
        check_reregistered(&kubelet, b, since, &ids).await?;
        daemon.check_alive()?;
    }
    rec.ok(format!(
        "{} random kills ({} in flight, {} in start-up), re-registered, same devices, Allocate answers",
        rec.kills, rec.in_flight, rec.start_up
    ));
    drop(daemon);
    if let Ok(k) = Arc::try_unwrap(kubelet) {
        k.stop().await;
    }
    Ok(())
}
