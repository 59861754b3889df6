// Command kubelet-client is the kubelet's side of kubedev's kubelet-facing gRPC APIs, written
// with the kubelet's own generated stubs (module k8s.io/kubelet) and the grpc-go that module
// requires, dialing exactly as the kubelet does.
//
// Built by run.sh in module mode (go.mod and go.sum beside this file pin the versions); run as
// `kubelet-client TARGET.json`, where TARGET.json is interop_target's first line.
//
// Each check prints `ok  <what>`; the first failure prints `FAIL <what>: <why>` and exits 1.
// On success the last line is JSON: {"prepared": [claim UIDs prepared and unprepared]}.
package main

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	dp "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	healthv1 "k8s.io/kubelet/pkg/apis/dra-health/v1"
	healthv1alpha1 "k8s.io/kubelet/pkg/apis/dra-health/v1alpha1"
	drav1 "k8s.io/kubelet/pkg/apis/dra/v1"
	drav1beta1 "k8s.io/kubelet/pkg/apis/dra/v1beta1"
	reg "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// timeout is the kubelet's connection timeout for plugin sockets, used for each call too.
const timeout = 10 * time.Second

type targetInfo struct {
	Driver             string `json:"driver"`
	Resource           string `json:"resource"`
	RegistrationSocket string `json:"registration_socket"`
	DRASocket          string `json:"dra_socket"`
	DevicePluginDir    string `json:"device_plugin_dir"`
	DevicePluginSocket string `json:"device_plugin_socket"`
}

// failure is what a failed check panics with; main turns it into `FAIL ...` and exit 1.
type failure struct{ msg string }

func fail(what string, format string, args ...interface{}) {
	panic(failure{fmt.Sprintf("%s: %s", what, fmt.Sprintf(format, args...))})
}

func check(what string, cond bool, format string, args ...interface{}) {
	if !cond {
		fail(what, format, args...)
	}
	fmt.Printf("ok  %s\n", what)
}

// must fails `what` when a call returned an error, naming its gRPC status.
func must(what string, err error) {
	if err == nil {
		return
	}
	if s, ok := status.FromError(err); ok {
		fail(what, "gRPC error %s: %s", s.Code(), s.Message())
	}
	fail(what, "%v", err)
}

// unixDialer is the context dialer the kubelet passes for plugin sockets.
func unixDialer(ctx context.Context, addr string) (net.Conn, error) {
	return (&net.Dialer{}).DialContext(ctx, "unix", addr)
}

// dialPluginWatcher dials as the plugin watcher does
// (pkg/kubelet/pluginmanager/operationexecutor/operation_generator.go, dial()).
func dialPluginWatcher(path string) *grpc.ClientConn {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	conn, err := grpc.DialContext(ctx, path,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithBlock(),
		grpc.WithContextDialer(unixDialer),
	)
	must("dial "+path+" (plugin watcher style)", err)
	return conn
}

// dialDRARaw dials a DRA endpoint as the kubelet's DRA manager did before grpc.NewClient:
// the raw path as target, a unix context dialer, no authority, not blocking.
func dialDRARaw(path string) *grpc.ClientConn {
	conn, err := grpc.Dial(path,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(unixDialer),
	)
	must("dial "+path+" (DRA, raw path + unix dialer)", err)
	return conn
}

// dialDRAUnix dials a DRA endpoint as newer kubelets do
// (pkg/kubelet/cm/dra/plugin/dra_plugin_manager.go): grpc.NewClient("unix:"+endpoint) with
// insecure credentials, connecting on the first call.
func dialDRAUnix(path string) *grpc.ClientConn {
	conn, err := grpc.NewClient("unix:"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	must("dial unix:"+path+" (DRA, unix: target)", err)
	return conn
}

// dialDevicePlugin dials as the device manager does
// (pkg/kubelet/cm/devicemanager/plugin/v1beta1/client.go, dial()).
func dialDevicePlugin(path string) *grpc.ClientConn {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	conn, err := grpc.DialContext(ctx, path,
		grpc.WithAuthority("localhost"),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithBlock(),
		grpc.WithContextDialer(unixDialer),
	)
	must("dial "+path+" (device manager style)", err)
	return conn
}

func callCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), timeout)
}

func newUID() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		fail("claim UID", "%v", err)
	}
	b[6] = (b[6] & 0x0f) | 0x40
	b[8] = (b[8] & 0x3f) | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func registration(info targetInfo) string {
	conn := dialPluginWatcher(info.RegistrationSocket)
	defer conn.Close()
	client := reg.NewRegistrationClient(conn)
	ctx, cancel := callCtx()
	defer cancel()
	got, err := client.GetInfo(ctx, &reg.InfoRequest{})
	must("registration GetInfo", err)
	check("registration GetInfo type", got.Type == "DRAPlugin", "got %q, want DRAPlugin", got.Type)
	check("registration GetInfo name", got.Name == info.Driver, "got %q, want %q", got.Name, info.Driver)
	check("registration GetInfo endpoint", got.Endpoint == info.DRASocket,
		"got %q, want %q", got.Endpoint, info.DRASocket)
	var missing []string
	for _, v := range []string{"v1.DRAPlugin", "v1beta1.DRAPlugin", "v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"} {
		if !contains(got.SupportedVersions, v) {
			missing = append(missing, v)
		}
	}
	check("registration GetInfo versions", len(missing) == 0,
		"missing %v in %v", missing, got.SupportedVersions)
	_, err = client.NotifyRegistrationStatus(ctx, &reg.RegistrationStatus{PluginRegistered: true})
	must("registration NotifyRegistrationStatus", err)
	check("registration NotifyRegistrationStatus", true, "")
	return got.Endpoint
}

// draDevice is a prepared device, the same for v1 and v1beta1.
type draDevice struct {
	requestNames []string
	pool, name   string
	cdiIDs       []string
}

type claimResult struct {
	devices []draDevice
	err     string
}

// draAPI hides the difference between the v1 and v1beta1 stubs.
type draAPI interface {
	prepare(ctx context.Context, claims [][3]string) (map[string]claimResult, error)
	unprepare(ctx context.Context, claims [][3]string) (map[string]string, error)
}

type draV1 struct{ c drav1.DRAPluginClient }

func (d draV1) prepare(ctx context.Context, claims [][3]string) (map[string]claimResult, error) {
	req := &drav1.NodePrepareResourcesRequest{}
	for _, c := range claims {
		req.Claims = append(req.Claims, &drav1.Claim{Namespace: c[0], Uid: c[1], Name: c[2]})
	}
	resp, err := d.c.NodePrepareResources(ctx, req)
	if err != nil {
		return nil, err
	}
	out := map[string]claimResult{}
	for uid, r := range resp.Claims {
		var res claimResult
		if r != nil {
			res.err = r.Error
			for _, dev := range r.Devices {
				res.devices = append(res.devices, draDevice{dev.RequestNames, dev.PoolName, dev.DeviceName, dev.CdiDeviceIds})
			}
		}
		out[uid] = res
	}
	return out, nil
}

func (d draV1) unprepare(ctx context.Context, claims [][3]string) (map[string]string, error) {
	req := &drav1.NodeUnprepareResourcesRequest{}
	for _, c := range claims {
		req.Claims = append(req.Claims, &drav1.Claim{Namespace: c[0], Uid: c[1], Name: c[2]})
	}
	resp, err := d.c.NodeUnprepareResources(ctx, req)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for uid, r := range resp.Claims {
		if r != nil {
			out[uid] = r.Error
		} else {
			out[uid] = ""
		}
	}
	return out, nil
}

type draV1beta1 struct{ c drav1beta1.DRAPluginClient }

func (d draV1beta1) prepare(ctx context.Context, claims [][3]string) (map[string]claimResult, error) {
	req := &drav1beta1.NodePrepareResourcesRequest{}
	for _, c := range claims {
		req.Claims = append(req.Claims, &drav1beta1.Claim{Namespace: c[0], Uid: c[1], Name: c[2]})
	}
	resp, err := d.c.NodePrepareResources(ctx, req)
	if err != nil {
		return nil, err
	}
	out := map[string]claimResult{}
	for uid, r := range resp.Claims {
		var res claimResult
		if r != nil {
			res.err = r.Error
			for _, dev := range r.Devices {
				res.devices = append(res.devices, draDevice{dev.RequestNames, dev.PoolName, dev.DeviceName, dev.CdiDeviceIds})
			}
		}
		out[uid] = res
	}
	return out, nil
}

func (d draV1beta1) unprepare(ctx context.Context, claims [][3]string) (map[string]string, error) {
	req := &drav1beta1.NodeUnprepareResourcesRequest{}
	for _, c := range claims {
		req.Claims = append(req.Claims, &drav1beta1.Claim{Namespace: c[0], Uid: c[1], Name: c[2]})
	}
	resp, err := d.c.NodeUnprepareResources(ctx, req)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for uid, r := range resp.Claims {
		if r != nil {
			out[uid] = r.Error
		} else {
			out[uid] = ""
		}
	}
	return out, nil
}

// dra prepares a good and an unallocated claim, then unprepares the good one; returns the
// good claim's UID.
func dra(api draAPI, label string) string {
	good := [3]string{"default", newUID(), "claim-a"}
	bad := [3]string{"default", newUID(), "unallocated-b"}
	ctx, cancel := callCtx()
	defer cancel()
	claims, err := api.prepare(ctx, [][3]string{good, bad})
	must(label+" NodePrepareResources", err)
	ok, found := claims[good[1]]
	check(label+" prepare answers for claim-a", found, "no entry for %s in %v", good[1], claims)
	check(label+" prepare claim-a without error", ok.err == "", "error %q", ok.err)
	check(label+" prepare gives one device", len(ok.devices) == 1, "got %+v", ok.devices)
	d := ok.devices[0]
	check(label+" prepared device",
		len(d.requestNames) == 1 && d.requestNames[0] == "gpu" && d.pool == "node-a" &&
			d.name == "gpu-0" && len(d.cdiIDs) > 0 && d.cdiIDs[0] != "",
		"got request_names %q pool %q device %q cdi_device_ids %q, want [gpu] node-a gpu-0 [non-empty]",
		d.requestNames, d.pool, d.name, d.cdiIDs)
	badResult, found := claims[bad[1]]
	check(label+" per-claim error for unallocated-b", found && badResult.err != "" && len(badResult.devices) == 0,
		"entry present %v, error %q, devices %+v", found, badResult.err, badResult.devices)
	errs, err := api.unprepare(ctx, [][3]string{good})
	must(label+" NodeUnprepareResources", err)
	e, found := errs[good[1]]
	check(label+" unprepare claim-a", found && e == "", "entry present %v, error %q", found, e)
	return good[1]
}

type healthDevice struct{ pool, name, health string }

func health(conn *grpc.ClientConn, version, label string) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var devices []healthDevice
	what := label + " NodeWatchResources " + version
	switch version {
	case "v1":
		stream, err := healthv1.NewDRAResourceHealthClient(conn).NodeWatchResources(ctx, &healthv1.NodeWatchResourcesRequest{})
		must(what, err)
		first, err := stream.Recv()
		must(what+" first response", err)
		for _, d := range first.Devices {
			devices = append(devices, healthDevice{d.GetDevice().GetPoolName(), d.GetDevice().GetDeviceName(), d.Health.String()})
		}
	case "v1alpha1":
		stream, err := healthv1alpha1.NewDRAResourceHealthClient(conn).NodeWatchResources(ctx, &healthv1alpha1.NodeWatchResourcesRequest{})
		must(what, err)
		first, err := stream.Recv()
		must(what+" first response", err)
		for _, d := range first.Devices {
			devices = append(devices, healthDevice{d.GetDevice().GetPoolName(), d.GetDevice().GetDeviceName(), d.Health.String()})
		}
	}
	found := false
	for _, d := range devices {
		if d == (healthDevice{"node-a", "gpu-0", "HEALTHY"}) {
			found = true
		}
	}
	check(what+" first snapshot", found, "no node-a/gpu-0 HEALTHY in %+v", devices)
	// cancel() (deferred) ends the stream, as the kubelet does when it stops watching.
}

// kubeletRegistration is the kubelet's device-plugin Registration service on kubelet.sock.
type kubeletRegistration struct {
	dp.UnimplementedRegistrationServer
	requests chan *dp.RegisterRequest
}

func (k *kubeletRegistration) Register(ctx context.Context, r *dp.RegisterRequest) (*dp.Empty, error) {
	select {
	case k.requests <- r:
	default:
	}
	return &dp.Empty{}, nil
}

func devicePlugin(info targetInfo) {
	path := filepath.Join(info.DevicePluginDir, "kubelet.sock")
	if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
		fail("remove stale "+path, "%v", err)
	}
	lis, err := net.Listen("unix", path)
	must("listen on "+path, err)
	server := grpc.NewServer()
	kubelet := &kubeletRegistration{requests: make(chan *dp.RegisterRequest, 16)}
	dp.RegisterRegistrationServer(server, kubelet)
	go server.Serve(lis)
	defer func() {
		server.Stop()
		os.Remove(path)
	}()

	var request *dp.RegisterRequest
	select {
	case request = <-kubelet.requests:
	case <-time.After(20 * time.Second):
		fail("device plugin Register", "kubedev did not register at %s within 20 s", path)
	}
	check("device plugin Register version", request.Version == "v1beta1", "got %q", request.Version)
	check("device plugin Register resource", request.ResourceName == info.Resource,
		"got %q, want %q", request.ResourceName, info.Resource)
	want := filepath.Base(info.DevicePluginSocket)
	check("device plugin Register endpoint", request.Endpoint == want, "got %q, want %q", request.Endpoint, want)
	check("device plugin Register options",
		request.Options != nil && request.Options.PreStartRequired && request.Options.GetPreferredAllocationAvailable,
		"got %+v, want pre_start_required and get_preferred_allocation_available", request.Options)

	conn := dialDevicePlugin(filepath.Join(info.DevicePluginDir, request.Endpoint))
	defer conn.Close()
	client := dp.NewDevicePluginClient(conn)
	ctx, cancel := callCtx()
	defer cancel()

	options, err := client.GetDevicePluginOptions(ctx, &dp.Empty{})
	must("device plugin GetDevicePluginOptions", err)
	check("device plugin GetDevicePluginOptions", options.PreStartRequired, "got %+v", options)

	watchCtx, stopWatch := context.WithCancel(ctx)
	stream, err := client.ListAndWatch(watchCtx, &dp.Empty{})
	must("device plugin ListAndWatch", err)
	first, err := stream.Recv()
	must("device plugin ListAndWatch first response", err)
	var devices []string
	for _, d := range first.Devices {
		var nodes []string
		for _, n := range d.GetTopology().GetNodes() {
			nodes = append(nodes, fmt.Sprint(n.ID))
		}
		devices = append(devices, fmt.Sprintf("%s %s [%s]", d.ID, d.Health, strings.Join(nodes, ",")))
	}
	sort.Strings(devices)
	check("device plugin ListAndWatch",
		strings.Join(devices, "; ") == "dev-0 Healthy [0]; dev-1 Healthy [1]",
		"got %q, want dev-0 Healthy [0]; dev-1 Healthy [1]", devices)
	stopWatch()

	preferred, err := client.GetPreferredAllocation(ctx, &dp.PreferredAllocationRequest{
		ContainerRequests: []*dp.ContainerPreferredAllocationRequest{{
			AvailableDeviceIDs: []string{"dev-0", "dev-1"},
			AllocationSize:     1,
		}},
	})
	must("device plugin GetPreferredAllocation", err)
	var ids []string
	if len(preferred.ContainerResponses) == 1 {
		ids = preferred.ContainerResponses[0].DeviceIDs
	}
	check("device plugin GetPreferredAllocation",
		len(ids) == 1 && (ids[0] == "dev-0" || ids[0] == "dev-1"),
		"got %+v, want one container response with one of dev-0, dev-1", preferred.ContainerResponses)

	allocated, err := client.Allocate(ctx, &dp.AllocateRequest{
		ContainerRequests: []*dp.ContainerAllocateRequest{{DevicesIds: []string{"dev-1"}}},
	})
	must("device plugin Allocate", err)
	check("device plugin Allocate one container response", len(allocated.ContainerResponses) == 1,
		"got %d", len(allocated.ContainerResponses))
	response := allocated.ContainerResponses[0]
	var hostPaths []string
	for _, d := range response.Devices {
		hostPaths = append(hostPaths, d.HostPath)
	}
	check("device plugin Allocate",
		response.Envs["KUBEDEV_DEVICES"] == "dev-1" && contains(hostPaths, "/dev/dev-1"),
		"envs %v, device host paths %q; want KUBEDEV_DEVICES=dev-1 and /dev/dev-1", response.Envs, hostPaths)

	_, err = client.PreStartContainer(ctx, &dp.PreStartContainerRequest{DevicesIds: []string{"dev-1"}})
	must("device plugin PreStartContainer", err)
	check("device plugin PreStartContainer", true, "")
}

func run(infoPath string) (prepared []string) {
	raw, err := os.ReadFile(infoPath)
	if err != nil {
		fail("read "+infoPath, "%v", err)
	}
	var info targetInfo
	if err := json.Unmarshal(raw, &info); err != nil {
		fail("parse "+infoPath, "%v", err)
	}
	if info.RegistrationSocket == "" || info.DevicePluginDir == "" || info.DevicePluginSocket == "" || info.Driver == "" {
		fail("parse "+infoPath, "missing fields in %s", raw)
	}

	endpoint := registration(info)

	styles := []struct {
		label string
		dial  func(string) *grpc.ClientConn
	}{
		{"dra raw-path", dialDRARaw},
		{"dra unix:", dialDRAUnix},
	}
	for _, style := range styles {
		conn := style.dial(endpoint)
		prepared = append(prepared,
			dra(draV1{drav1.NewDRAPluginClient(conn)}, style.label+" v1"),
			dra(draV1beta1{drav1beta1.NewDRAPluginClient(conn)}, style.label+" v1beta1"))
		health(conn, "v1", style.label)
		health(conn, "v1alpha1", style.label)
		conn.Close()
	}

	devicePlugin(info)
	return prepared
}

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: kubelet-client TARGET.json")
		os.Exit(2)
	}
	code := 0
	func() {
		defer func() {
			if r := recover(); r != nil {
				if f, ok := r.(failure); ok {
					fmt.Printf("FAIL %s\n", f.msg)
					code = 1
					return
				}
				panic(r)
			}
		}()
		fmt.Println("grpc-go " + grpc.Version + " with k8s.io/kubelet's stubs, dialing as the kubelet")
		prepared := run(os.Args[1])
		out, _ := json.Marshal(map[string][]string{"prepared": prepared})
		fmt.Println(string(out))
	}()
	os.Exit(code)
}
