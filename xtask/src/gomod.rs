//! What kubedev's Go modules say about the Kubernetes release they build: the versions a
//! module requires and replaces the `k8s.io` modules at, checked against the release the
//! module is used for. A module left at another release would otherwise build, and be
//! reported, under the wrong name.

use anyhow::{Context as _, bail, ensure};

/// The version of the `k8s.io` staging modules (`v0.38.0`) published with Kubernetes
/// `release` (`1.38.0`, `1.38.0-beta.0`, with or without a leading `v`).
pub(crate) fn staging_version(release: &str) -> anyhow::Result<String> {
    let release = release.trim_start_matches('v');
    let (major, rest) = release
        .split_once('.')
        .with_context(|| format!("{release:?} is not a Kubernetes release like 1.38.0"))?;
    ensure!(
        major == "1" && rest.contains('.'),
        "{release:?} is not a Kubernetes release like 1.38.0"
    );
    Ok(format!("v0.{rest}"))
}

/// The Kubernetes release (`1.38.0`) a staging module version (`v0.38.0`) was published with,
/// for messages; the version itself when it is not one.
fn release_of(staging: &str) -> String {
    match staging.strip_prefix("v0.") {
        Some(rest) => format!("1.{rest}"),
        None => staging.to_string(),
    }
}

/// One directive's words, without a trailing comment.
fn words(line: &str) -> Vec<&str> {
    let line = line.split("//").next().unwrap_or_default();
    line.split_whitespace().collect()
}

/// The lines of every `directive` (`require`, `replace`) of a go.mod: those of its blocks and
/// the rest of its one-line forms, each split into words.
fn directives<'a>(go_mod: &'a str, directive: &str) -> Vec<Vec<&'a str>> {
    let mut out = Vec::new();
    let mut in_block = false;
    for line in go_mod.lines() {
        let w = words(line);
        if in_block {
            if w.first() == Some(&")") {
                in_block = false;
            } else if !w.is_empty() {
                out.push(w);
            }
            continue;
        }
        match w.split_first() {
            Some((first, rest)) if *first == directive => {
                if rest == ["("] {
                    in_block = true;
                } else {
                    out.push(rest.to_vec());
                }
            }
            _ => {}
        }
    }
    out
}

/// The Go toolchain a go.mod names (`go1.27.3` from `toolchain go1.27.3`), if it names one.
pub(crate) fn toolchain(go_mod: &str) -> Option<&str> {
    go_mod.lines().find_map(|l| match words(l)[..] {
        ["toolchain", t] => Some(t),
        _ => None,
    })
}

/// The version a go.mod requires `module` at, if it requires it.
pub(crate) fn required<'a>(go_mod: &'a str, module: &str) -> Option<&'a str> {
    directives(go_mod, "require")
        .into_iter()
        .find_map(|w| match w[..] {
            [m, v, ..] if m == module => Some(v),
            _ => None,
        })
}

/// Each `replace` of a module by a module at a version: (replaced, replacement, version).
/// Replacements by a directory have no version and are left out.
fn replaced(go_mod: &str) -> Vec<(&str, &str, &str)> {
    directives(go_mod, "replace")
        .into_iter()
        .filter_map(|w| {
            let arrow = w.iter().position(|x| *x == "=>")?;
            match (&w[..arrow], &w[arrow + 1..]) {
                ([from, ..], [to, version]) => Some((*from, *to, *version)),
                _ => None,
            }
        })
        .collect()
}

/// Fails unless the go.mod text `go_mod` (`what` names it) builds Kubernetes `release`: it
/// requires `k8s.io/kubernetes` (if at all) at `v<release>`, each of `staging` (which must
/// include one it requires) at the staging version of the release, and replaces every
/// `k8s.io` module it replaces by a version with that version too.
pub(crate) fn check_release(
    go_mod: &str,
    what: &str,
    release: &str,
    staging: &[&str],
) -> anyhow::Result<()> {
    let release = release.trim_start_matches('v');
    let want = staging_version(release)?;
    let mismatch = |module: &str, found: &str, want: &str, release_found: String| {
        anyhow::anyhow!(
            "{what} has {module} at {found} (Kubernetes {release_found}), not {want}: it is used \
             for Kubernetes {release}, so every k8s.io version in it must be that release's \
             (set them with `go mod edit`, then `go mod tidy`)"
        )
    };
    if let Some(found) = required(go_mod, "k8s.io/kubernetes") {
        let want_kube = format!("v{release}");
        if found != want_kube {
            let release_found = found.trim_start_matches('v').to_string();
            return Err(mismatch(
                "k8s.io/kubernetes",
                found,
                &want_kube,
                release_found,
            ));
        }
    }
    let mut any = false;
    for module in staging {
        if let Some(found) = required(go_mod, module) {
            any = true;
            if found != want {
                return Err(mismatch(module, found, &want, release_of(found)));
            }
        }
    }
    if !staging.is_empty() && !any {
        bail!("{what} requires none of {}", staging.join(", "));
    }
    for (from, to, version) in replaced(go_mod) {
        if from.starts_with("k8s.io/") && from == to && version != want {
            return Err(mismatch(
                &format!("the replace of {from}"),
                version,
                &want,
                release_of(version),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALLOCSIM_LIKE: &str = "module kubedev.tools/allocsim

go 1.27.0

toolchain go1.27.3

require (
\tgolang.org/x/sys v0.50.0
\tk8s.io/api v0.38.0-beta.0
\tk8s.io/dynamic-resource-allocation v0.38.0-beta.0
)

require (
\tk8s.io/klog/v2 v2.140.0 // indirect
\tk8s.io/utils v0.0.0-20260210185600-b8788abfbbc2 // indirect
)
";

    const CLUSTER_LIKE: &str = "module kubedev.dev/tools/cluster/kubernetes

go 1.26.0

require k8s.io/kubernetes v1.37.2 // indirect

require k8s.io/api v0.37.2 // indirect

replace (
\tk8s.io/api => k8s.io/api v0.37.2
\tk8s.io/kubectl v0.37.0 => k8s.io/kubectl v0.37.2
\tsigs.k8s.io/iptables-wrappers => ../iptables-wrappers
)

replace k8s.io/kubelet => k8s.io/kubelet v0.37.2
";

    /// The error `check_release` gives, or a failure naming what it accepted.
    fn refusal(go_mod: &str, what: &str, release: &str, staging: &[&str]) -> String {
        match check_release(go_mod, what, release, staging) {
            Ok(()) => panic!("{what} was accepted for Kubernetes {release}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn staging_versions_follow_the_release() -> anyhow::Result<()> {
        assert_eq!(staging_version("1.38.0")?, "v0.38.0");
        assert_eq!(staging_version("v1.38.0-beta.0")?, "v0.38.0-beta.0");
        assert!(staging_version("2.0.0").is_err());
        assert!(staging_version("1").is_err());
        assert_eq!(release_of("v0.37.2"), "1.37.2");
        Ok(())
    }

    #[test]
    fn requires_and_replaces_are_read_in_blocks_and_on_one_line() {
        assert_eq!(
            required(ALLOCSIM_LIKE, "k8s.io/dynamic-resource-allocation"),
            Some("v0.38.0-beta.0")
        );
        assert_eq!(
            required(ALLOCSIM_LIKE, "k8s.io/utils"),
            Some("v0.0.0-20260210185600-b8788abfbbc2")
        );
        assert_eq!(required(ALLOCSIM_LIKE, "k8s.io/client-go"), None);
        assert_eq!(required(CLUSTER_LIKE, "k8s.io/kubernetes"), Some("v1.37.2"));
        assert_eq!(toolchain(ALLOCSIM_LIKE), Some("go1.27.3"));
        assert_eq!(toolchain(CLUSTER_LIKE), None);
        assert_eq!(
            replaced(CLUSTER_LIKE),
            vec![
                ("k8s.io/api", "k8s.io/api", "v0.37.2"),
                ("k8s.io/kubectl", "k8s.io/kubectl", "v0.37.2"),
                ("k8s.io/kubelet", "k8s.io/kubelet", "v0.37.2"),
            ]
        );
    }

    #[test]
    fn a_module_of_its_release_passes() -> anyhow::Result<()> {
        let staging = ["k8s.io/api", "k8s.io/dynamic-resource-allocation"];
        check_release(ALLOCSIM_LIKE, "go.mod", "1.38.0-beta.0", &staging)?;
        check_release(CLUSTER_LIKE, "go.mod", "1.37.2", &[])
    }

    #[test]
    fn a_module_of_another_release_is_refused_naming_both() {
        let staging = ["k8s.io/api", "k8s.io/dynamic-resource-allocation"];
        let e = refusal(ALLOCSIM_LIKE, "tools/allocsim/go.mod", "1.38.0", &staging);
        assert!(
            e.contains("tools/allocsim/go.mod has k8s.io/api at v0.38.0-beta.0 (Kubernetes 1.38.0-beta.0), not v0.38.0")
                && e.contains("used for Kubernetes 1.38.0"),
            "{e}"
        );
        let e = refusal(CLUSTER_LIKE, "the module", "1.38.0", &[]);
        assert!(
            e.contains("k8s.io/kubernetes at v1.37.2 (Kubernetes 1.37.2), not v1.38.0"),
            "{e}"
        );
        // The kubernetes module moved, a replace left behind.
        let half = CLUSTER_LIKE.replace("kubernetes v1.37.2", "kubernetes v1.38.0");
        let e = refusal(&half, "the module", "1.38.0", &[]);
        assert!(
            e.contains("the replace of k8s.io/api at v0.37.2 (Kubernetes 1.37.2), not v0.38.0"),
            "{e}"
        );
        let e = refusal(CLUSTER_LIKE, "the module", "1.37.2", &["k8s.io/client-go"]);
        assert!(e.contains("requires none of k8s.io/client-go"), "{e}");
    }
}
