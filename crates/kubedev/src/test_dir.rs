//! A scratch directory for the unit tests of the checkpoint and the CDI writer.

use std::path::Path;

/// A temporary directory, removed when dropped.
#[derive(Debug)]
pub(crate) struct TestDir(tempfile::TempDir);

impl TestDir {
    /// A fresh directory whose name contains `tag`.
    pub(crate) fn new(tag: &str) -> Self {
        TestDir(
            tempfile::Builder::new()
                .prefix(&format!("kubedev-{tag}-"))
                .tempdir()
                .expect("create test dir"),
        )
    }

    pub(crate) fn path(&self) -> &Path {
        self.0.path()
    }

    /// File names in the directory, sorted.
    pub(crate) fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(self.path())
            .expect("read test dir")
            .map(|e| {
                e.expect("dir entry")
                    .file_name()
                    .into_string()
                    .expect("utf-8 name")
            })
            .collect();
        names.sort();
        names
    }
}
