//go:build !dra038

package main

import (
	"context"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/resourceslice/tracker"
	"k8s.io/dynamic-resource-allocation/structured"
)

// startTracker starts the scheduler's ResourceSlice tracker with DeviceTaintRules on, as
// the scheduler of this release builds it: its patched list, whether it synced, its stop.
func startTracker(ctx context.Context, factory informers.SharedInformerFactory, client kubernetes.Interface,
) (func() ([]*resourceapi.ResourceSlice, error), func() bool, func(), error) {
	t, err := tracker.StartTracker(ctx, tracker.Options{
		EnableDeviceTaintRules:   true,
		EnableConsumableCapacity: true,
		SliceInformer:            factory.Resource().V1().ResourceSlices(),
		TaintInformer:            factory.Resource().V1().DeviceTaintRules(),
		KubeClient:               client,
	})
	if err != nil {
		return nil, nil, nil, err
	}
	return t.ListPatchedResourceSlices, t.HasSynced, t.Stop, nil
}

// emptyAllocatedState is the scheduler's allocated state with nothing in use.
func emptyAllocatedState() structured.AllocatedState {
	return structured.AllocatedState{
		AllocatedDevices:         sets.New[structured.DeviceID](),
		AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](),
		AggregatedCapacity:       structured.NewConsumedCapacityCollection(),
	}
}

// addShare records one share of device, as the scheduler records a result with a shareID.
func addShare(state *structured.AllocatedState, device structured.DeviceID, share types.UID) {
	state.AllocatedSharedDeviceIDs.Insert(structured.MakeSharedDeviceID(device, &share))
}

// schedulerSlices are the slices as this release's scheduler hands them to the allocator:
// the API's own type.
type schedulerSlices = []*resourceapi.ResourceSlice

// toSchedulerSlices gives the slices as the scheduler keeps them: unchanged in this release.
func toSchedulerSlices(slices []*resourceapi.ResourceSlice) (schedulerSlices, error) {
	return slices, nil
}

func newAllocator(ctx context.Context, f structured.Features, state structured.AllocatedState,
	lister structured.DeviceClassLister, slices schedulerSlices, cache *cel.Cache,
) (structured.Allocator, error) {
	return structured.NewAllocator(ctx, f, state, lister, slices, cache)
}
