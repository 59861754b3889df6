//go:build dra038

package main

import (
	"context"
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	draapi "k8s.io/dynamic-resource-allocation/api"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
)

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

// newAllocator converts the slices to the allocator's own API types, as the scheduler's
// slice lister hands them over from 1.38.
func newAllocator(ctx context.Context, f structured.Features, state structured.AllocatedState,
	lister structured.DeviceClassLister, slices []*resourceapi.ResourceSlice, cache *cel.Cache,
) (structured.Allocator, error) {
	converted := make([]*draapi.ResourceSlice, 0, len(slices))
	for _, s := range slices {
		var out draapi.ResourceSlice
		if err := draapi.Convert_v1_ResourceSlice_To_api_ResourceSlice(s, &out, nil); err != nil {
			return nil, fmt.Errorf("converting slice %s: %w", s.Name, err)
		}
		converted = append(converted, &out)
	}
	return structured.NewAllocator(ctx, f, state, lister, converted, cache)
}
