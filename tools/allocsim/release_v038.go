//go:build dra038

package main

import (
	"context"
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	draapi "k8s.io/dynamic-resource-allocation/api"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/resourceslice/tracker"
	"k8s.io/dynamic-resource-allocation/structured"
)

// startTracker starts the scheduler's ResourceSlice tracker with DeviceTaintRules on, as
// the scheduler of this release builds it (over the allocator's own slice type, converted
// back here): its patched list, whether it synced, its stop.
func startTracker(ctx context.Context, factory informers.SharedInformerFactory, client kubernetes.Interface,
) (func() ([]*resourceapi.ResourceSlice, error), func() bool, func(), error) {
	sliceInformer := draapi.NewInformerForResourceSlice(factory)
	t, err := tracker.StartTracker(ctx, tracker.Options{
		EnableDeviceTaintRules:   true,
		EnableConsumableCapacity: true,
		SliceLister:              draapi.NewResourceSliceLister(sliceInformer.GetIndexer()),
		SliceInformer:            sliceInformer,
		TaintInformer:            factory.Resource().V1().DeviceTaintRules(),
		KubeClient:               client,
	})
	if err != nil {
		return nil, nil, nil, err
	}
	list := func() ([]*resourceapi.ResourceSlice, error) {
		patched, err := t.ListPatchedResourceSlices()
		if err != nil {
			return nil, err
		}
		out := make([]*resourceapi.ResourceSlice, 0, len(patched))
		for _, p := range patched {
			var s resourceapi.ResourceSlice
			if err := draapi.Convert_api_ResourceSlice_To_v1_ResourceSlice(p, &s, nil); err != nil {
				return nil, fmt.Errorf("converting slice %s: %w", p.Name, err)
			}
			out = append(out, &s)
		}
		return out, nil
	}
	return list, t.HasSynced, t.Stop, nil
}

// emptyAllocatedState is the scheduler's allocated state with nothing in use.
func emptyAllocatedState() structured.AllocatedState {
	return structured.AllocatedState{
		AllocatedDevices:         sets.New[structured.DeviceID](),
		AllocatedSharedDeviceIDs: sets.New[structured.DeviceID](),
		AggregatedCapacity:       structured.NewConsumedCapacityCollection(),
	}
}

// addShare records one share of device: from 1.38 the scheduler keeps the shared devices'
// IDs, not each share's.
func addShare(state *structured.AllocatedState, device structured.DeviceID, _ types.UID) {
	state.AllocatedSharedDeviceIDs.Insert(device)
}

// schedulerSlices are the slices as this release's scheduler hands them to the allocator:
// from 1.38 its ResourceSlice tracker keeps the allocator's own API type, converted once when
// a slice arrives, and the scheduler passes that list to every allocator it makes.
type schedulerSlices = []*draapi.ResourceSlice

// toSchedulerSlices converts the slices once, as the scheduler's informer does.
func toSchedulerSlices(slices []*resourceapi.ResourceSlice) (schedulerSlices, error) {
	converted := make([]*draapi.ResourceSlice, 0, len(slices))
	for _, s := range slices {
		var out draapi.ResourceSlice
		if err := draapi.Convert_v1_ResourceSlice_To_api_ResourceSlice(s, &out, nil); err != nil {
			return nil, fmt.Errorf("converting slice %s: %w", s.Name, err)
		}
		converted = append(converted, &out)
	}
	return converted, nil
}

func newAllocator(ctx context.Context, f structured.Features, state structured.AllocatedState,
	lister structured.DeviceClassLister, slices schedulerSlices, cache *cel.Cache,
) (structured.Allocator, error) {
	return structured.NewAllocator(ctx, f, state, lister, slices, cache)
}
