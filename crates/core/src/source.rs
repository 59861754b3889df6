//! The `DeviceSource` trait: how a backend tells the runtime what devices exist.

use async_trait::async_trait;
use tokio::sync::mpsc;

use crate::error::SourceError;
use crate::model::{DeviceRef, Health, Pool};

/// Where a backend's [`DeviceSource::watch`] sends its events; `send(event).await` fails once
/// nobody listens any more.
pub type EventSender = mpsc::Sender<SourceEvent>;

/// A change a backend noticed after discovery.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum SourceEvent {
    /// One device's health changed (also used when it recovers).
    Health {
        /// The device.
        device: DeviceRef,
        /// Its new health.
        health: Health,
    },
    /// Devices appeared or disappeared: the runtime calls `discover` again.
    Rediscover,
}

/// A backend's view of its devices.
///
/// Contract:
/// - `discover` is side-effect free on the host: it reads (sysfs, `/dev`, a driver library) and
///   returns the backend's pools. Device names are unique within a pool and pool names are unique
///   across the backends of one node; the runtime rejects an inventory that breaks this.
/// - `discover` may be called again at any time (after a [`SourceEvent::Rediscover`], on a config
///   reload) and must return the same names for the same hardware, so claims keep pointing at the
///   right device.
/// - `watch` runs for as long as the runtime wants events and is cancelled by dropping its future;
///   it sends events into `events` and returns when it has nothing more to watch (a backend that
///   cannot watch returns `Ok(())` at once). A closed channel means nobody listens: return.
/// - `discover` and `watch` may run concurrently with each other and with the backend's
///   [`Preparer`](crate::prepare::Preparer) methods.
#[async_trait]
pub trait DeviceSource: Send + Sync + 'static {
    /// A short name for logs, e.g. `nvidia`. A daemon names each backend by the kind it was
    /// registered under and does not ask; the default is the type's name without its path.
    fn name(&self) -> &str {
        let full = std::any::type_name::<Self>();
        let plain = full.split('<').next().unwrap_or(full);
        plain.rsplit("::").next().unwrap_or(plain)
    }

    /// Finds the devices this backend offers now.
    async fn discover(&self) -> Result<Vec<Pool>, SourceError>;

    /// Sends health and hot-plug changes until cancelled; the default watches nothing.
    async fn watch(&self, events: EventSender) -> Result<(), SourceError> {
        let _ = events;
        Ok(())
    }
}
