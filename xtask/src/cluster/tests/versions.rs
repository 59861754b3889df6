//! The API server as each older release it can emulate, what kubedev publishes to it, and
//! what it stores of each gated field against the emulator of that release.

use super::*;

/// The API server started as each older release it can emulate (`--emulated-version`,
/// KEP-4330: the three before its own) down to 1.34: it says so at /version, kubedev learns that release, publishes its
/// devices in the layout that release stores, and the server keeps them; and at each release
/// (its own too) it stores or refuses each gated field as the API server emulator of that
/// release does. Then back to its own.
pub(super) fn emulated_versions(node: &Node, _root: &Path) -> anyhow::Result<()> {
    let own: u32 = node
        .bins
        .version
        .trim_start_matches("v1.")
        .split('.')
        .next()
        .and_then(|m| m.parse().ok())
        .context("the cluster's minor version")?;
    let mut accepted = Vec::new();
    let mut differences = stored_as_emulated(node, own)?;
    for minor in (34..own).rev() {
        let release = format!("1.{minor}");
        eprintln!("  the API server as {release}");
        if let Err(err) = restart_apiserver(node, Some(&release)) {
            eprintln!("  it does not start as {release}: {err:#}");
            break;
        }
        let v: Value = serde_json::from_str(&node.kubectl_out(&["get", "--raw=/version"])?)?;
        eprintln!(
            "  /version: gitVersion {} minor {} emulationMinor {}",
            v["gitVersion"], v["minor"], v["emulationMinor"]
        );
        ensure!(
            v["emulationMinor"] == minor.to_string().as_str(),
            "/version does not say it emulates {release}: {v}"
        );
        roll_kubedev(node)?;
        let mut learned = String::new();
        wait_for(
            &format!("kubedev learning the release {release}"),
            Duration::from_secs(60),
            || {
                learned = daemon_log()
                    .lines()
                    .rfind(|l| l.contains("learned what the API server keeps"))
                    .unwrap_or_default()
                    .to_string();
                Ok(learned.contains(&format!("version={release}")))
            },
        )?;
        let summary = learned
            .split_once("learned what the API server keeps of ResourceSlices")
            .map_or(learned.as_str(), |(_, rest)| rest)
            .trim();
        eprintln!("  kubedev learned: {summary}");
        wait_for(
            &format!("kubedev's devices published to the server as {release}"),
            Duration::from_secs(60),
            || Ok(published_devices(node)? == dra_devices()),
        )?;
        differences.extend(stored_as_emulated(node, minor)?);
        accepted.push(release);
    }
    eprintln!(
        "  releases the API server emulates: {}",
        accepted.join(", ")
    );
    restart_apiserver(node, None).context("the API server as itself again")?;
    roll_kubedev(node)?;
    // A release emulates the three before it (KEP-4330); kubedev supports 1.34 on.
    let lowest = own.saturating_sub(3).max(34);
    ensure!(
        accepted.len() == (lowest..own).count(),
        "the API server emulated only {accepted:?}, not every release from 1.{lowest} on"
    );
    ensure!(
        differences.is_empty(),
        "the API server and its emulator store ResourceSlices differently:\n{}",
        indent(&differences.join("\n"))
    );
    Ok(())
}

/// The differences between what the API server, as 1.`minor`, and the emulator of that
/// release store of each gated field; printed as they are found.
fn stored_as_emulated(node: &Node, minor: u32) -> anyhow::Result<Vec<String>> {
    let found = super::stored::differences(node, minor)?;
    if found.is_empty() {
        eprintln!(
            "  1.{minor}: the emulator stores and refuses every gated field, and kubedev reads \
             a claim from it, as from the API server"
        );
    }
    for d in &found {
        eprintln!("  DIFFERENT {d}");
    }
    Ok(found)
}

/// Restarts the API server as `release` (`--emulated-version`), or as its own release with
/// `None`, and waits until it is ready.
fn restart_apiserver(node: &Node, release: Option<&str>) -> anyhow::Result<()> {
    let pid = node.restart_with("kube-apiserver", |args| {
        args.retain(|a| !a.starts_with("--emulated-version"));
        args.extend(release.map(|r| format!("--emulated-version={r}")));
    })?;
    node.wait_api_ready(pid)
}
