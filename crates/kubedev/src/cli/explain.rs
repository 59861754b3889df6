//! `kubedev explain`: which nodes of a cluster (live, or dumped by kubectl) can take a pod's or
//! a claim's device claims, and why the others cannot.

use std::path::Path;
use std::process::ExitCode;

use anyhow::Context as _;
use kubedev_inputs::cluster::{Cluster, Subject};

use super::args::{ExplainArgs, KubeArgs, Output};
use super::output::write_stdout;

/// `kubedev explain`.
pub(super) fn explain(args: ExplainArgs) -> anyhow::Result<ExitCode> {
    let ExplainArgs {
        file,
        kube,
        pod,
        claim,
        output,
        details,
    } = args;
    let mut cluster = Cluster::default();
    let subject = if file.is_empty() {
        let (texts, subject) = read_live_cluster(&kube, pod, claim)?;
        for text in &texts {
            cluster.add_text(text, "the cluster")?;
        }
        subject
    } else {
        let namespace = kube.namespace.as_deref().unwrap_or("default");
        subject(pod, claim, namespace)?
    };
    for f in &file {
        let (text, origin) = read_dump(f)?;
        cluster.add_text(&text, &origin)?;
    }
    let answer = cluster.explain(&subject).map_err(anyhow::Error::msg)?;
    let text = match output {
        Output::Text => answer.to_text(details),
        Output::Json => format!("{}\n", serde_json::to_string_pretty(&answer)?),
        Output::Yaml => serde_saphyr::to_string(&answer)?,
    };
    write_stdout(&text)?;
    // The command ends here and the process exits: freeing a large cluster object by object
    // (millions of allocations for tens of thousands of nodes) would only delay the exit, so
    // it is left to the exit.
    std::mem::forget(cluster);
    std::mem::forget(answer);
    Ok(ExitCode::SUCCESS)
}

/// The pod or claim asked about, as `namespace/name`; a bare name is in `namespace`.
fn subject(pod: Option<String>, claim: Option<String>, namespace: &str) -> anyhow::Result<Subject> {
    let qualify = |name: String| {
        if name.contains('/') {
            name
        } else {
            format!("{namespace}/{name}")
        }
    };
    match (pod, claim) {
        (Some(p), _) => Ok(Subject::Pod(qualify(p))),
        (None, Some(c)) => Ok(Subject::Claim(qualify(c))),
        (None, None) => anyhow::bail!("give --pod or --claim"),
    }
}

/// What the live cluster says that explaining needs (read-only), reached as `kube` says, and
/// the subject asked about (a bare name is in `-n`'s namespace, else the context's).
fn read_live_cluster(
    kube: &KubeArgs,
    pod: Option<String>,
    claim: Option<String>,
) -> anyhow::Result<(Vec<String>, Subject)> {
    let rt = super::current_thread_runtime()?;
    rt.block_on(async {
        let client =
            kubedev_apiserver::connect_context(kube.kubeconfig.as_deref(), kube.context.as_deref())
                .await?;
        let namespace = kube
            .namespace
            .clone()
            .unwrap_or_else(|| client.default_namespace().to_string());
        let subject = subject(pod, claim, &namespace)?;
        let pod = match &subject {
            Subject::Pod(p) => p.split_once('/'),
            _ => None,
        };
        let texts = kubedev_apiserver::read_explain_inputs(&client, pod).await?;
        anyhow::Ok((texts, subject))
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
