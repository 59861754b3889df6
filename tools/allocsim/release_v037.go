//go:build !dra038

package main

import (
	"context"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
)

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

func newAllocator(ctx context.Context, f structured.Features, state structured.AllocatedState,
	lister structured.DeviceClassLister, slices []*resourceapi.ResourceSlice, cache *cel.Cache,
) (structured.Allocator, error) {
	return structured.NewAllocator(ctx, f, state, lister, slices, cache)
}
