//! The plugin registration service the kubelet's plugin watcher talks to.

use tokio::sync::watch;
use tonic::{Request, Response, Status};

use super::DraStatus;
use crate::pb::pluginregistration as api;

pub(super) struct RegistrationService {
    pub(super) info: api::PluginInfo,
    pub(super) status: watch::Sender<DraStatus>,
}

#[tonic::async_trait]
impl api::registration_server::Registration for RegistrationService {
    async fn get_info(
        &self,
        _request: Request<api::InfoRequest>,
    ) -> Result<Response<api::PluginInfo>, Status> {
        Ok(Response::new(self.info.clone()))
    }

    async fn notify_registration_status(
        &self,
        request: Request<api::RegistrationStatus>,
    ) -> Result<Response<api::RegistrationStatusResponse>, Status> {
        let s = request.into_inner();
        if s.plugin_registered {
            tracing::info!(driver = %self.info.name, "the kubelet registered the DRA plugin");
            self.status.send_modify(|st| {
                st.registered = true;
                st.registrations += 1;
                st.last_error = None;
            });
        } else {
            tracing::error!(driver = %self.info.name, error = %s.error, "the kubelet rejected the DRA plugin");
            self.status.send_modify(|st| {
                st.registered = false;
                st.last_error = Some(s.error.clone());
            });
        }
        Ok(Response::new(api::RegistrationStatusResponse {}))
    }
}
