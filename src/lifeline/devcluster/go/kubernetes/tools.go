//go:build tools

// Package tools pins the control-plane commands built from this module so that
// `go mod tidy` keeps every dependency they need.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver/app"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	_ "k8s.io/kubernetes/cmd/kube-scheduler/app"
)
