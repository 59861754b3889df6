//go:build dra038

package main

import (
	"context"
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	draapi "k8s.io/dynamic-resource-allocation/api"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
)

// releaseDefaultGates are the DRA feature gates on by default in Kubernetes 1.38
// (pkg/features/kube_features.go at v1.38.0-beta.0).
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
		AllocatedSharedDeviceIDs: sets.New[structured.DeviceID](),
		AggregatedCapacity:       structured.NewConsumedCapacityCollection(),
	}
}

// allocatorFeatures is the scheduler plugin's AllocatorFeatures at 1.38.
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
