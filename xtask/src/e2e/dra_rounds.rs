//! The DRA crash and damage rounds: what the kubelet wants for each claim, a round's calls and
//! kill points drawn before it acts, the calls sent as the kubelet sends them, their answers
//! checked against each claim's first clean prepare, every claim driven to what the kubelet
//! wants as its retries do, and the CDI directory checked. The damage rounds are in
//! `dra_damage`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use kubedev_testkit::apiserver::ApiServer;
use kubedev_testkit::kubelet::{ClaimId, DraKubelet, PreparedDeviceAnswer};

use super::{
    DRA_KILL_WINDOW, DRA_START_KILL_WINDOW, DRIVER, Daemon, RETRY, Record, WAIT, draw_delay, start,
};

/// What the kubelet wants for a claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Want {
    Prepared,
    Unprepared,
}

impl std::fmt::Display for Want {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Want::Prepared => "prepare",
            Want::Unprepared => "unprepare",
        })
    }
}

/// One NodePrepareResources or NodeUnprepareResources call: the claims by index.
#[derive(Debug, Clone)]
struct Call {
    op: Want,
    claims: Vec<usize>,
}

/// The random choices of one DRA crash round, all drawn before it acts.
#[derive(Debug)]
pub(super) struct RoundPlan {
    calls: Vec<Call>,
    kill_after: Duration,
    /// Kill the restarted daemon once more this long after its start.
    start_kill: Option<Duration>,
}

pub(super) fn plan_round(rng: &mut fastrand::Rng, claims: usize) -> RoundPlan {
    let ops: Vec<Want> = (0..claims)
        .map(|_| {
            if rng.bool() {
                Want::Prepared
            } else {
                Want::Unprepared
            }
        })
        .collect();
    let mut calls = Vec::new();
    if rng.bool() {
        // One pod with all the claims: one call per direction.
        for op in [Want::Prepared, Want::Unprepared] {
            let of_op: Vec<usize> = (0..claims).filter(|&i| ops[i] == op).collect();
            if !of_op.is_empty() {
                calls.push(Call { op, claims: of_op });
            }
        }
    } else {
        // One pod per claim.
        calls.extend(ops.iter().enumerate().map(|(i, &op)| Call {
            op,
            claims: vec![i],
        }));
    }
    if rng.u8(..4) == 0 {
        // The kubelet retries a call that is still running (its own timeout fired).
        let dup = calls[rng.usize(..calls.len())].clone();
        calls.push(dup);
    }
    rng.shuffle(&mut calls);
    let kill_after = draw_delay(rng, DRA_KILL_WINDOW);
    let start_kill = (rng.u8(..3) == 0).then(|| draw_delay(rng, DRA_START_KILL_WINDOW));
    RoundPlan {
        calls,
        kill_after,
        start_kill,
    }
}

/// Per claim UID: the prepared devices (prepare), nothing (unprepare), or the daemon's error.
type Answers = BTreeMap<String, Result<Option<Vec<PreparedDeviceAnswer>>, String>>;

/// Why a call got no answer: `sent` is false when it never reached the daemon (dialing failed,
/// or the kubelet had no registration).
struct NoAnswer {
    sent: bool,
    message: String,
}

async fn send(kubelet: &DraKubelet, op: Want, ids: &[ClaimId]) -> Result<Answers, NoAnswer> {
    let result = match op {
        Want::Prepared => kubelet.prepare(DRIVER, ids).await.map(|a| {
            a.into_iter()
                .map(|(uid, r)| (uid, r.map(Some)))
                .collect::<Answers>()
        }),
        Want::Unprepared => kubelet.unprepare(DRIVER, ids).await.map(|a| {
            a.into_iter()
                .map(|(uid, r)| (uid, r.map(|()| None)))
                .collect()
        }),
    };
    result.map_err(|s| {
        let message = s.message().to_string();
        NoAnswer {
            // The emulated kubelet's own errors before it reaches the daemon.
            sent: !(message.starts_with("dialing ") || message.contains("is not registered")),
            message,
        }
    })
}

/// Checks a daemon's answer to a call: every claim answered, without error, and prepared
/// claims with the reference devices.
fn check_answers(
    call: &Call,
    claims: &[ClaimId],
    reference: &BTreeMap<String, Vec<PreparedDeviceAnswer>>,
    answers: &Answers,
) -> anyhow::Result<()> {
    for &i in &call.claims {
        let uid = &claims[i].uid;
        match answers.get(uid) {
            None => bail!("{} answered nothing for claim {uid}", call.op),
            Some(Err(e)) => bail!("{} of claim {uid} failed: {e}", call.op),
            Some(Ok(Some(devs))) => ensure!(
                Some(devs) == reference.get(uid),
                "prepare of claim {uid} answered {devs:?}, not {:?} as before",
                reference.get(uid)
            ),
            Some(Ok(None)) => {}
        }
    }
    Ok(())
}

/// Drives every claim to what the kubelet wants, retrying as the kubelet does, and checks
/// the answers; fails after [`WAIT`].
pub(super) async fn converge(
    kubelet: &DraKubelet,
    want: &[(ClaimId, Want)],
    reference: &BTreeMap<String, Vec<PreparedDeviceAnswer>>,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + WAIT;
    let claims: Vec<ClaimId> = want.iter().map(|(c, _)| c.clone()).collect();
    for (i, (claim, op)) in want.iter().enumerate() {
        let call = Call {
            op: *op,
            claims: vec![i],
        };
        loop {
            let last = match send(kubelet, *op, std::slice::from_ref(claim)).await {
                Ok(answers) => {
                    // A wrong answer fails at once; an error answer is retried.
                    if let Some(Ok(_)) = answers.get(&claim.uid) {
                        check_answers(&call, &claims, reference, &answers)?;
                        break;
                    }
                    format!("{answers:?}")
                }
                Err(e) => e.message,
            };
            ensure!(
                Instant::now() < deadline,
                "{op} of claim {} did not succeed within {WAIT:?}; last: {last}",
                claim.uid
            );
            tokio::time::sleep(RETRY).await;
        }
    }
    Ok(())
}

/// The CDI spec files (`*.json`, `*.yaml`) and the temporary files of interrupted writes
/// (`.<name>.tmp-*`) in `dir`, by name.
pub(super) fn cdi_files(dir: &Path) -> anyhow::Result<(Vec<String>, Vec<String>)> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Default::default()),
        Err(e) => return Err(e).with_context(|| format!("reading {}", dir.display())),
    };
    let (mut specs, mut temps) = (Vec::new(), Vec::new());
    for e in entries {
        let name = e?.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') {
            temps.push(name);
        } else if name.ends_with(".json") || name.ends_with(".yaml") {
            specs.push(name);
        }
    }
    specs.sort();
    temps.sort();
    Ok((specs, temps))
}

/// The CDI directory holds one spec file per prepared claim and nothing else.
pub(super) fn check_cdi(dir: &Path, want: &[(ClaimId, Want)]) -> anyhow::Result<()> {
    let (specs, _) = cdi_files(dir)?;
    for (claim, op) in want {
        let n = specs.iter().filter(|f| f.contains(&claim.uid)).count();
        let expected = usize::from(*op == Want::Prepared);
        ensure!(
            n == expected,
            "claim {} ({op}d): {n} CDI spec files, expected {expected}; the directory holds {specs:?}",
            claim.uid
        );
    }
    let prepared = want.iter().filter(|(_, op)| *op == Want::Prepared).count();
    ensure!(
        specs.len() == prepared,
        "CDI spec files no prepared claim owns: {specs:?}"
    );
    Ok(())
}

/// Everything a DRA crash round needs.
pub(super) struct DraCrash<'a> {
    pub(super) bin: &'a Path,
    pub(super) config: &'a Path,
    pub(super) api: &'a ApiServer,
    pub(super) checkpoint: PathBuf,
    pub(super) cdi: PathBuf,
    pub(super) kubelet: Arc<DraKubelet>,
    pub(super) claims: Arc<Vec<ClaimId>>,
    pub(super) reference: Arc<BTreeMap<String, Vec<PreparedDeviceAnswer>>>,
    pub(super) want: Vec<Want>,
}

impl DraCrash<'_> {
    pub(super) fn wanted(&self) -> Vec<(ClaimId, Want)> {
        self.claims
            .iter()
            .cloned()
            .zip(self.want.iter().copied())
            .collect()
    }

    /// One round: concurrent calls, `kill -9` after the planned delay, a restart (killed once
    /// more during start-up if planned), then convergence. Returns the running daemon; counts
    /// the kills in `rec` and adds a line that tells what they hit.
    pub(super) async fn round(
        &mut self,
        plan: &RoundPlan,
        daemon: Daemon,
        rec: &mut Record,
    ) -> anyhow::Result<Daemon> {
        let sent_at = Instant::now();
        let handles: Vec<_> = plan
            .calls
            .iter()
            .map(|c| {
                let kubelet = self.kubelet.clone();
                let ids: Vec<ClaimId> = c.claims.iter().map(|&i| self.claims[i].clone()).collect();
                let op = c.op;
                tokio::spawn(async move {
                    let r = tokio::time::timeout(WAIT, send(&kubelet, op, &ids)).await;
                    (r, sent_at.elapsed())
                })
            })
            .collect();
        let killed_at = daemon.kill_after(sent_at, plan.kill_after).await? - sent_at;
        let (mut answered, mut cut, mut unsent) = (Vec::new(), 0, 0);
        let mut failure = None;
        for (h, call) in handles.into_iter().zip(&plan.calls) {
            let (r, took) = h.await.context("a kubelet call panicked")?;
            match r {
                Err(_) => {
                    failure.get_or_insert(anyhow::anyhow!("a {} call hung after kill -9", call.op));
                }
                Ok(Ok(answers)) => {
                    if let Err(e) = check_answers(call, &self.claims, &self.reference, &answers) {
                        failure.get_or_insert(e.context("answered before kill -9"));
                    }
                    answered.push(took);
                }
                Ok(Err(NoAnswer { sent: true, .. })) => cut += 1,
                Ok(Err(NoAnswer { sent: false, .. })) => unsent += 1,
            }
        }
        for call in &plan.calls {
            for &i in &call.claims {
                self.want[i] = call.op;
            }
        }
        rec.kills += 1;
        if cut > 0 {
            rec.in_flight += 1;
        }
        let mut line = format!(
            "{} calls {:?}, kill -9 at {killed_at:.1?}: {} answered after {answered:.1?}, {cut} cut off, {unsent} not sent",
            plan.calls.len(),
            plan.calls
                .iter()
                .map(|c| format!("{} {:?}", c.op, c.claims))
                .collect::<Vec<_>>(),
            answered.len(),
        );
        if let Some(e) = failure {
            rec.rounds.push(line);
            return Err(e);
        }

        let wanted = self.wanted();
        let mut daemon = start(self.bin, self.config)?;
        let spawned = Instant::now();
        let retry = {
            let (kubelet, wanted, reference) =
                (self.kubelet.clone(), wanted.clone(), self.reference.clone());
            tokio::spawn(async move { converge(&kubelet, &wanted, &reference).await })
        };
        if let Some(delay) = plan.start_kill {
            let at = daemon.kill_after(spawned, delay).await? - spawned;
            let converged = retry.is_finished();
            rec.kills += 1;
            rec.start_up += 1;
            line.push_str(&format!(
                "; start-up kill -9 at {at:.1?} ({})",
                if converged {
                    "kubelet already converged"
                } else {
                    "kubelet still retrying"
                }
            ));
            daemon = start(self.bin, self.config)?;
        }
        rec.rounds.push(line);
        retry.await.context("the kubelet's retries panicked")??;
        // Once more against the daemon that runs now: what held must still hold.
        converge(&self.kubelet, &wanted, &self.reference).await?;
        daemon.check_alive()?;
        check_cdi(&self.cdi, &wanted)?;
        Ok(daemon)
    }
}
