//! The `fpga` backend: FPGA cards found in sysfs. Walked through in docs/writing-a-backend.md.

use std::path::PathBuf;
use std::time::Duration;

use kubedev::backend::{
    BackendFactory, BuildContext, ContainerEdits, Device, DeviceName, DeviceNode, DeviceRef,
    DeviceSource, EventSender, Health, HostFs, Mount, Pool, PoolName, PrepareError, Section,
    SectionError, SourceError, StatelessPreparer, async_trait, echo, typed, watch_health,
};
use serde::Deserialize;

/// The section `backends.fpga` of the configuration file.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FpgaConfig {
    /// Where the cards are listed, as a path on the host (default `/sys/class/fpga_manager`).
    pub cards_root: Option<PathBuf>,
    /// A host directory of bitstreams, mounted read-only at the same path in containers.
    pub bitstream_dir: Option<PathBuf>,
}

impl Section for FpgaConfig {
    fn validate(&self) -> Result<(), SectionError> {
        let paths = [("cardsRoot", &self.cards_root)].into_iter();
        for (field, path) in paths.chain([("bitstreamDir", &self.bitstream_dir)]) {
            if let Some(p) = path.as_ref().filter(|p| p.is_relative()) {
                return Err(SectionError::new(field, format!("{p:?} must be absolute")));
            }
        }
        Ok(())
    }
}

/// The backend kind the driver's main registers: `backends.fpga` builds an [`FpgaBackend`].
pub fn factory() -> impl BackendFactory {
    typed("fpga", FpgaBackend::new)
}

/// The FPGA cards of one node, published in the pool `<node>-fpga`.
#[derive(Debug)]
pub struct FpgaBackend {
    host: HostFs,
    root: PathBuf,
    bitstreams: Option<String>,
    pool: PoolName,
}

impl FpgaBackend {
    pub fn new(config: FpgaConfig, ctx: &BuildContext) -> Result<Self, SectionError> {
        Ok(FpgaBackend {
            host: ctx.backend.host.clone(),
            root: config
                .cards_root
                .unwrap_or("/sys/class/fpga_manager".into()),
            bitstreams: config.bitstream_dir.map(|d| d.display().to_string()),
            pool: ctx.pool()?,
        })
    }

    /// The cards (`fpga0`, `fpga1`, …), sorted; an entry that is no device name is skipped.
    fn cards(&self) -> Vec<DeviceName> {
        let names = self.host.list_dir(&self.root).unwrap_or_default();
        let cards = names.into_iter().filter(|n| n.starts_with("fpga"));
        cards.filter_map(|n| DeviceName::new(n).ok()).collect()
    }

    fn health(&self, card: &DeviceName) -> Health {
        let state = self.root.join(card.as_str()).join("state");
        match self.host.read_attr(state) {
            Ok(state) if state == "operating" => Health::healthy(),
            Ok(state) => Health::unhealthy(format!("state is {state:?}")),
            Err(e) => Health::unhealthy(echo::chain(&e)),
        }
    }

    /// The pool of the cards there are now, with their health.
    fn pool_now(&self) -> Pool {
        let card = |c: DeviceName| Device::new(c.clone()).with_health(self.health(&c));
        Pool::new(
            self.pool.clone(),
            self.cards().into_iter().map(card).collect(),
        )
    }
}

#[async_trait]
impl DeviceSource for FpgaBackend {
    async fn discover(&self) -> Result<Vec<Pool>, SourceError> {
        Ok(vec![self.pool_now()])
    }

    /// Reads every card's `state` five times a second; a card that comes or goes is noticed too.
    async fn watch(&self, events: EventSender) -> Result<(), SourceError> {
        let now = || self.pool_now().device_health();
        watch_health(events, Duration::from_millis(200), now).await
    }
}

/// Preparing changes nothing on the host: `unprepare` has nothing to undo, and `cdi generate`
/// writes the same edits as `prepare` gives.
impl StatelessPreparer for FpgaBackend {
    /// A card's node, its name in `FPGA_CARDS`, the bitstreams; the host is left unchanged.
    fn device_edits(&self, device: &DeviceRef) -> Result<ContainerEdits, PrepareError> {
        let (id, card) = (device.to_string(), &device.device);
        if device.pool != self.pool || !self.cards().contains(card) {
            return Err(PrepareError::UnknownDevice { device: id });
        }
        if let Some(reason) = self.health(card).reason {
            return Err(PrepareError::Unhealthy { device: id, reason });
        }
        let edits = ContainerEdits::new()
            .with_device_node(DeviceNode::new(format!("/dev/{card}"), "rw"))
            .with_env("FPGA_CARDS", card.as_str());
        Ok(match &self.bitstreams {
            Some(dir) => edits.with_mount(Mount::bind(dir, dir, true)),
            None => edits,
        })
    }
}
