//go:build !dra038

package main

import (
	"context"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
)

// releaseDefaultGates are the DRA feature gates on by default in Kubernetes 1.37
// (pkg/features/kube_features.go at v1.37.2).
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

// emptyAllocatedState is the scheduler's allocated state with nothing in use.
func emptyAllocatedState() structured.AllocatedState {
	return structured.AllocatedState{
		AllocatedDevices:         sets.New[structured.DeviceID](),
		AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](),
		AggregatedCapacity:       structured.NewConsumedCapacityCollection(),
	}
}

// allocatorFeatures is the scheduler plugin's AllocatorFeatures at 1.37.
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

func newAllocator(ctx context.Context, f structured.Features, state structured.AllocatedState,
	lister structured.DeviceClassLister, slices []*resourceapi.ResourceSlice, cache *cel.Cache,
) (structured.Allocator, error) {
	return structured.NewAllocator(ctx, f, state, lister, slices, cache)
}
