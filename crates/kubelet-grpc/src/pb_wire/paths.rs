//! Service names and method paths: every RPC the kubelet makes or serves reaches the handler
//! of the same name in our servers, paths the kubelet does not use are refused, and our clients
//! call the kubelet's paths.

use parking_lot::Mutex;
use std::convert::Infallible;
use std::fmt::Debug;
use std::sync::Arc;

use tonic::codegen::http;
use tonic::{Code, Request, Response, Status};

use crate::pb::deviceplugin::v1beta1 as dp;
use crate::pb::dra::v1 as dra_v1;
use crate::pb::dra::v1beta1 as dra_v1beta1;
use crate::pb::drahealth::v1 as health_v1;
use crate::pb::drahealth::v1alpha1 as health_v1alpha1;
use crate::pb::pluginregistration as reg;

/// Every RPC the kubelet makes or serves: its full HTTP/2 path, and the name
/// of the method in our generated trait that must answer it.
const METHODS: &[(&str, &str)] = &[
    ("/v1beta1.Registration/Register", "Register"),
    (
        "/v1beta1.DevicePlugin/GetDevicePluginOptions",
        "GetDevicePluginOptions",
    ),
    ("/v1beta1.DevicePlugin/ListAndWatch", "ListAndWatch"),
    (
        "/v1beta1.DevicePlugin/GetPreferredAllocation",
        "GetPreferredAllocation",
    ),
    ("/v1beta1.DevicePlugin/Allocate", "Allocate"),
    (
        "/v1beta1.DevicePlugin/PreStartContainer",
        "PreStartContainer",
    ),
    ("/pluginregistration.Registration/GetInfo", "GetInfo"),
    (
        "/pluginregistration.Registration/NotifyRegistrationStatus",
        "NotifyRegistrationStatus",
    ),
    (
        "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources",
        "v1.NodePrepareResources",
    ),
    (
        "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeUnprepareResources",
        "v1.NodeUnprepareResources",
    ),
    (
        "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodePrepareResources",
        "v1beta1.NodePrepareResources",
    ),
    (
        "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodeUnprepareResources",
        "v1beta1.NodeUnprepareResources",
    ),
    (
        "/v1alpha1.DRAResourceHealth/NodeWatchResources",
        "v1alpha1.NodeWatchResources",
    ),
    (
        "/v1.DRAResourceHealth/NodeWatchResources",
        "v1.NodeWatchResources",
    ),
];

#[test]
fn service_names_are_the_kubelets() {
    assert_eq!(
        dp::registration_server::SERVICE_NAME,
        "v1beta1.Registration"
    );
    assert_eq!(
        dp::device_plugin_server::SERVICE_NAME,
        "v1beta1.DevicePlugin"
    );
    assert_eq!(
        reg::registration_server::SERVICE_NAME,
        "pluginregistration.Registration"
    );
    assert_eq!(
        dra_v1::dra_plugin_server::SERVICE_NAME,
        "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin"
    );
    assert_eq!(
        dra_v1beta1::dra_plugin_server::SERVICE_NAME,
        "k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin"
    );
    assert_eq!(
        health_v1alpha1::dra_resource_health_server::SERVICE_NAME,
        "v1alpha1.DRAResourceHealth"
    );
    assert_eq!(
        health_v1::dra_resource_health_server::SERVICE_NAME,
        "v1.DRAResourceHealth"
    );
}

/// Implements every generated server trait; each method fails with
/// `ABORTED` and its own name, so a test can see which handler a path
/// reached.
#[derive(Debug, Clone, Copy)]
struct Marker;

fn reached(method: &str) -> Status {
    Status::aborted(method)
}

type Never<T> = futures::stream::Empty<Result<T, Status>>;

#[tonic::async_trait]
impl dp::registration_server::Registration for Marker {
    async fn register(
        &self,
        _: Request<dp::RegisterRequest>,
    ) -> Result<Response<dp::Empty>, Status> {
        Err(reached("Register"))
    }
}

#[tonic::async_trait]
impl dp::device_plugin_server::DevicePlugin for Marker {
    type ListAndWatchStream = Never<dp::ListAndWatchResponse>;

    async fn get_device_plugin_options(
        &self,
        _: Request<dp::Empty>,
    ) -> Result<Response<dp::DevicePluginOptions>, Status> {
        Err(reached("GetDevicePluginOptions"))
    }
    async fn list_and_watch(
        &self,
        _: Request<dp::Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        Err(reached("ListAndWatch"))
    }
    async fn get_preferred_allocation(
        &self,
        _: Request<dp::PreferredAllocationRequest>,
    ) -> Result<Response<dp::PreferredAllocationResponse>, Status> {
        Err(reached("GetPreferredAllocation"))
    }
    async fn allocate(
        &self,
        _: Request<dp::AllocateRequest>,
    ) -> Result<Response<dp::AllocateResponse>, Status> {
        Err(reached("Allocate"))
    }
    async fn pre_start_container(
        &self,
        _: Request<dp::PreStartContainerRequest>,
    ) -> Result<Response<dp::PreStartContainerResponse>, Status> {
        Err(reached("PreStartContainer"))
    }
}

#[tonic::async_trait]
impl reg::registration_server::Registration for Marker {
    async fn get_info(
        &self,
        _: Request<reg::InfoRequest>,
    ) -> Result<Response<reg::PluginInfo>, Status> {
        Err(reached("GetInfo"))
    }
    async fn notify_registration_status(
        &self,
        _: Request<reg::RegistrationStatus>,
    ) -> Result<Response<reg::RegistrationStatusResponse>, Status> {
        Err(reached("NotifyRegistrationStatus"))
    }
}

#[tonic::async_trait]
impl dra_v1::dra_plugin_server::DraPlugin for Marker {
    async fn node_prepare_resources(
        &self,
        _: Request<dra_v1::NodePrepareResourcesRequest>,
    ) -> Result<Response<dra_v1::NodePrepareResourcesResponse>, Status> {
        Err(reached("v1.NodePrepareResources"))
    }
    async fn node_unprepare_resources(
        &self,
        _: Request<dra_v1::NodeUnprepareResourcesRequest>,
    ) -> Result<Response<dra_v1::NodeUnprepareResourcesResponse>, Status> {
        Err(reached("v1.NodeUnprepareResources"))
    }
}

#[tonic::async_trait]
impl dra_v1beta1::dra_plugin_server::DraPlugin for Marker {
    async fn node_prepare_resources(
        &self,
        _: Request<dra_v1beta1::NodePrepareResourcesRequest>,
    ) -> Result<Response<dra_v1beta1::NodePrepareResourcesResponse>, Status> {
        Err(reached("v1beta1.NodePrepareResources"))
    }
    async fn node_unprepare_resources(
        &self,
        _: Request<dra_v1beta1::NodeUnprepareResourcesRequest>,
    ) -> Result<Response<dra_v1beta1::NodeUnprepareResourcesResponse>, Status> {
        Err(reached("v1beta1.NodeUnprepareResources"))
    }
}

#[tonic::async_trait]
impl health_v1alpha1::dra_resource_health_server::DraResourceHealth for Marker {
    type NodeWatchResourcesStream = Never<health_v1alpha1::NodeWatchResourcesResponse>;

    async fn node_watch_resources(
        &self,
        _: Request<health_v1alpha1::NodeWatchResourcesRequest>,
    ) -> Result<Response<Self::NodeWatchResourcesStream>, Status> {
        Err(reached("v1alpha1.NodeWatchResources"))
    }
}

#[tonic::async_trait]
impl health_v1::dra_resource_health_server::DraResourceHealth for Marker {
    type NodeWatchResourcesStream = Never<health_v1::NodeWatchResourcesResponse>;

    async fn node_watch_resources(
        &self,
        _: Request<health_v1::NodeWatchResourcesRequest>,
    ) -> Result<Response<Self::NodeWatchResourcesStream>, Status> {
        Err(reached("v1.NodeWatchResources"))
    }
}

/// Sends a gRPC request carrying one empty message (a frame of five zero
/// bytes: not compressed, length 0) to `path`, and returns the gRPC status
/// code and message of the answer.
async fn call_path<S>(service: S, path: &str) -> (i32, String)
where
    S: tower::Service<
            http::Request<String>,
            Response = http::Response<tonic::body::Body>,
            Error = Infallible,
        >,
{
    use tower::ServiceExt as _;

    let request = http::Request::builder()
        .method("POST")
        .uri(path)
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(String::from("\0\0\0\0\0"))
        .unwrap();
    let response = service.oneshot(request).await.unwrap();
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .map(|v| v.to_str().unwrap().to_owned())
            .unwrap_or_default()
    };
    let code = header("grpc-status").parse().unwrap();
    (code, header("grpc-message"))
}

/// Routes `path` through whichever generated server owns its service.
async fn serve_path(path: &str) -> (i32, String) {
    let service = path.trim_start_matches('/').split('/').next().unwrap();
    match service {
        "v1beta1.Registration" => {
            call_path(
                dp::registration_server::RegistrationServer::new(Marker),
                path,
            )
            .await
        }
        "v1beta1.DevicePlugin" => {
            call_path(
                dp::device_plugin_server::DevicePluginServer::new(Marker),
                path,
            )
            .await
        }
        "pluginregistration.Registration" => {
            call_path(
                reg::registration_server::RegistrationServer::new(Marker),
                path,
            )
            .await
        }
        "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin" => {
            call_path(
                dra_v1::dra_plugin_server::DraPluginServer::new(Marker),
                path,
            )
            .await
        }
        "k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin" => {
            call_path(
                dra_v1beta1::dra_plugin_server::DraPluginServer::new(Marker),
                path,
            )
            .await
        }
        "v1alpha1.DRAResourceHealth" => {
            call_path(
                health_v1alpha1::dra_resource_health_server::DraResourceHealthServer::new(Marker),
                path,
            )
            .await
        }
        "v1.DRAResourceHealth" => {
            call_path(
                health_v1::dra_resource_health_server::DraResourceHealthServer::new(Marker),
                path,
            )
            .await
        }
        other => panic!("no server for service {other:?} in {path:?}"),
    }
}

#[tokio::test]
async fn servers_answer_the_kubelets_method_paths() {
    for (path, method) in METHODS {
        assert_eq!(
            serve_path(path).await,
            (Code::Aborted as i32, (*method).to_owned()),
            "{path} must reach the {method} handler"
        );
    }
}

#[tokio::test]
async fn servers_reject_paths_the_kubelet_does_not_use() {
    for path in [
        "/v1beta1.DevicePlugin/Nonexistent",
        "/v1beta1.DevicePlugin/listAndWatch",
        "/pluginregistration.Registration/Register",
        "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeWatchResources",
        "/v1.DRAResourceHealth/WatchResources",
    ] {
        assert_eq!(
            serve_path(path).await.0,
            Code::Unimplemented as i32,
            "{path}"
        );
    }
}

/// The request paths a [`recording_transport`] has seen, in order.
type SeenPaths = Arc<Mutex<Vec<String>>>;

/// A stand-in transport for the generated clients: records the path of
/// every request and answers each with `UNIMPLEMENTED`.
fn recording_transport() -> (
    impl tower::Service<
        http::Request<tonic::body::Body>,
        Response = http::Response<tonic::body::Body>,
        Error = Infallible,
    > + Clone,
    SeenPaths,
) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let recorder = Arc::clone(&seen);
    let transport = tower::service_fn(move |request: http::Request<tonic::body::Body>| {
        let recorder = Arc::clone(&recorder);
        async move {
            recorder.lock().push(request.uri().path().to_owned());
            let mut response = http::Response::new(tonic::body::Body::empty());
            response
                .headers_mut()
                .insert("grpc-status", http::HeaderValue::from_static("12"));
            Ok::<_, Infallible>(response)
        }
    });
    (transport, seen)
}

#[tokio::test]
async fn clients_call_the_kubelets_method_paths() {
    let (transport, seen) = recording_transport();

    // Every call fails (the transport answers UNIMPLEMENTED); only the paths
    // matter here.
    let mut c = dp::registration_client::RegistrationClient::new(transport.clone());
    assert!(c.register(dp::RegisterRequest::default()).await.is_err());

    let mut c = dp::device_plugin_client::DevicePluginClient::new(transport.clone());
    assert!(c.get_device_plugin_options(dp::Empty {}).await.is_err());
    assert!(c.list_and_watch(dp::Empty {}).await.is_err());
    assert!(
        c.get_preferred_allocation(dp::PreferredAllocationRequest::default())
            .await
            .is_err()
    );
    assert!(c.allocate(dp::AllocateRequest::default()).await.is_err());
    assert!(
        c.pre_start_container(dp::PreStartContainerRequest::default())
            .await
            .is_err()
    );

    let mut c = reg::registration_client::RegistrationClient::new(transport.clone());
    assert!(c.get_info(reg::InfoRequest {}).await.is_err());
    assert!(
        c.notify_registration_status(reg::RegistrationStatus::default())
            .await
            .is_err()
    );

    let mut c = dra_v1::dra_plugin_client::DraPluginClient::new(transport.clone());
    assert!(
        c.node_prepare_resources(dra_v1::NodePrepareResourcesRequest::default())
            .await
            .is_err()
    );
    assert!(
        c.node_unprepare_resources(dra_v1::NodeUnprepareResourcesRequest::default())
            .await
            .is_err()
    );

    let mut c = dra_v1beta1::dra_plugin_client::DraPluginClient::new(transport.clone());
    assert!(
        c.node_prepare_resources(dra_v1beta1::NodePrepareResourcesRequest::default())
            .await
            .is_err()
    );
    assert!(
        c.node_unprepare_resources(dra_v1beta1::NodeUnprepareResourcesRequest::default())
            .await
            .is_err()
    );

    let mut c = health_v1alpha1::dra_resource_health_client::DraResourceHealthClient::new(
        transport.clone(),
    );
    assert!(
        c.node_watch_resources(health_v1alpha1::NodeWatchResourcesRequest {})
            .await
            .is_err()
    );

    let mut c = health_v1::dra_resource_health_client::DraResourceHealthClient::new(transport);
    assert!(
        c.node_watch_resources(health_v1::NodeWatchResourcesRequest {})
            .await
            .is_err()
    );

    let expected: Vec<&str> = METHODS.iter().map(|(path, _)| *path).collect();
    assert_eq!(*seen.lock(), expected);
}
