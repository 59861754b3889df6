// Builds the CNI loopback plugin for kubedev's real-cluster tests (cargo xtask cluster): the
// node's only network plugin, so the runtime reports its network ready and the node is Ready;
// test pods use the host's network.
module kubedev.dev/tools/cluster/cni-plugins

go 1.26.8

require (
	github.com/containernetworking/cni v1.3.1 // indirect
	github.com/containernetworking/plugins v1.10.0 // indirect
	github.com/pkg/errors v0.9.1 // indirect
	github.com/vishvananda/netlink v1.3.1 // indirect
	github.com/vishvananda/netns v0.0.5 // indirect
	golang.org/x/sys v0.49.0 // indirect
)

tool github.com/containernetworking/plugins/plugins/main/loopback
