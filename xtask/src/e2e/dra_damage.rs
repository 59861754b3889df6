//! The DRA damage rounds: every prepared claim is reserved for a pod, the daemon is killed, and
//! while it is down the checkpoint is damaged at random (cut short, garbage, deleted, or left
//! alone), specs of prepared claims are damaged at random (cut short, garbage, deleted, a
//! directory or a link in their place) and sometimes a pod is deleted (its claim no longer
//! reserved). As soon as the restarted daemon registers, every claim whose pod still exists has
//! exactly the spec it had before the damage.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, ensure};
use kubedev_testkit::apiserver::Resource;
use serde_json::json;

use super::dra_rounds::{DraCrash, Want, cdi_files, check_cdi, converge};
use super::{Daemon, Record, WAIT, start};

/// What a planted link points at, and the file's content that must stay as it is.
const PLANTED_TARGET_TEXT: &str = "a file a planted link points at";

/// How one damage round damages a file kubedev owns.
#[derive(Debug, Clone, Copy)]
enum Damage {
    Truncate(u64),
    Garbage,
    Delete,
    Directory,
    Symlink,
}

impl Damage {
    fn draw(rng: &mut fastrand::Rng, len: u64) -> Damage {
        match rng.u8(..5) {
            0 => Damage::Truncate(rng.u64(..len.max(1))),
            1 => Damage::Garbage,
            2 => Damage::Delete,
            3 => Damage::Directory,
            _ => Damage::Symlink,
        }
    }

    fn apply(self, path: &Path, elsewhere: &Path) -> anyhow::Result<()> {
        match self {
            Damage::Truncate(n) => std::fs::OpenOptions::new()
                .write(true)
                .open(path)?
                .set_len(n)?,
            Damage::Garbage => std::fs::write(path, [0xa5u8; 777])?,
            Damage::Delete => std::fs::remove_file(path)?,
            Damage::Directory => {
                std::fs::remove_file(path)?;
                std::fs::create_dir(path)?;
            }
            Damage::Symlink => {
                std::fs::remove_file(path)?;
                std::os::unix::fs::symlink(elsewhere, path)?;
            }
        }
        Ok(())
    }
}

/// The random choices of one damage round, all drawn before it acts.
struct DamagePlan {
    /// The claims prepared before the round, by index.
    prepared: Vec<usize>,
    /// What happens to the checkpoint.
    checkpoint: Option<Damage>,
    /// What happens to the spec of each prepared claim (in `prepared`'s order).
    specs: Vec<Option<Damage>>,
    /// The claim whose pod is deleted.
    pod_gone: Option<usize>,
}

impl DraCrash<'_> {
    /// Sets or clears the consumers of claim `i`, as the scheduler and the claim controller do.
    pub(super) fn reserve(&self, i: usize, reserved: bool) -> anyhow::Result<()> {
        let c = &self.claims[i];
        let mut claim = self
            .api
            .get(Resource::ResourceClaims, Some(&c.namespace), &c.name)
            .with_context(|| format!("claim {} is gone", c.name))?;
        claim["status"]["reservedFor"] = if reserved {
            json!([{"resource": "pods", "name": format!("pod-{}", c.name), "uid": format!("pod-{}", c.uid)}])
        } else {
            json!([])
        };
        self.api.put_raw(Resource::ResourceClaims, claim)?;
        Ok(())
    }

    /// One damage round (see the module docs): returns the running daemon and adds a line that
    /// tells what was damaged.
    pub(super) async fn damage_round(
        &mut self,
        rng: &mut fastrand::Rng,
        daemon: Daemon,
        rec: &mut Record,
    ) -> anyhow::Result<Daemon> {
        // Every choice first, so a replay makes the same ones.
        let plan = self.plan_damage(rng);
        let specs = self.prepared_specs(&plan.prepared)?;
        let before = self.kubelet.registrations();
        drop(daemon);
        ensure!(
            plan.prepared.is_empty() || self.checkpoint.exists(),
            "claims are prepared but there is no checkpoint at {}",
            self.checkpoint.display()
        );
        let elsewhere = self.cdi.parent().unwrap_or(&self.cdi).join("not-a-spec");
        std::fs::write(&elsewhere, PLANTED_TARGET_TEXT)?;
        self.damage(&plan, &specs, &elsewhere)?;
        rec.rounds.push(format!(
            "damage: checkpoint {:?}, specs {:?}, pod of claim {:?} deleted",
            plan.checkpoint,
            plan.prepared.iter().zip(&plan.specs).collect::<Vec<_>>(),
            plan.pod_gone
        ));

        let daemon = start(self.bin, self.config)?;
        ensure!(
            self.kubelet
                .wait_until(WAIT, |k| k.registrations() > before)
                .await,
            "the daemon did not register after the damage"
        );
        self.check_specs_restored(&specs, plan.pod_gone, &elsewhere)?;
        let wanted = self.wanted();
        converge(&self.kubelet, &wanted, &self.reference).await?;
        check_cdi(&self.cdi, &wanted)?;
        Ok(daemon)
    }

    /// Draws what a damage round does to the checkpoint, to each prepared claim's spec, and
    /// which pod it deletes.
    fn plan_damage(&self, rng: &mut fastrand::Rng) -> DamagePlan {
        let checkpoint_len = std::fs::metadata(&self.checkpoint)
            .map(|m| m.len())
            .unwrap_or(0);
        let checkpoint = match rng.u8(..4) {
            0 => None,
            _ => Some(Damage::draw(rng, checkpoint_len)),
        };
        let prepared: Vec<usize> = (0..self.claims.len())
            .filter(|&i| self.want[i] == Want::Prepared)
            .collect();
        let mut specs: Vec<Option<Damage>> = prepared
            .iter()
            .map(|_| rng.bool().then(|| Damage::draw(rng, 400)))
            .collect();
        // A deleted checkpoint with every spec deleted too leaves a node no trace of what was
        // prepared: kubedev asks the API server only when something says a record was lost
        // (a first start looks the same and must not prepare claims the kubelet has not asked
        // for). Such a round keeps one spec.
        if matches!(checkpoint, Some(Damage::Delete))
            && !specs.is_empty()
            && specs.iter().all(|d| matches!(d, Some(Damage::Delete)))
            && let Some(last) = specs.last_mut()
        {
            *last = None;
        }
        let pod_gone = (!prepared.is_empty() && rng.u8(..3) == 0)
            .then(|| prepared[rng.usize(..prepared.len())]);
        DamagePlan {
            prepared,
            checkpoint,
            specs,
            pod_gone,
        }
    }

    /// The CDI spec file of each prepared claim and its content, by claim index.
    fn prepared_specs(
        &self,
        prepared: &[usize],
    ) -> anyhow::Result<BTreeMap<usize, (PathBuf, Vec<u8>)>> {
        prepared
            .iter()
            .map(|&i| {
                let uid = &self.claims[i].uid;
                let path = cdi_files(&self.cdi)?
                    .0
                    .into_iter()
                    .find(|f| f.contains(uid.as_str()))
                    .map(|f| self.cdi.join(f))
                    .with_context(|| format!("prepared claim {uid} has no CDI spec"))?;
                let bytes = std::fs::read(&path)?;
                Ok((i, (path, bytes)))
            })
            .collect()
    }

    /// Damages the checkpoint and the specs as `plan` says (links pointing at `elsewhere`), and
    /// deletes the pod it names.
    fn damage(
        &mut self,
        plan: &DamagePlan,
        specs: &BTreeMap<usize, (PathBuf, Vec<u8>)>,
        elsewhere: &Path,
    ) -> anyhow::Result<()> {
        if let Some(d) = plan.checkpoint
            && self.checkpoint.exists()
        {
            d.apply(&self.checkpoint, elsewhere)
                .with_context(|| format!("damaging the checkpoint with {d:?}"))?;
        }
        for (&i, d) in plan.prepared.iter().zip(&plan.specs) {
            if let Some(d) = d {
                d.apply(&specs[&i].0, elsewhere)
                    .with_context(|| format!("damaging a CDI spec with {d:?}"))?;
            }
        }
        if let Some(i) = plan.pod_gone {
            self.reserve(i, false)?;
            self.want[i] = Want::Unprepared;
        }
        Ok(())
    }

    /// The pods that still run see their specs as they were, before any kubelet call, and no
    /// planted link was written through.
    fn check_specs_restored(
        &self,
        specs: &BTreeMap<usize, (PathBuf, Vec<u8>)>,
        pod_gone: Option<usize>,
        elsewhere: &Path,
    ) -> anyhow::Result<()> {
        for (&i, (path, bytes)) in specs {
            if Some(i) == pod_gone {
                continue;
            }
            let now = std::fs::symlink_metadata(path)
                .ok()
                .filter(|m| m.is_file())
                .and_then(|_| std::fs::read(path).ok());
            ensure!(
                now.as_deref() == Some(bytes.as_slice()),
                "after the damage, claim {} (its pod still runs) has no correct CDI spec at {}",
                self.claims[i].uid,
                path.display()
            );
        }
        ensure!(
            std::fs::read_to_string(elsewhere)? == PLANTED_TARGET_TEXT,
            "a planted link was written through"
        );
        Ok(())
    }
}
