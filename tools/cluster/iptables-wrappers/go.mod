// kubedev's own implementation of the package Kubernetes 1.38's kubelet imports from
// sigs.k8s.io/iptables-wrappers (pkg/iptables), which the Go module proxy refuses to serve. A
// release module under tools/cluster points the import path here with a replace directive so
// the real kubelet of that release builds. It covers what the kubelet calls: its hint and
// firewall chains, one rule check-and-add, and the canary that notices a flushed table.
module sigs.k8s.io/iptables-wrappers

go 1.24
