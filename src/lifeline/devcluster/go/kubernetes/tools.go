//go:build tools

// Package tools pins the commands built from this module (the control plane for the dev
// cluster; kubeadm, kubelet, kube-proxy and kubectl for the kind node image) so that
// `go mod tidy` keeps every dependency they need.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver/app"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	_ "k8s.io/kubernetes/cmd/kube-scheduler/app"
	_ "k8s.io/kubernetes/cmd/kubeadm/app"
	_ "k8s.io/kubernetes/cmd/kubelet/app"
	_ "k8s.io/kubernetes/cmd/kube-proxy/app"
	_ "k8s.io/kubectl/pkg/cmd"
)
