//! What the `:authority` layer costs a call: one small unary call (the plugin registration
//! service's GetInfo) over a Unix socket, the server behind the layer as every kubedev socket
//! is, and the same server straight on the socket. The client runs on its own runtime, as the
//! kubelet is another process, and sends `localhost`, which both can serve.
#![allow(clippy::unwrap_used, missing_docs)]

use std::path::Path;

use criterion::{Criterion, criterion_group, criterion_main};
use kubedev_kubelet_grpc::authority::incoming;
use kubedev_kubelet_grpc::pb::pluginregistration as reg;
use tokio::net::UnixListener;
use tokio_util::sync::CancellationToken;

struct Info;

#[tonic::async_trait]
impl reg::registration_server::Registration for Info {
    async fn get_info(
        &self,
        _: tonic::Request<reg::InfoRequest>,
    ) -> Result<tonic::Response<reg::PluginInfo>, tonic::Status> {
        Ok(tonic::Response::new(reg::PluginInfo {
            r#type: "DRAPlugin".into(),
            name: "gpu.example.com".into(),
            endpoint: "/var/lib/kubelet/plugins/gpu.example.com/dra.sock".into(),
            supported_versions: vec!["v1.DRAPlugin".into()],
        }))
    }

    async fn notify_registration_status(
        &self,
        _: tonic::Request<reg::RegistrationStatus>,
    ) -> Result<tonic::Response<reg::RegistrationStatusResponse>, tonic::Status> {
        Ok(tonic::Response::new(reg::RegistrationStatusResponse {}))
    }
}

fn serve(path: &Path, layer: bool, cancel: &CancellationToken) {
    let listener = UnixListener::bind(path).unwrap();
    let router = tonic::transport::Server::builder()
        .add_service(reg::registration_server::RegistrationServer::new(Info));
    let signal = cancel.clone().cancelled_owned();
    if layer {
        tokio::spawn(router.serve_with_incoming_shutdown(incoming(listener, path), signal));
    } else {
        let straight = tokio_stream::wrappers::UnixListenerStream::new(listener);
        tokio::spawn(router.serve_with_incoming_shutdown(straight, signal));
    }
}

fn layer(c: &mut Criterion) {
    let server = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let caller = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cancel = CancellationToken::new();
    let mut g = c.benchmark_group("authority_layer_get_info");
    for (name, with_layer) in [("through_the_layer", true), ("straight", false)] {
        let path = dir.path().join(format!("{name}.sock"));
        server.block_on(async { serve(&path, with_layer, &cancel) });
        let mut client = caller.block_on(async {
            let channel =
                tonic::transport::Endpoint::from_shared(format!("unix://{}", path.display()))
                    .unwrap()
                    .connect()
                    .await
                    .unwrap();
            reg::registration_client::RegistrationClient::new(channel)
        });
        g.bench_function(name, |b| {
            b.iter(|| {
                caller
                    .block_on(client.get_info(reg::InfoRequest {}))
                    .unwrap()
                    .into_inner()
            })
        });
    }
    g.finish();
    cancel.cancel();
}

criterion_group!(benches, layer);
criterion_main!(benches);
