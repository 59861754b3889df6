//! The kinds of backend a daemon runs: every backend, built in or a vendor's, is a
//! [`BackendFactory`] registered here under its key in `backends:`.
//!
//! ```
//! use kubedev::registry::Registry;
//!
//! // The backends this kubedev was built with, and a vendor's own beside them:
//! let registry = Registry::builtin().backend(kubedev::static_backend::factory());
//! assert!(registry.kinds().any(|k| k == "static"));
//! ```

use std::fmt;
use std::sync::Arc;

use kubedev_core::factory::BackendFactory;

/// The backend kinds a daemon knows, in registration order (which is the order backends are
/// built and their pools published).
#[derive(Clone, Default)]
pub struct Registry {
    factories: Vec<Arc<dyn BackendFactory>>,
    /// Kinds known by name but not available, with why (e.g. left out by a cargo feature).
    missing: Vec<(String, String)>,
}

impl fmt::Debug for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registry")
            .field("kinds", &self.kinds().collect::<Vec<_>>())
            .field("missing", &self.missing)
            .finish()
    }
}

impl PartialEq for Registry {
    /// Registries are equal when they know the same kinds.
    fn eq(&self, other: &Self) -> bool {
        self.kinds().eq(other.kinds()) && self.missing == other.missing
    }
}

impl Registry {
    /// A registry with no backend.
    pub fn new() -> Self {
        Self::default()
    }

    /// The backends of this build of kubedev: `static` and each of `nvidia`, `vfio`, `usb` and
    /// `host` whose cargo feature is on (the others are known by name, so a configuration
    /// naming them gets an error saying which feature to build with).
    pub fn builtin() -> Self {
        let r = Registry::new().backend(crate::static_backend::factory());
        #[cfg(feature = "nvidia")]
        let r = r.backend(kubedev_nvidia::factory::factory());
        #[cfg(not(feature = "nvidia"))]
        let r = r.without_feature("nvidia");
        #[cfg(feature = "vfio")]
        let r = r.backend(kubedev_vfio::factory::factory());
        #[cfg(not(feature = "vfio"))]
        let r = r.without_feature("vfio");
        #[cfg(feature = "usb")]
        let r = r.backend(kubedev_usb::factory::factory());
        #[cfg(not(feature = "usb"))]
        let r = r.without_feature("usb");
        #[cfg(feature = "host")]
        let r = r.backend(kubedev_host::factory::factory());
        #[cfg(not(feature = "host"))]
        let r = r.without_feature("host");
        r
    }

    /// Adds a backend kind; one registered earlier under the same key is replaced.
    pub fn backend(self, factory: impl BackendFactory) -> Self {
        self.shared(Arc::new(factory))
    }

    /// [`Registry::backend`] of a factory another registry holds too.
    pub(crate) fn shared(mut self, factory: Arc<dyn BackendFactory>) -> Self {
        let kind = factory.kind().to_owned();
        self.missing.retain(|(k, _)| *k != kind);
        self.factories.retain(|f| f.kind() != kind);
        self.factories.push(factory);
        self
    }

    /// Knows `kind` as a built-in backend this build left out with its cargo feature.
    #[allow(dead_code, reason = "used only in builds without some backend")]
    fn without_feature(mut self, kind: &str) -> Self {
        self.missing.push((
            kind.to_owned(),
            format!(
                "this kubedev was built without the `{kind}` backend; rebuild with `cargo build \
                 --features {kind}`"
            ),
        ));
        self
    }

    /// The registered kinds, in order.
    pub fn kinds(&self) -> impl Iterator<Item = &str> {
        self.factories.iter().map(|f| f.kind())
    }

    /// The factory of `kind`.
    pub fn get(&self, kind: &str) -> Option<&Arc<dyn BackendFactory>> {
        self.factories.iter().find(|f| f.kind() == kind)
    }

    /// The registered factories, in order.
    pub fn factories(&self) -> impl Iterator<Item = &Arc<dyn BackendFactory>> {
        self.factories.iter()
    }

    /// Why `kind` cannot be used: not built in, or not known at all.
    pub(crate) fn why_not(&self, kind: &str) -> String {
        match self.missing.iter().find(|(k, _)| k == kind) {
            Some((_, why)) => why.clone(),
            None => format!(
                "no backend of this kind is registered; the known kinds are: {}",
                self.kinds().collect::<Vec<_>>().join(", ")
            ),
        }
    }
}
