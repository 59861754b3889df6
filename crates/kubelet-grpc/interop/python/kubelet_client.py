"""The kubelet's side of kubedev's gRPC APIs, written with Python's grpcio.

Run by `cargo xtask interop` against `interop_target` (kubedev's servers with fixed answers):

    python kubelet_client.py --stubs DIR --target TARGET.json --authority default|raw

`--stubs` holds modules generated from kubedev's own .proto files with grpc_tools.protoc.
`--authority default` dials `unix:<path>` as grpcio does by default (it sends the socket path
percent-encoded as :authority); `raw` sets the path itself as the authority
(`grpc.default_authority`), as grpc-java and older grpc-go do.

The script also serves the kubelet's device-plugin Registration service on `kubelet.sock`, so
kubedev registers with a grpcio server. Each check prints `ok  <what>`; the first failure
prints `FAIL <what>: <why>` and exits 1.
"""

import argparse
import importlib
import json
import os
import queue
import sys
import threading
import time
import uuid
from concurrent import futures

import grpc

TIMEOUT = 10


class Failure(Exception):
    pass


def check(what, cond, why=""):
    if not cond:
        raise Failure(f"{what}: {why}")
    print(f"ok  {what}", flush=True)


def stubs(name):
    pb = importlib.import_module(f"{name}.api_pb2")
    grpc_mod = importlib.import_module(f"{name}.api_pb2_grpc")
    return pb, grpc_mod


def channel(path, authority):
    if authority == "raw":
        return grpc.insecure_channel(
            f"unix:{path}", options=[("grpc.default_authority", path)]
        )
    return grpc.insecure_channel(f"unix:{path}")


def registration(info, authority):
    pb, rpc = stubs("pluginregistration.v1")
    with channel(info["registration_socket"], authority) as ch:
        client = rpc.RegistrationStub(ch)
        got = client.GetInfo(pb.InfoRequest(), timeout=TIMEOUT)
        check("registration GetInfo type", got.type == "DRAPlugin", got.type)
        check("registration GetInfo name", got.name == info["driver"], got.name)
        check(
            "registration GetInfo endpoint",
            got.endpoint == info["dra_socket"],
            got.endpoint,
        )
        want = {
            "v1.DRAPlugin",
            "v1beta1.DRAPlugin",
            "v1.DRAResourceHealth",
            "v1alpha1.DRAResourceHealth",
        }
        check(
            "registration GetInfo versions",
            want <= set(got.supported_versions),
            list(got.supported_versions),
        )
        client.NotifyRegistrationStatus(
            pb.RegistrationStatus(plugin_registered=True), timeout=TIMEOUT
        )
        check("registration NotifyRegistrationStatus", True)
        return got.endpoint


def dra(endpoint, version, authority, seen):
    pb, rpc = stubs(f"dra.{version}")
    good = str(uuid.uuid4())
    bad = str(uuid.uuid4())
    with channel(endpoint, authority) as ch:
        client = rpc.DRAPluginStub(ch)
        reply = client.NodePrepareResources(
            pb.NodePrepareResourcesRequest(
                claims=[
                    pb.Claim(namespace="default", uid=good, name="claim-a"),
                    pb.Claim(namespace="default", uid=bad, name="unallocated-b"),
                ]
            ),
            timeout=TIMEOUT,
        )
        ok = reply.claims[good]
        check(f"dra {version} prepare answers without error", ok.error == "", ok.error)
        devices = list(ok.devices)
        check(f"dra {version} prepare gives one device", len(devices) == 1, devices)
        d = devices[0]
        check(
            f"dra {version} prepared device",
            (list(d.request_names), d.pool_name, d.device_name)
            == (["gpu"], "node-a", "gpu-0")
            and len(d.cdi_device_ids) == 1
            and good in d.cdi_device_ids[0],
            d,
        )
        check(
            f"dra {version} per-claim error for an unallocated claim",
            "not allocated" in reply.claims[bad].error,
            reply.claims[bad].error,
        )
        reply = client.NodeUnprepareResources(
            pb.NodeUnprepareResourcesRequest(
                claims=[pb.Claim(namespace="default", uid=good, name="claim-a")]
            ),
            timeout=TIMEOUT,
        )
        check(
            f"dra {version} unprepare",
            reply.claims[good].error == "",
            reply.claims[good].error,
        )
    seen.append(good)


def health(endpoint, version, authority):
    pb, rpc = stubs(f"drahealth.{version}")
    with channel(endpoint, authority) as ch:
        client = rpc.DRAResourceHealthStub(ch)
        stream = client.NodeWatchResources(
            pb.NodeWatchResourcesRequest(), timeout=TIMEOUT
        )
        first = next(stream)
        devices = [
            (d.device.pool_name, d.device.device_name, pb.HealthStatus.Name(d.health))
            for d in first.devices
        ]
        check(
            f"health {version} first snapshot",
            ("node-a", "gpu-0", "HEALTHY") in devices,
            devices,
        )
        timeouts = [d.health_check_timeout_seconds for d in first.devices]
        check(f"health {version} timeout", timeouts == [3], timeouts)
        # Unchanged health is sent again within a third of the timeout, before the kubelet
        # would show the device as unknown.
        started = time.monotonic()
        second = next(stream)
        waited = time.monotonic() - started
        check(
            f"health {version} repeated within the timeout",
            len(second.devices) == 1 and 0.05 <= waited < 3,
            f"{len(second.devices)} devices after {waited:.2f} s",
        )
        stream.cancel()


class Kubelet:
    """The kubelet's device-plugin Registration service on kubelet.sock."""

    def __init__(self, pb, rpc, directory):
        self.requests = queue.Queue()
        self.path = os.path.join(directory, "kubelet.sock")
        if os.path.exists(self.path):
            os.remove(self.path)
        outer = self

        class Registration(rpc.RegistrationServicer):
            def Register(self, request, context):
                outer.requests.put(request)
                return pb.Empty()

        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        rpc.add_RegistrationServicer_to_server(Registration(), self.server)
        self.server.add_insecure_port(f"unix:{self.path}")
        self.server.start()

    def stop(self):
        self.server.stop(None).wait()
        if os.path.exists(self.path):
            os.remove(self.path)


def device_plugin(info, authority):
    pb, rpc = stubs("deviceplugin.v1beta1")
    kubelet = Kubelet(pb, rpc, info["device_plugin_dir"])
    try:
        try:
            request = kubelet.requests.get(timeout=20)
        except queue.Empty:
            raise Failure("device plugin Register: kubedev did not register in 20 s")
        check("device plugin Register version", request.version == "v1beta1", request.version)
        check(
            "device plugin Register resource",
            request.resource_name == info["resource"],
            request.resource_name,
        )
        check(
            "device plugin Register endpoint",
            request.endpoint == os.path.basename(info["device_plugin_socket"]),
            request.endpoint,
        )
        check(
            "device plugin Register options",
            request.options.pre_start_required
            and request.options.get_preferred_allocation_available,
            request.options,
        )
        path = os.path.join(info["device_plugin_dir"], request.endpoint)
        with channel(path, authority) as ch:
            client = rpc.DevicePluginStub(ch)
            options = client.GetDevicePluginOptions(pb.Empty(), timeout=TIMEOUT)
            check("device plugin GetDevicePluginOptions", options.pre_start_required, options)
            stream = client.ListAndWatch(pb.Empty(), timeout=TIMEOUT)
            first = next(stream)
            devices = sorted(
                (d.ID, d.health, [n.ID for n in d.topology.nodes]) for d in first.devices
            )
            check(
                "device plugin ListAndWatch",
                devices == [("dev-0", "Healthy", [0]), ("dev-1", "Healthy", [1])],
                devices,
            )
            stream.cancel()
            preferred = client.GetPreferredAllocation(
                pb.PreferredAllocationRequest(
                    container_requests=[
                        pb.ContainerPreferredAllocationRequest(
                            available_deviceIDs=["dev-0", "dev-1"], allocation_size=1
                        )
                    ]
                ),
                timeout=TIMEOUT,
            )
            ids = list(preferred.container_responses[0].deviceIDs)
            check(
                "device plugin GetPreferredAllocation",
                len(ids) == 1 and ids[0] in ("dev-0", "dev-1"),
                ids,
            )
            allocated = client.Allocate(
                pb.AllocateRequest(
                    container_requests=[pb.ContainerAllocateRequest(devices_ids=["dev-1"])]
                ),
                timeout=TIMEOUT,
            )
            response = allocated.container_responses[0]
            check(
                "device plugin Allocate",
                response.envs.get("KUBEDEV_DEVICES") == "dev-1"
                and [d.host_path for d in response.devices] == ["/dev/dev-1"],
                response,
            )
            client.PreStartContainer(
                pb.PreStartContainerRequest(devices_ids=["dev-1"]), timeout=TIMEOUT
            )
            check("device plugin PreStartContainer", True)
    finally:
        kubelet.stop()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--stubs", required=True)
    parser.add_argument("--target", required=True)
    parser.add_argument("--authority", choices=["default", "raw"], required=True)
    args = parser.parse_args()
    sys.path.insert(0, args.stubs)
    with open(args.target) as f:
        info = json.load(f)
    print(f"grpcio {grpc.__version__}, authority: {args.authority}", flush=True)
    try:
        endpoint = registration(info, args.authority)
        prepared = []
        for version in ("v1", "v1beta1"):
            dra(endpoint, version, args.authority, prepared)
        for version in ("v1", "v1alpha1"):
            health(endpoint, version, args.authority)
        device_plugin(info, args.authority)
    except Failure as e:
        print(f"FAIL {e}", flush=True)
        return 1
    except grpc.RpcError as e:
        print(f"FAIL gRPC call: {e.code()}: {e.details()}", flush=True)
        return 1
    except Exception as e:  # a broken answer: say what it was, not just a traceback
        print(f"FAIL {type(e).__name__}: {e}", flush=True)
        return 1
    print(json.dumps({"prepared": prepared}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
