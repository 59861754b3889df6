//! The example builds with the versions kubedev's workspace is tested with: every package of its
//! Cargo.lock is in the workspace's Cargo.lock at the same version.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::path::Path;

/// `(name, version)` of every package of a Cargo.lock.
fn packages(lock: &Path) -> BTreeSet<(String, String)> {
    let text = std::fs::read_to_string(lock).unwrap();
    let field = |block: &str, key: &str| {
        let line = block
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{key} = ")));
        line.map(|v| v.trim_matches('"').to_string())
    };
    let blocks = text.split("[[package]]").skip(1);
    blocks
        .map(|b| (field(b, "name").unwrap(), field(b, "version").unwrap()))
        .collect()
}

#[test]
fn the_lock_file_has_the_workspace_versions() {
    let example = Path::new(env!("CARGO_MANIFEST_DIR"));
    let ours = packages(&example.join("Cargo.lock"));
    let workspace = packages(&example.join("../../Cargo.lock"));
    let differ: Vec<_> = ours
        .iter()
        .filter(|(name, _)| name != env!("CARGO_PKG_NAME"))
        .filter(|p| !workspace.contains(*p))
        .collect();
    assert!(
        differ.is_empty(),
        "examples/vendor-driver/Cargo.lock has versions the workspace's Cargo.lock does not: \
         {differ:?}; from the repository root run `cp Cargo.lock examples/vendor-driver/ && cargo \
         metadata --offline --format-version 1 --manifest-path examples/vendor-driver/Cargo.toml \
         >/dev/null` (cargo then keeps the workspace's versions and drops what the example does \
         not use)"
    );
}
