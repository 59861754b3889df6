//! `kubedev cdi generate`: a CDI spec for the devices the configured backends find, on stdout
//! or written to a file.

use std::path::Path;
use std::process::ExitCode;

use anyhow::Context as _;

use super::args::SpecFormat;
use super::output::{Level, say, write_stdout};
use crate::cdi_generate::Generated;
use crate::registry::Registry;

/// `kubedev cdi generate`: the spec of kind `kind` (by default `<dra.driverName>/device`) for
/// what the configuration at `path` finds, in `output` on stdout, or to `file` in the format
/// its extension names.
pub(super) fn generate(
    registry: Registry,
    path: &Path,
    kind: Option<&str>,
    output: SpecFormat,
    file: Option<&Path>,
) -> anyhow::Result<ExitCode> {
    let config = crate::config::Config::load_with(path, registry)?;
    let kind = crate::cdi_generate::kind_for(&config, kind)?;
    let rt = super::current_thread_runtime()?;
    let out = rt.block_on(crate::cdi_generate::generate(&config, path, &kind))?;
    for s in &out.skipped {
        say(Level::Warn, &format!("left out {}: {}", s.device, s.reason));
    }
    let Some(spec) = &out.spec else {
        anyhow::bail!("no CDI spec written: {}", why_nothing_written(&out));
    };
    let text = match spec_format(file, output)? {
        SpecFormat::Json => format!("{}\n", serde_json::to_string_pretty(spec)?),
        SpecFormat::Yaml => serde_saphyr::to_string(spec).context("encoding YAML")?,
    };
    match file {
        Some(f) => {
            crate::cdi::write_spec_file(f, text.as_bytes())
                .with_context(|| format!("writing {}", f.display()))?;
            say(
                Level::Info,
                &format!(
                    "wrote {} with {} CDI device(s) of kind {kind}",
                    f.display(),
                    spec.devices.len()
                ),
            );
        }
        None => write_stdout(&text)?,
    }
    Ok(ExitCode::SUCCESS)
}

/// Why `out` holds no spec: no backend, no device, or no device that could be described.
fn why_nothing_written(out: &Generated) -> String {
    if out.backends.is_empty() {
        "no backend is configured".to_string()
    } else if out.found == 0 {
        format!(
            "the {} backend(s) found no devices",
            out.backends.join(", ")
        )
    } else {
        format!(
            "none of the {} device(s) found could be described",
            out.found
        )
    }
}

/// The spec's format: the one `file`'s extension names (`.json`, `.yaml` or `.yml`; any other
/// is an error), else `output`.
fn spec_format(file: Option<&Path>, output: SpecFormat) -> anyhow::Result<SpecFormat> {
    Ok(
        match file.and_then(|f| f.extension()).and_then(|e| e.to_str()) {
            Some("json") => SpecFormat::Json,
            Some("yaml" | "yml") => SpecFormat::Yaml,
            Some(other) => anyhow::bail!(
                "--output-file: container runtimes read CDI specs from .json or .yaml files, not .{other}"
            ),
            None if file.is_some() => {
                anyhow::bail!("--output-file: the name must end in .json or .yaml")
            }
            None => output,
        },
    )
}
