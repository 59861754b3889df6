//! The worker's API writes: create, update and delete one ResourceSlice (with conflicts
//! re-read), and the check of what the server stored against what was sent.

use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::api::{DeleteParams, PostParams, Preconditions};
use tracing::{debug, info, warn};

use super::bump;
use super::overlay::resource_version;
use super::worker::{Step, Worker};
use crate::error::Error;
use crate::error::api_code;
use crate::features::dropped_from_slice;
use crate::plan::content_key;

impl Worker {
    /// Re-reads a slice after a conflict so the next pass plans from its current state.
    async fn reread(&mut self, name: &str) -> Result<(), Error> {
        self.limiter.acquire().await;
        match self.slices.get_opt(name).await {
            Ok(Some(slice)) => self.overlay.put(slice),
            Ok(None) => self.overlay.gone(name, None),
            Err(error) => {
                return Err(Error::Slice {
                    operation: "reading",
                    slice: name.to_owned(),
                    error: Box::new(error),
                });
            }
        }
        Ok(())
    }

    /// Notes when the server stored something other than what we sent. A gated field it
    /// dropped marks its feature unavailable and the slices are derived again without it (the
    /// next pass rewrites them); any other difference (the server's spelling of a quantity) is
    /// accepted as it is.
    fn check_stored(&mut self, sent: &ResourceSlice, stored: &ResourceSlice) {
        let name = stored.metadata.name.as_deref().unwrap_or_default();
        let mut news = false;
        for f in dropped_from_slice(&sent.spec, &stored.spec) {
            let found = format!(
                "the API server dropped {} from ResourceSlice {name} (feature gate {} is off)",
                f.fields(),
                f.gate()
            );
            if self.shared.api.dropped(f, found) {
                warn!(slice = %name, feature = f.gate(), "the API server dropped {} from a ResourceSlice; publishing without them", f.fields());
                news = true;
            }
        }
        if news {
            if let Err(e) = self.shared.rederive() {
                warn!(error = %kubedev_core::echo::Chain(&e), "deriving the ResourceSlices again failed");
            }
            return;
        }
        let sent_key = content_key(&sent.spec);
        let stored_key = content_key(&stored.spec);
        if sent_key != stored_key {
            debug!(slice = %name, "the API server stored the ResourceSlice in its own spelling");
            self.accepted.insert(sent_key, stored_key);
        }
    }

    pub(super) async fn delete(&mut self, slice: &ResourceSlice) -> Result<Step, Error> {
        let name = slice.metadata.name.clone().unwrap_or_default();
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: slice.metadata.uid.clone(),
                resource_version: slice.metadata.resource_version.clone(),
            }),
            ..DeleteParams::default()
        };
        self.limiter.acquire().await;
        match self.slices.delete(&name, &params).await {
            Ok(_) => {
                bump(&self.shared.counters.deletes);
                debug!(slice = %name, "deleted ResourceSlice");
                self.overlay.gone(&name, resource_version(slice));
                Ok(Step::Done)
            }
            Err(error) => match api_code(&error) {
                Some(404) => {
                    self.overlay.gone(&name, resource_version(slice));
                    Ok(Step::Done)
                }
                Some(409) => {
                    bump(&self.shared.counters.conflicts);
                    debug!(slice = %name, "conflict deleting ResourceSlice; re-reading");
                    self.reread(&name).await?;
                    Ok(Step::Conflict)
                }
                _ => Err(Error::Slice {
                    operation: "deleting",
                    slice: name,
                    error: Box::new(error),
                }),
            },
        }
    }

    pub(super) async fn update(&mut self, slice: &ResourceSlice) -> Result<Step, Error> {
        let name = slice.metadata.name.clone().unwrap_or_default();
        self.limiter.acquire().await;
        match self
            .slices
            .replace(&name, &PostParams::default(), slice)
            .await
        {
            Ok(stored) => {
                bump(&self.shared.counters.updates);
                debug!(slice = %name, generation = stored.spec.pool.generation, "updated ResourceSlice");
                self.check_stored(slice, &stored);
                self.overlay.put(stored);
                Ok(Step::Done)
            }
            Err(error) => match api_code(&error) {
                Some(code @ (404 | 409)) => {
                    if code == 409 {
                        bump(&self.shared.counters.conflicts);
                    }
                    debug!(slice = %name, "conflict updating ResourceSlice; re-reading");
                    self.reread(&name).await?;
                    Ok(Step::Conflict)
                }
                _ => Err(Error::Slice {
                    operation: "updating",
                    slice: name,
                    error: Box::new(error),
                }),
            },
        }
    }

    pub(super) async fn create(&mut self, slice: &ResourceSlice) -> Result<Step, Error> {
        self.limiter.acquire().await;
        match self.slices.create(&PostParams::default(), slice).await {
            Ok(stored) => {
                bump(&self.shared.counters.creates);
                info!(
                    slice = stored.metadata.name.as_deref().unwrap_or_default(),
                    pool = %stored.spec.pool.name,
                    generation = stored.spec.pool.generation,
                    "created ResourceSlice"
                );
                self.check_stored(slice, &stored);
                self.overlay.put(stored);
                Ok(Step::Done)
            }
            // A generated name that was taken: try again with a fresh one.
            Err(error) if api_code(&error) == Some(409) => {
                bump(&self.shared.counters.conflicts);
                Ok(Step::Conflict)
            }
            Err(error) => Err(Error::Slice {
                operation: "creating",
                slice: slice.metadata.generate_name.clone().unwrap_or_default(),
                error: Box::new(error),
            }),
        }
    }
}
