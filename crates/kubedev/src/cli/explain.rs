//! `kubedev explain`: which nodes of a cluster (live, or dumped by kubectl) can take a pod's or
//! a claim's device claims, and why the others cannot.

use std::path::Path;
use std::process::ExitCode;

use anyhow::Context as _;
use kubedev_allocator::cluster::{Cluster, Subject};

use super::args::{ExplainArgs, Output};
use super::output::write_stdout;

/// `kubedev explain`.
pub(super) fn explain(args: ExplainArgs) -> anyhow::Result<ExitCode> {
    let ExplainArgs {
        file,
        kubeconfig,
        pod,
        claim,
        output,
        details,
    } = args;
    let mut cluster = Cluster::default();
    if file.is_empty() {
        for text in &read_live_cluster(kubeconfig.as_deref(), pod.as_deref())? {
            cluster.add_text(text, "the cluster")?;
        }
    }
    for f in &file {
        let (text, origin) = read_dump(f)?;
        cluster.add_text(&text, &origin)?;
    }
    let subject = match (pod, claim) {
        (Some(p), _) => Subject::Pod(p),
        (None, Some(c)) => Subject::Claim(c),
        (None, None) => anyhow::bail!("give --pod or --claim"),
    };
    let answer = cluster.explain(&subject).map_err(anyhow::Error::msg)?;
    let text = match output {
        Output::Text => answer.to_text(details),
        Output::Json => format!("{}\n", serde_json::to_string_pretty(&answer)?),
        Output::Yaml => serde_saphyr::to_string(&answer)?,
    };
    write_stdout(&text)?;
    Ok(ExitCode::SUCCESS)
}

/// What the live cluster says that explaining needs (read-only), through `kubeconfig`; `pod`
/// (`namespace/name`, or a name in `default`) is the pod asked about, if one is.
fn read_live_cluster(kubeconfig: Option<&Path>, pod: Option<&str>) -> anyhow::Result<Vec<String>> {
    let pod_key = pod.map(|p| match p.split_once('/') {
        Some((ns, name)) => (ns.to_string(), name.to_string()),
        None => ("default".to_string(), p.to_string()),
    });
    let rt = super::current_thread_runtime()?;
    rt.block_on(async {
        let client = kubedev_apiserver::connect(kubeconfig).await?;
        let pod = pod_key.as_ref().map(|(ns, n)| (ns.as_str(), n.as_str()));
        anyhow::Ok(kubedev_apiserver::read_explain_inputs(&client, pod).await?)
    })
}

/// The text of the dump `file` (`-`: standard input) and its name in errors.
fn read_dump(file: &Path) -> anyhow::Result<(String, String)> {
    if file.as_os_str() == "-" {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut text)
            .context("reading standard input")?;
        Ok((text, "stdin".to_string()))
    } else {
        let text =
            std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
        Ok((text, file.display().to_string()))
    }
}
