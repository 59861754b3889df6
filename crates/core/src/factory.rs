//! `BackendFactory`: how a daemon learns a kind of backend — its key under `backends:` in the
//! configuration file, how its section is read and checked, and how it is built.
//!
//! The daemon's runtime knows no backend by name: every backend, built in or a vendor's, is a
//! factory registered with it. [`typed`] makes one from a serde configuration type and a
//! constructor; the runtime crate's `static` backend (`kubedev::static_backend`) is built that
//! way, and its module documentation shows it.

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

use serde::de::DeserializeOwned;

use crate::hostfs::BackendContext;
use crate::names::PoolName;
use crate::prepare::Preparer;
use crate::source::DeviceSource;

/// What a backend is built for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum BuildMode {
    /// The daemon: the backend may also bring the host to its configured state (create
    /// mediated device types, pre-open device nodes so their modules load).
    Serve,
    /// A look at the host (`discover`, `cdi generate`, `who-uses`): nothing on the host may be
    /// changed.
    Inspect,
}

/// Everything a factory is given to build its backend.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct BuildContext {
    /// The host, the backend's own state directory (created by the daemon) and the node.
    pub backend: BackendContext,
    /// What the backend is built for.
    pub mode: BuildMode,
    /// The kind of backend being built: its key under `backends:`.
    kind: String,
}

impl BuildContext {
    /// A context for building in `mode`; [`for_kind`](Self::for_kind) says which kind.
    pub fn new(backend: BackendContext, mode: BuildMode) -> Self {
        BuildContext {
            backend,
            mode,
            kind: String::new(),
        }
    }

    /// The same context for building a backend of `kind`.
    pub fn for_kind(mut self, kind: impl Into<String>) -> Self {
        self.kind = kind.into();
        self
    }

    /// The kind of backend being built (empty when the context names none).
    pub fn kind(&self) -> &str {
        &self.kind
    }

    /// The pool a backend of this kind publishes its devices in: `<node>-<kind>`. A daemon
    /// checks this name when it reads its configuration, so a backend built by the daemon gets
    /// it; the error (an unusable node name) says which name was made from what.
    pub fn pool(&self) -> Result<PoolName, SectionError> {
        own_pool_name(&self.backend.node_name, &self.kind)
            .map_err(|e| SectionError::new("", e.to_string()))
    }
}

/// The pool a backend of `kind` on node `node` publishes: `<node>-<kind>`; the error says which
/// name was made from what, and why it is invalid. Every backend that names its own pool after
/// the node uses it.
pub fn own_pool_name(node: &str, kind: &str) -> Result<PoolName, OwnPoolNameError> {
    let name = format!("{node}-{kind}");
    PoolName::new(name.clone()).map_err(|e| OwnPoolNameError {
        kind: kind.to_string(),
        pool: name,
        reason: e.reason,
    })
}

/// A pool name made from the node name and a backend's kind that is no valid pool name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the {kind} backend's pool name {} made from the node name is invalid: {reason}",
    crate::echo::echo(.pool)
)]
#[non_exhaustive]
pub struct OwnPoolNameError {
    /// The backend's kind.
    pub kind: String,
    /// The name made.
    pub pool: String,
    /// Why it is no valid pool name.
    pub reason: String,
}

/// A built backend: its kind, where its devices come from and how they are prepared (usually
/// the same object behind both).
#[derive(Clone)]
#[non_exhaustive]
pub struct BuiltBackend {
    /// The kind it was built as (its key under `backends:`); what logs and metrics call it.
    pub kind: Arc<str>,
    /// Discovery and health.
    pub source: Arc<dyn DeviceSource>,
    /// Prepare and unprepare.
    pub preparer: Arc<dyn Preparer>,
}

impl fmt::Debug for BuiltBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BuiltBackend")
            .field("kind", &self.kind)
            .finish_non_exhaustive()
    }
}

impl BuiltBackend {
    /// A backend that is both its source and its preparer, named by its
    /// [`DeviceSource::name`] until [`with_kind`](Self::with_kind) names it.
    pub fn new<B: DeviceSource + Preparer>(backend: B) -> Self {
        let b = Arc::new(backend);
        BuiltBackend {
            kind: Arc::from(b.name()),
            source: b.clone(),
            preparer: b,
        }
    }

    /// A backend named `kind` whose devices come from `source` and are prepared by `preparer`
    /// (two objects, or one shared behind both).
    pub fn from_parts(
        kind: &str,
        source: Arc<dyn DeviceSource>,
        preparer: Arc<dyn Preparer>,
    ) -> Self {
        BuiltBackend {
            kind: Arc::from(kind),
            source,
            preparer,
        }
    }

    /// The same backend, named `kind`.
    pub fn with_kind(mut self, kind: &str) -> Self {
        self.kind = Arc::from(kind);
        self
    }
}

/// A problem with a backend's section, at `field` within it (dotted, with `[i]` for list
/// items; empty for the section as a whole).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}{message}", if field.is_empty() { String::new() } else { format!("{field}: ") })]
#[non_exhaustive]
pub struct SectionError {
    /// The field within the section, e.g. `characterDevices[0].path`.
    pub field: String,
    /// What is wrong with it.
    pub message: String,
}

impl SectionError {
    /// An error at `field` (empty: the whole section).
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        SectionError {
            field: field.into(),
            message: message.into(),
        }
    }

    /// `field`'s value `value` is refused for `reason`; the value is quoted bounded and escaped
    /// ([`echo`](crate::echo::echo)): `backends.usb.selectors: "zz:1": not hexadecimal`.
    pub fn invalid_value(field: impl Into<String>, value: &str, reason: &str) -> Self {
        SectionError::new(field, format!("{}: {reason}", crate::echo::echo(value)))
    }

    /// The section as a whole is refused: `error` with its causes
    /// ([`chain`](crate::echo::chain)).
    pub fn whole(error: &(dyn std::error::Error + 'static)) -> Self {
        SectionError::new("", crate::echo::chain(error))
    }

    /// A backend's validation failure: at the field of the [`InvalidValue`] that is it or
    /// caused it, else the section as a whole ([`whole`](Self::whole)).
    pub fn of(error: &(dyn std::error::Error + 'static)) -> Self {
        let mut cause = Some(error);
        while let Some(e) = cause {
            if let Some(v) = e.downcast_ref::<InvalidValue>() {
                return v.clone().into();
            }
            cause = e.source();
        }
        SectionError::whole(error)
    }
}

/// A configuration value a backend refuses: `field = "value": reason`, the value quoted bounded
/// and escaped ([`echo`](crate::echo::echo)). A backend error caused by one becomes a
/// [`SectionError`] at its field ([`SectionError::of`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field} = {}: {reason}", crate::echo::echo(.value))]
pub struct InvalidValue {
    /// The field, as written in configuration (camelCase, dotted, `[i]` for list items).
    pub field: String,
    /// The refused value.
    pub value: String,
    /// Why it is refused.
    pub reason: String,
}

impl InvalidValue {
    /// `field`'s value `value` is refused for `reason`.
    pub fn new(
        field: impl Into<String>,
        value: impl Into<String>,
        reason: impl Into<String>,
    ) -> Self {
        InvalidValue {
            field: field.into(),
            value: value.into(),
            reason: reason.into(),
        }
    }
}

impl From<InvalidValue> for SectionError {
    fn from(v: InvalidValue) -> Self {
        SectionError::invalid_value(v.field, &v.value, &v.reason)
    }
}

/// One kind of backend a daemon can run.
pub trait BackendFactory: Send + Sync + 'static {
    /// Its key under `backends:` in the configuration file (e.g. `nvidia`); a backend runs
    /// when its section is present.
    fn kind(&self) -> &str;

    /// Reads and validates its section without touching the host; the error names the field.
    fn check(&self, section: &serde_json::Value) -> Result<(), SectionError>;

    /// Builds the backend from its section (which `check` accepted).
    fn build(
        &self,
        section: &serde_json::Value,
        context: &BuildContext,
    ) -> Result<BuiltBackend, SectionError>;

    /// Whether the backend publishes a pool of its own named `<node>-<kind>`, whose name the
    /// daemon checks at configuration time (default: yes).
    fn own_pool(&self) -> bool {
        true
    }
}

/// A configuration section a [`typed`] factory reads: deserialized with serde (unknown fields
/// should be refused, `#[serde(deny_unknown_fields)]`), then checked by `validate`.
pub trait Section: DeserializeOwned + Send + Sync + 'static {
    /// Checks what serde cannot (ranges, references between fields); the error names the
    /// field. The default accepts everything.
    fn validate(&self) -> Result<(), SectionError> {
        Ok(())
    }
}

/// A factory for `kind` from its section type `C` and a constructor.
pub fn typed<C, B, F>(kind: &'static str, build: F) -> Typed<C, F>
where
    C: Section,
    B: DeviceSource + Preparer,
    F: Fn(C, &BuildContext) -> Result<B, SectionError> + Send + Sync + 'static,
{
    Typed {
        kind,
        build,
        own_pool: true,
        _section: PhantomData,
    }
}

/// The factory [`typed`] makes.
pub struct Typed<C, F> {
    kind: &'static str,
    build: F,
    own_pool: bool,
    _section: PhantomData<fn() -> C>,
}

impl<C, F> Typed<C, F> {
    /// Says the backend names its pools itself (from its configuration) instead of
    /// `<node>-<kind>`.
    pub fn names_its_pools(mut self) -> Self {
        self.own_pool = false;
        self
    }
}

impl<C, F> fmt::Debug for Typed<C, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Typed").field("kind", &self.kind).finish()
    }
}

fn parse<C: Section>(section: &serde_json::Value) -> Result<C, SectionError> {
    // `fpga:` with nothing after it is YAML null: the section with every default.
    let section = match section {
        serde_json::Value::Null => serde_json::Value::Object(Default::default()),
        other => other.clone(),
    };
    // The path of the offending field goes into the error, so the message names its line.
    let config: C = serde_path_to_error::deserialize(section).map_err(|e| {
        let path = e.path().to_string();
        let field = if path == "." { String::new() } else { path };
        SectionError::new(field, e.into_inner().to_string())
    })?;
    config.validate()?;
    Ok(config)
}

impl<C, B, F> BackendFactory for Typed<C, F>
where
    C: Section,
    B: DeviceSource + Preparer,
    F: Fn(C, &BuildContext) -> Result<B, SectionError> + Send + Sync + 'static,
{
    fn kind(&self) -> &str {
        self.kind
    }

    fn check(&self, section: &serde_json::Value) -> Result<(), SectionError> {
        parse::<C>(section).map(|_| ())
    }

    fn build(
        &self,
        section: &serde_json::Value,
        context: &BuildContext,
    ) -> Result<BuiltBackend, SectionError> {
        let config = parse::<C>(section)?;
        let context = context.clone().for_kind(self.kind);
        let built = (self.build)(config, &context)?;
        Ok(BuiltBackend::new(built).with_kind(self.kind))
    }

    fn own_pool(&self) -> bool {
        self.own_pool
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A backend's error as backends write them: one variant carries a refused value.
    #[derive(Debug, thiserror::Error)]
    enum BackendError {
        #[error("fpga configuration: {0}")]
        Config(#[source] InvalidValue),
        #[error("fpga: state directory /var/lib/fpga: permission denied")]
        StateDir,
    }

    #[test]
    fn a_refused_value_becomes_an_error_at_its_field_and_anything_else_the_whole_section() {
        let refused = BackendError::Config(InvalidValue::new(
            "cards[1].path",
            "dev/fpga\n1",
            "must be absolute",
        ));
        assert_eq!(
            refused.to_string(),
            "fpga configuration: cards[1].path = \"dev/fpga\\n1\": must be absolute"
        );
        let at_field = SectionError::of(&refused);
        assert_eq!(at_field.field, "cards[1].path");
        assert_eq!(at_field.message, "\"dev/fpga\\n1\": must be absolute");

        let whole = SectionError::of(&BackendError::StateDir);
        assert_eq!(whole.field, "");
        assert_eq!(
            whole.message,
            "fpga: state directory /var/lib/fpga: permission denied"
        );
    }
}
