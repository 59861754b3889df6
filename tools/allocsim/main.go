// Command allocsim runs the Kubernetes structured allocator (k8s.io/dynamic-resource-allocation)
// on kubedev's allocation scenarios, called as the kube-scheduler's DynamicResources plugin calls
// it, so kubedev's tests can compare their answers with upstream's.
//
// It reads one request per line on standard input, a JSON object
//
//	{"id": "...", "scenario": {kubedev's scenario: node, deviceClasses, resourceSlices,
//	 deviceTaintRules, allocatedDevices, allocatedShares, claims, features}, "repeat": N}
//
// and writes one answer per line on standard output:
//
//	{"id": "...", "outcome": "allocated" | "unsatisfiable" | "failedOnNode" | "error" | "panic",
//	 "error": "...", "allocations": [status.allocation per claim], "steps": N,
//	 "timing": {"allocateCpuNs": ..., "buildAllocateCpuNs": ...}}
//
// The outcomes are the scheduler's classes: allocated; unsatisfiable (the plugin's "cannot
// allocate all claims"); failedOnNode (an error wrapping ErrFailedAllocationOnNode, which only
// rules out this node); error (any other error, which aborts the scheduling attempt).
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"reflect"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
)

type scenario struct {
	Node struct {
		Name             string            `json:"name"`
		Labels           map[string]string `json:"labels"`
		DeclaredFeatures []string          `json:"declaredFeatures"`
	} `json:"node"`
	DeviceClasses    []*resourceapi.DeviceClass     `json:"deviceClasses"`
	ResourceSlices   []*resourceapi.ResourceSlice   `json:"resourceSlices"`
	DeviceTaintRules []*resourceapi.DeviceTaintRule `json:"deviceTaintRules"`
	AllocatedDevices []string                       `json:"allocatedDevices"`
	AllocatedShares  []allocatedShare               `json:"allocatedShares"`
	Claims           []*resourceapi.ResourceClaim   `json:"claims"`
	Features         []string                       `json:"features"`
}

// allocatedShare is one allocation result with a shareID: the device and the capacity the
// share consumed.
type allocatedShare struct {
	Device           string                       `json:"device"`
	ConsumedCapacity map[string]resource.Quantity `json:"consumedCapacity"`
}

// deviceID splits driver/pool/device as kubedev does: pool names may hold a slash, so the
// driver ends at the first and the device starts after the last.
func deviceID(id string) (structured.DeviceID, bool) {
	first, last := strings.Index(id, "/"), strings.LastIndex(id, "/")
	if first < 0 || first == last || first == 0 || last == first+1 || last == len(id)-1 {
		return structured.DeviceID{}, false
	}
	return structured.MakeDeviceID(id[:first], id[first+1:last], id[last+1:]), true
}

// taintedSlices returns the slices as the scheduler's ResourceSlice tracker hands them to the
// allocator: with the taints of the DeviceTaintRules (on by default from 1.37) added, in the
// order the slices were given.
func taintedSlices(ctx context.Context, slices []*resourceapi.ResourceSlice, rules []*resourceapi.DeviceTaintRule) ([]*resourceapi.ResourceSlice, error) {
	if len(rules) == 0 {
		return slices, nil
	}
	objects := make([]runtime.Object, 0, len(slices)+len(rules))
	for _, s := range slices {
		objects = append(objects, s)
	}
	for i, r := range rules {
		if r.Name == "" {
			r.Name = fmt.Sprintf("rule-%d", i)
		}
		objects = append(objects, r)
	}
	client := fake.NewSimpleClientset(objects...)
	factory := informers.NewSharedInformerFactory(client, 0)
	ctx, cancel := context.WithCancel(ctx)
	list, synced, stop, err := startTracker(ctx, factory, client)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("starting the ResourceSlice tracker: %w", err)
	}
	factory.Start(ctx.Done())
	// The informers stop once the context is done: cancel before waiting for them.
	defer func() {
		stop()
		cancel()
		factory.Shutdown()
	}()
	// Polled every millisecond: client-go's WaitForCacheSync polls every 100 ms, most of a
	// scenario's time.
	deadline := time.Now().Add(10 * time.Second)
	for !synced() {
		if time.Now().After(deadline) {
			return nil, errors.New("the ResourceSlice tracker did not sync within 10s")
		}
		time.Sleep(time.Millisecond)
	}
	patched, err := list()
	if err != nil {
		return nil, fmt.Errorf("listing patched ResourceSlices: %w", err)
	}
	byName := make(map[string]*resourceapi.ResourceSlice, len(patched))
	for _, p := range patched {
		byName[p.Name] = p
	}
	out := make([]*resourceapi.ResourceSlice, 0, len(slices))
	for _, s := range slices {
		p, ok := byName[s.Name]
		if !ok {
			return nil, fmt.Errorf("the tracker lost ResourceSlice %q (slice names must be unique with DeviceTaintRules)", s.Name)
		}
		out = append(out, p)
	}
	return out, nil
}

type request struct {
	ID       string   `json:"id"`
	Scenario scenario `json:"scenario"`
	// Repeat, when above zero, also times warm Allocate calls and fresh allocator + Allocate.
	Repeat int `json:"repeat"`
}

type timing struct {
	Repeat             int   `json:"repeat"`
	AllocateCPUNs      int64 `json:"allocateCpuNs"`
	BuildAllocateCPUNs int64 `json:"buildAllocateCpuNs"`
}

type answer struct {
	ID          string                         `json:"id"`
	Outcome     string                         `json:"outcome"`
	Error       string                         `json:"error,omitempty"`
	Allocations []resourceapi.AllocationResult `json:"allocations,omitempty"`
	Steps       int64                          `json:"steps,omitempty"`
	Timing      *timing                        `json:"timing,omitempty"`
}

// classes is the scheduler's DeviceClass lister over the scenario's classes.
type classes []*resourceapi.DeviceClass

func (c classes) List() ([]*resourceapi.DeviceClass, error) { return c, nil }

func (c classes) Get(name string) (*resourceapi.DeviceClass, error) {
	for _, class := range c {
		if class.Name == name {
			return class, nil
		}
	}
	return nil, apierrors.NewNotFound(resourceapi.Resource("deviceclasses"), name)
}

// defaultClaim applies the API server's defaulting of resource.k8s.io/v1 ResourceClaims
// (pkg/apis/resource/v1: allocation mode ExactCount, count 1, toleration operator Equal), as
// the scheduler only ever sees stored claims.
func defaultClaim(claim *resourceapi.ResourceClaim) {
	tolerations := func(ts []resourceapi.DeviceToleration) {
		for i := range ts {
			if ts[i].Operator == "" {
				ts[i].Operator = resourceapi.DeviceTolerationOpEqual
			}
		}
	}
	for i := range claim.Spec.Devices.Requests {
		r := &claim.Spec.Devices.Requests[i]
		if e := r.Exactly; e != nil {
			if e.AllocationMode == "" {
				e.AllocationMode = resourceapi.DeviceAllocationModeExactCount
			}
			if e.AllocationMode == resourceapi.DeviceAllocationModeExactCount && e.Count == 0 {
				e.Count = 1
			}
			tolerations(e.Tolerations)
		}
		for j := range r.FirstAvailable {
			s := &r.FirstAvailable[j]
			if s.AllocationMode == "" {
				s.AllocationMode = resourceapi.DeviceAllocationModeExactCount
			}
			if s.AllocationMode == resourceapi.DeviceAllocationModeExactCount && s.Count == 0 {
				s.Count = 1
			}
			tolerations(s.Tolerations)
		}
	}
}

// defaultSlice applies the API server's defaulting of ResourceSlices: a taint's timeAdded.
func defaultSlice(slice *resourceapi.ResourceSlice, now metav1.Time) {
	for i := range slice.Spec.Devices {
		for j := range slice.Spec.Devices[i].Taints {
			if slice.Spec.Devices[i].Taints[j].TimeAdded == nil {
				slice.Spec.Devices[i].Taints[j].TimeAdded = &now
			}
		}
	}
}

// features maps the release's default feature gates, plus the scenario's, to the allocator's
// features as the scheduler's plugin does (AllocatorFeatures).
func features(extra []string) (structured.Features, cel.Features) {
	on := sets.New(releaseDefaultGates...)
	on.Insert(extra...)
	f := allocatorFeatures(on)
	return f, cel.Features{
		EnableConsumableCapacity: on.Has("DRAConsumableCapacity"),
		EnableListTypeAttributes: on.Has("DRAListTypeAttributes"),
	}
}

// releaseDefaultGates are the DRA feature gates on by default, the same in Kubernetes 1.37 and
// 1.38 (pkg/features/kube_features.go at v1.37.2 and v1.38.0-beta.0).
var releaseDefaultGates = []string{
	"DRAAdminAccess",
	"DRAPrioritizedList",
	"DRAPartitionableDevices",
	"DRADeviceTaints",
	"DRADeviceBindingConditions",
	"DRAResourceClaimDeviceStatus",
	"DRAConsumableCapacity",
	"DRAFractionalCapacityRange",
}

// allocatorFeatures is the scheduler plugin's AllocatorFeatures, the same at 1.37 and 1.38.
func allocatorFeatures(on sets.Set[string]) structured.Features {
	return structured.Features{
		AdminAccess:             on.Has("DRAAdminAccess"),
		PrioritizedList:         on.Has("DRAPrioritizedList"),
		PartitionableDevices:    on.Has("DRAPartitionableDevices"),
		DeviceTaints:            on.Has("DRADeviceTaints"),
		DeviceBindingAndStatus:  on.Has("DRADeviceBindingConditions") && on.Has("DRAResourceClaimDeviceStatus"),
		ConsumableCapacity:      on.Has("DRAConsumableCapacity"),
		FractionalCapacityRange: on.Has("DRAFractionalCapacityRange"),
		ListTypeAttributes:      on.Has("DRAListTypeAttributes"),
		OptionalNodeOperations:  on.Has("DRAOptionalNodeOperations"),
		DerivedAttributes:       on.Has("DRADerivedAttributes"),
		CompatibilityGroups:     on.Has("DRADeviceCompatibilityGroups"),
	}
}

// processCPU is the CPU time of the whole process, as the scheduler's process is charged.
func processCPU() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_PROCESS_CPUTIME_ID, &ts); err != nil {
		return 0
	}
	return ts.Nano()
}

// steps is the allocator's count of search steps (calls of its per-device step), where its
// implementation reports one (GetStats, whose type is internal to the module).
func steps(a structured.Allocator) int64 {
	m := reflect.ValueOf(a).MethodByName("GetStats")
	if !m.IsValid() || m.Type().NumIn() != 0 || m.Type().NumOut() != 1 {
		return 0
	}
	out := m.Call(nil)[0]
	if out.Kind() == reflect.Pointer {
		if out.IsNil() {
			return 0
		}
		out = out.Elem()
	}
	if out.Kind() != reflect.Struct {
		return 0
	}
	f := out.FieldByName("NumAllocateOneInvocations")
	if !f.IsValid() || !f.CanInt() {
		return 0
	}
	return f.Int()
}

// filterTimeout is the DynamicResources plugin's default filterTimeout.
const filterTimeout = 10 * time.Second

func run(req *request) answer {
	ans := answer{ID: req.ID}
	sc := &req.Scenario
	now := metav1.Now()
	for _, s := range sc.ResourceSlices {
		defaultSlice(s, now)
	}
	for i, c := range sc.Claims {
		defaultClaim(c)
		if c.UID == "" {
			c.UID = types.UID(fmt.Sprintf("claim-uid-%d", i))
		}
	}
	tainted, err := taintedSlices(context.Background(), sc.ResourceSlices, sc.DeviceTaintRules)
	if err != nil {
		ans.Outcome, ans.Error = "error", err.Error()
		return ans
	}
	// Once, outside what is timed: the scheduler keeps its slices and hands the same list to
	// each allocator it makes.
	slices, err := toSchedulerSlices(tainted)
	if err != nil {
		ans.Outcome, ans.Error = "error", err.Error()
		return ans
	}
	allocated := emptyAllocatedState()
	for _, id := range sc.AllocatedDevices {
		device, ok := deviceID(id)
		if !ok {
			ans.Outcome, ans.Error = "error", fmt.Sprintf("allocated device %q is not driver/pool/device", id)
			return ans
		}
		allocated.AllocatedDevices.Insert(device)
	}
	// Shares as the scheduler's GatherAllocatedState records results with a shareID: the
	// shared device, and the capacity the share consumed when it has any.
	for i, share := range sc.AllocatedShares {
		device, ok := deviceID(share.Device)
		if !ok {
			ans.Outcome, ans.Error = "error", fmt.Sprintf("allocated share's device %q is not driver/pool/device", share.Device)
			return ans
		}
		addShare(&allocated, device, types.UID(fmt.Sprintf("share-uid-%d", i)))
		if share.ConsumedCapacity != nil {
			consumed := make(map[resourceapi.QualifiedName]resource.Quantity, len(share.ConsumedCapacity))
			for name, q := range share.ConsumedCapacity {
				consumed[resourceapi.QualifiedName(name)] = q
			}
			allocated.AggregatedCapacity.Insert(structured.NewDeviceConsumedCapacity(device, consumed))
		}
	}
	node := &v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: sc.Node.Name, Labels: sc.Node.Labels},
		Status:     v1.NodeStatus{DeclaredFeatures: sc.Node.DeclaredFeatures},
	}
	feats, celFeats := features(sc.Features)
	celCache := cel.NewCache(10, celFeats)
	lister := classes(sc.DeviceClasses)
	ctx := context.Background()

	allocate := func() ([]resourceapi.AllocationResult, structured.Allocator, error) {
		a, err := newAllocator(ctx, feats, allocated, lister, slices, celCache)
		if err != nil {
			return nil, nil, err
		}
		actx, cancel := context.WithTimeout(ctx, filterTimeout)
		defer cancel()
		r, err := a.Allocate(actx, node, sc.Claims)
		return r, a, err
	}
	results, alloc, err := allocate()
	switch {
	case errors.Is(err, structured.ErrFailedAllocationOnNode):
		ans.Outcome, ans.Error = "failedOnNode", err.Error()
	case err != nil:
		ans.Outcome, ans.Error = "error", err.Error()
	case len(results) != len(sc.Claims):
		ans.Outcome = "unsatisfiable"
	default:
		ans.Outcome, ans.Allocations = "allocated", results
	}
	if alloc != nil {
		ans.Steps = steps(alloc)
	}
	if req.Repeat > 0 && alloc != nil {
		ans.Timing = timeRuns(req.Repeat, func() {
			actx, cancel := context.WithTimeout(ctx, filterTimeout)
			_, _ = alloc.Allocate(actx, node, sc.Claims)
			cancel()
		}, func() { _, _, _ = allocate() })
	}
	return ans
}

// runRecovering is run, with a panic of the allocator answered as the outcome "panic" (input
// the API server's validation would have refused, such as a request with neither exactly nor
// firstAvailable, crashes it).
func runRecovering(req *request) (ans answer) {
	defer func() {
		if r := recover(); r != nil {
			ans = answer{ID: req.ID, Outcome: "panic", Error: fmt.Sprint(r)}
		}
	}()
	return run(req)
}

// timeRuns times warm runs and fresh runs in batches; each figure is the median over batches of
// the process CPU time per run.
func timeRuns(repeat int, warm, fresh func()) *timing {
	const batches = 25
	batch := repeat / batches
	if batch < 1 {
		batch = 1
	}
	n := repeat / batch
	measure := func(f func()) int64 {
		f() // warm-up
		per := make([]int64, 0, n)
		for i := 0; i < n; i++ {
			c0 := processCPU()
			for j := 0; j < batch; j++ {
				f()
			}
			per = append(per, (processCPU()-c0)/int64(batch))
		}
		sort.Slice(per, func(a, b int) bool { return per[a] < per[b] })
		return per[len(per)/2]
	}
	return &timing{Repeat: n * batch, AllocateCPUNs: measure(warm), BuildAllocateCPUNs: measure(fresh)}
}

func main() {
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<30)
	out := bufio.NewWriter(os.Stdout)
	enc := json.NewEncoder(out)
	for in.Scan() {
		var req request
		dec := json.NewDecoder(strings.NewReader(in.Text()))
		dec.DisallowUnknownFields()
		var ans answer
		if err := dec.Decode(&req); err != nil {
			ans = answer{ID: req.ID, Outcome: "badRequest", Error: err.Error()}
		} else {
			ans = runRecovering(&req)
		}
		if err := enc.Encode(&ans); err != nil {
			fmt.Fprintln(os.Stderr, "allocsim:", err)
			os.Exit(1)
		}
		if err := out.Flush(); err != nil {
			fmt.Fprintln(os.Stderr, "allocsim:", err)
			os.Exit(1)
		}
	}
	if err := in.Err(); err != nil {
		fmt.Fprintln(os.Stderr, "allocsim: reading requests:", err)
		os.Exit(1)
	}
}
