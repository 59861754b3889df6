//! The DRA scenario: the daemon registers and publishes its ResourceSlices through API-server
//! faults, the allocator allocates several claims, the first is prepared and survives
//! `kill -9`, then the crash and damage rounds (the `dra_rounds` module) and a last
//! unprepare of everything.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use kubedev_testkit::apiserver::{ApiServer, Fault, KubeRelease, Resource, Verb};
use kubedev_testkit::kubelet::{ClaimId, DraKubelet, PreparedDeviceAnswer};
use serde_json::json;

use super::dra_rounds::{DraCrash, Want, cdi_files, check_cdi, converge, plan_round};
use super::{
    Backend, CRASH_CLAIMS, DRA_CRASH_ROUNDS, DRA_DAMAGE_ROUNDS, DRIVER, Daemon, NODE, Record, WAIT,
    start,
};

/// What one DRA scenario runs against: its directory, the API server of the release, the DRA
/// kubelet emulator and the daemon's configuration file. Fields drop in the reverse order of
/// creation.
struct DraEnv {
    config: PathBuf,
    kubelet: Arc<DraKubelet>,
    api: ApiServer,
    root: PathBuf,
}

impl DraEnv {
    /// Creates the scenario's directory and boot id, starts the API server of `release` (its
    /// first slice writes failing) and the DRA kubelet, and writes the configuration for
    /// backend `b`.
    async fn start(b: &Backend, release: KubeRelease, dir: &Path) -> anyhow::Result<DraEnv> {
        let root = dir.join(format!("dra-{}-{release}", b.name));
        std::fs::create_dir_all(&root)?;
        std::fs::create_dir_all(b.host.join("dev"))?;
        std::fs::write(
            root.join("boot_id"),
            "e2e00000-0000-4000-8000-000000000001\n",
        )?;
        // The API server of the release, with its default feature gates.
        let api = ApiServer::builder().kubernetes(release).start().await?;
        api.write_kubeconfig(&root.join("kubeconfig"))?;
        api.put_raw(
            Resource::Nodes,
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}}),
        )?;
        // The first slice writes fail: the publisher must retry until they land.
        api.fail_next(
            Verb::Create,
            Resource::ResourceSlices,
            3,
            Fault::ServiceUnavailable,
        );
        let kubelet = Arc::new(DraKubelet::start(root.join("registry"))?);
        let config = root.join("kubedev.yaml");
        std::fs::write(
            &config,
            format!(
                "nodeName: {NODE}\nhostRoot: {host}\nstateDir: {r}/state\ndevicePlugin:\n  enabled: false\ndra:\n  enabled: true\n  driverName: {DRIVER}\n  kubeconfig: {r}/kubeconfig\n  pluginDir: {r}/plugins\n  registryDir: {r}/registry\n  cdiDir: {r}/cdi\n  bootIdPath: {r}/boot_id\nbackends:\n{}",
                b.config,
                host = b.host.display(),
                r = root.display()
            ),
        )?;
        Ok(DraEnv {
            config,
            kubelet,
            api,
            root,
        })
    }
}

/// One DRA scenario (see the module docs): registration, slices published through API
/// faults, claims allocated, the first claim prepared and surviving `kill -9`, then crash
/// rounds, damage rounds, and everything unprepared.
pub(super) async fn dra_scenario(
    bin: &Path,
    b: &Backend,
    release: KubeRelease,
    dir: &Path,
    rng: &mut fastrand::Rng,
    rec: &mut Record,
) -> anyhow::Result<()> {
    let env = DraEnv::start(b, release, dir).await?;
    let kubelet = &env.kubelet;
    let daemon = start(bin, &env.config)?;
    ensure!(
        kubelet
            .wait_until(WAIT, |k| k.drivers().contains_key(DRIVER))
            .await,
        "the DRA driver did not register: {:?}",
        kubelet.rejected()
    );
    rec.ok("registered");

    let slices = published_slices(&env.api).await?;
    rec.ok("published through API faults");

    let claims = allocate_claims(&env.api, slices)?;
    let n = claims.len();
    rec.ok(format!("{n} claims allocated"));

    let id = claims[0].clone();
    let (daemon, again) = first_claim_survives_kill(bin, b, &env, &id, daemon, rec).await?;

    // The reference answers: the first clean prepare of every claim.
    let reference = reference_answers(kubelet, &claims, &id, again).await?;
    let mut want = vec![Want::Prepared; n];
    want[0] = Want::Unprepared;
    let cdi_dir = env.root.join("cdi");
    let mut crash = DraCrash {
        bin,
        config: &env.config,
        api: &env.api,
        // `kubedev::checkpoint::CHECKPOINT_FILE` (xtask does not link the daemon's library); a
        // damage round with prepared claims and no file there fails.
        checkpoint: env.root.join("plugins").join("kubedev-checkpoint.json"),
        cdi: cdi_dir.clone(),
        kubelet: kubelet.clone(),
        claims: Arc::new(claims),
        reference: Arc::new(reference),
        want,
    };
    check_cdi(&cdi_dir, &crash.wanted())?;

    let mut daemon = daemon;
    for _ in 0..DRA_CRASH_ROUNDS {
        let plan = plan_round(rng, n);
        daemon = crash.round(&plan, daemon, rec).await?;
    }
    rec.ok(format!(
        "{} random kills ({} in flight, {} in start-up), converged",
        rec.kills, rec.in_flight, rec.start_up
    ));

    // Pods run for the prepared claims; their state is damaged between restarts.
    for i in 0..n {
        crash.reserve(i, crash.want[i] == Want::Prepared)?;
    }
    for _ in 0..DRA_DAMAGE_ROUNDS {
        daemon = crash.damage_round(rng, daemon, rec).await?;
    }
    rec.ok(format!(
        "{DRA_DAMAGE_ROUNDS} rounds of damaged checkpoint and CDI specs, running pods kept their specs"
    ));

    unprepare_all(&mut crash, &id).await?;
    daemon.check_alive()?;
    rec.ok("all unprepared, no CDI file left, prepare again works");
    drop(daemon);
    drop(crash);
    let DraEnv { kubelet, api, .. } = env;
    if let Ok(k) = Arc::try_unwrap(kubelet) {
        k.stop().await;
    }
    api.shutdown().await;
    Ok(())
}

/// Waits until the daemon's ResourceSlices with devices are in the API server; returns them.
async fn published_slices(api: &ApiServer) -> anyhow::Result<Vec<serde_json::Value>> {
    let deadline = Instant::now() + WAIT;
    loop {
        let s: Vec<_> = api
            .objects(Resource::ResourceSlices)
            .into_iter()
            .filter(|s| s["spec"]["driver"] == DRIVER && s["spec"]["devices"].is_array())
            .collect();
        if !s.is_empty() {
            return Ok(s);
        }
        ensure!(Instant::now() < deadline, "no ResourceSlice was published");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Several claims, one device each (at most [`CRASH_CLAIMS`]), allocated together by the
/// allocator so they get distinct devices, and written to the API server with their
/// allocations; returns them.
fn allocate_claims(
    api: &ApiServer,
    slices: Vec<serde_json::Value>,
) -> anyhow::Result<Vec<ClaimId>> {
    let published: usize = slices
        .iter()
        .filter_map(|s| s["spec"]["devices"].as_array().map(Vec::len))
        .sum();
    let n = published.min(CRASH_CLAIMS);
    ensure!(n > 0, "the published slices hold no device");
    let claims: Vec<ClaimId> = (1..=n)
        .map(|i| {
            ClaimId::new(
                "default",
                &format!("claim-{i}"),
                &format!("e2e00000-cla1-4000-8000-00000000000{i}"),
            )
        })
        .collect();
    let objects: Vec<_> = claims
        .iter()
        .map(|c| {
            json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"name": c.name, "namespace": c.namespace, "uid": c.uid},
                "spec": {"devices": {"requests": [{"name": "dev", "exactly": {"deviceClassName": "e2e"}}]}}})
        })
        .collect();
    let class = json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
        "metadata": {"name": "e2e"},
        "spec": {"selectors": [{"cel": {"expression": format!("device.driver == '{DRIVER}'")}}]}});
    let scenario = json!({"node": {"name": NODE}, "deviceClasses": [class],
        "resourceSlices": slices, "claims": objects});
    let scenario = kubedev_inputs::scenario_from_text(&scenario.to_string())?;
    let out =
        kubedev_allocator::simulate(&scenario, &kubedev_allocator::SimulateOptions::default());
    ensure!(out.allocatable, "the claims do not fit: {}", out.to_text());
    ensure!(
        out.claims.len() == n,
        "the allocator answered for {} claims, not {n}",
        out.claims.len()
    );
    for (mut stored, c) in objects.into_iter().zip(&out.claims) {
        stored["status"] = json!({"allocation": serde_json::to_value(&c.allocation)?});
        api.put_raw(Resource::ResourceClaims, stored)?;
    }
    Ok(claims)
}

/// Claim `id` is prepared (its CDI spec holds the backend's device node), the daemon is
/// killed with `kill -9` and restarted, prepare answers the same, and unprepare removes the
/// spec. Returns the restarted daemon and its prepare answer.
async fn first_claim_survives_kill(
    bin: &Path,
    b: &Backend,
    env: &DraEnv,
    id: &ClaimId,
    daemon: Daemon,
    rec: &mut Record,
) -> anyhow::Result<(Daemon, Vec<PreparedDeviceAnswer>)> {
    let kubelet = &env.kubelet;
    let uid = id.uid.as_str();
    let first = kubelet
        .prepare(DRIVER, std::slice::from_ref(id))
        .await?
        .remove(uid)
        .context("no answer for the claim")?
        .map_err(anyhow::Error::msg)?;
    let cdi_dir = env.root.join("cdi");
    let cdi: Vec<PathBuf> = std::fs::read_dir(&cdi_dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    ensure!(cdi.len() == 1, "expected one CDI file, found {cdi:?}");
    let spec = std::fs::read_to_string(&cdi[0])?;
    ensure!(
        spec.contains(b.node),
        "the CDI spec lacks {}: {spec}",
        b.node
    );
    rec.ok("prepared, CDI checked");

    // kill -9 and a restart: the prepared claim survives, prepare answers the same.
    drop(daemon);
    let daemon = start(bin, &env.config)?;
    let again = prepare_until_answered(kubelet, id).await?;
    ensure!(
        again.len() == first.len()
            && again
                .iter()
                .zip(&first)
                .all(|(a, b)| a.device == b.device && a.cdi_device_ids == b.cdi_device_ids),
        "prepare after kill -9 answered differently: {first:?} vs {again:?}"
    );
    rec.ok("kill -9, same answer");

    let un = kubelet.unprepare(DRIVER, std::slice::from_ref(id)).await?;
    ensure!(
        un.get(uid).is_some_and(|r| r.is_ok()),
        "unprepare failed: {un:?}"
    );
    ensure!(!cdi[0].exists(), "the CDI spec is still there");
    rec.ok("unprepared");
    Ok((daemon, again))
}

/// Prepares claim `id` until the restarted daemon answers with its devices.
async fn prepare_until_answered(
    kubelet: &DraKubelet,
    id: &ClaimId,
) -> anyhow::Result<Vec<PreparedDeviceAnswer>> {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Ok(mut a) = kubelet.prepare(DRIVER, std::slice::from_ref(id)).await
            && let Some(Ok(devs)) = a.remove(id.uid.as_str())
        {
            return Ok(devs);
        }
        ensure!(
            Instant::now() < deadline,
            "prepare after the restart did not answer"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The reference answers: `first` for claim `id` (already prepared once), and a first clean
/// prepare of every other claim.
async fn reference_answers(
    kubelet: &DraKubelet,
    claims: &[ClaimId],
    id: &ClaimId,
    first: Vec<PreparedDeviceAnswer>,
) -> anyhow::Result<BTreeMap<String, Vec<PreparedDeviceAnswer>>> {
    let mut reference = BTreeMap::from([(id.uid.clone(), first)]);
    for c in &claims[1..] {
        let devs = kubelet
            .prepare(DRIVER, std::slice::from_ref(c))
            .await?
            .remove(&c.uid)
            .with_context(|| format!("no answer for claim {}", c.uid))?
            .map_err(anyhow::Error::msg)
            .with_context(|| format!("preparing claim {}", c.uid))?;
        reference.insert(c.uid.clone(), devs);
    }
    Ok(reference)
}

/// The kubelet unprepares everything: no spec file (nor temporary file) is left, and the
/// driver still prepares and unprepares claim `id`.
async fn unprepare_all(crash: &mut DraCrash<'_>, id: &ClaimId) -> anyhow::Result<()> {
    let n = crash.claims.len();
    crash.want = vec![Want::Unprepared; n];
    let wanted = crash.wanted();
    converge(&crash.kubelet, &wanted, &crash.reference).await?;
    check_cdi(&crash.cdi, &wanted)?;
    let (specs, temps) = cdi_files(&crash.cdi)?;
    ensure!(specs.is_empty(), "CDI spec files left: {specs:?}");
    // Every kill was followed by a restart, whose recovery removes what interrupted writes left.
    ensure!(
        temps.is_empty(),
        "temporary files of interrupted CDI writes left after recovery: {temps:?}"
    );
    let last = vec![(id.clone(), Want::Prepared)];
    converge(&crash.kubelet, &last, &crash.reference).await?;
    check_cdi(&crash.cdi, &last)?;
    let last = vec![(id.clone(), Want::Unprepared)];
    converge(&crash.kubelet, &last, &crash.reference).await?;
    check_cdi(&crash.cdi, &last)?;
    Ok(())
}
