//! The `fpga` backend: FPGA cards found in sysfs. Walked through in docs/writing-a-backend.md.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use async_trait::async_trait;
use kubedev_core::factory::{BackendFactory, BuildContext, Section, SectionError, typed};
use kubedev_core::{
    BackendContext, ContainerEdits, Device, DeviceName, DeviceNode, DeviceRef, DeviceSource,
    Health, HostFs, Mount, Pool, PoolName, PrepareError, SourceError, SourceEvent,
    StatelessPreparer, watch_by_rescan,
};
use serde::Deserialize;
use tokio::sync::{Mutex, mpsc};

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
        let paths = [("cardsRoot", &self.cards_root), ("bitstreamDir", &self.bitstream_dir)];
        match paths.into_iter().find(|(_, p)| p.as_ref().is_some_and(|p| p.is_relative())) {
            Some((f, Some(p))) => Err(SectionError::new(f, format!("{p:?} must be absolute"))),
            _ => Ok(()),
        }
    }
}

/// The backend kind the driver's main registers: `backends.fpga` builds an [`FpgaBackend`].
pub fn factory() -> impl BackendFactory {
    typed("fpga", |config: FpgaConfig, ctx: &BuildContext| FpgaBackend::new(config, &ctx.backend))
}

/// The FPGA cards of one node, published in the pool `<node>-fpga`.
#[derive(Debug)]
pub struct FpgaBackend {
    host: HostFs,
    root: PathBuf,
    bitstreams: Option<String>,
    pool: PoolName,
    /// Card → the health last reported; discover and watch share it.
    known: Mutex<BTreeMap<DeviceName, Health>>,
}

impl FpgaBackend {
    pub fn new(config: FpgaConfig, ctx: &BackendContext) -> Result<Self, SectionError> {
        let pool = PoolName::new(format!("{}-fpga", ctx.node_name));
        let pool = pool.map_err(|e| SectionError::new("", e.to_string()))?;
        let root = config.cards_root.unwrap_or("/sys/class/fpga_manager".into());
        let bitstreams = config.bitstream_dir.map(|d| d.display().to_string());
        Ok(FpgaBackend { host: ctx.host.clone(), root, bitstreams, pool, known: Mutex::default() })
    }

    /// The cards (`fpga0`, `fpga1`, …), sorted; an entry that is no device name is skipped.
    fn cards(&self) -> Vec<DeviceName> {
        let entries = self.host.list_dir(&self.root).unwrap_or_default().into_iter();
        entries.filter(|n| n.starts_with("fpga")).filter_map(|n| DeviceName::new(n).ok()).collect()
    }

    fn health(&self, card: &DeviceName) -> Health {
        match self.host.read_attr(self.root.join(card.as_str()).join("state")) {
            Ok(state) if state == "operating" => Health::healthy(),
            Ok(state) => Health::unhealthy(format!("state is {state:?}")),
            Err(e) => Health::unhealthy(e.to_string()),
        }
    }

    /// Health events for the cards discovered whose health is not the one last reported.
    async fn health_changes(&self) -> Vec<SourceEvent> {
        let mut changes = Vec::new();
        for (card, reported) in self.known.lock().await.iter_mut() {
            let health = self.health(card);
            if *reported != health {
                *reported = health.clone();
                let device = DeviceRef { pool: self.pool.clone(), device: card.clone() };
                changes.push(SourceEvent::Health { device, health });
            }
        }
        changes
    }
}

#[async_trait]
impl DeviceSource for FpgaBackend {
    fn name(&self) -> &str {
        "fpga"
    }

    async fn discover(&self) -> Result<Vec<Pool>, SourceError> {
        let (mut devices, mut known) = (Vec::new(), self.known.lock().await);
        known.clear();
        for card in self.cards() {
            let mut device = Device::new(card.clone());
            device.health = self.health(&card);
            known.insert(card, device.health.clone());
            devices.push(device);
        }
        Ok(vec![Pool::new(self.pool.clone(), devices)])
    }

    /// Polls the `state` of every card discovered; a change (a card gone too) is a health event.
    async fn watch(&self, events: mpsc::Sender<SourceEvent>) -> Result<(), SourceError> {
        let every = Duration::from_millis(200);
        watch_by_rescan(events, every, Vec::new, || self.health_changes()).await
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
        let mut edits = ContainerEdits::default();
        edits.device_nodes.push(DeviceNode::new(format!("/dev/{card}"), "rw"));
        edits.env.insert("FPGA_CARDS".into(), card.to_string());
        edits.mounts.extend(self.bitstreams.iter().map(|dir| Mount::bind(dir, dir, true)));
        Ok(edits)
    }
}
