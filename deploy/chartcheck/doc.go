// Package chartcheck checks the Kubernetes deployment of bypassd: the Helm
// chart (deploy/helm/bypassd) and the plain manifest (deploy/k8s).
//
// It is a module of its own so that the daemon's module does not depend on
// Helm and the Kubernetes API. Its tests lint the chart the way `helm lint
// --strict` does, render it the way `helm template` does, with the default
// values and with ci/full-values.yaml (every value set), and decode every
// rendered object strictly (an unknown or duplicated field is an error) into
// its k8s.io/api type; the ServiceMonitor, a prometheus-operator CRD without
// Go types here, into a struct of the fields the chart uses (serviceMonitor
// below). They also check what the documents promise: least privilege, the
// same capabilities as the systemd unit, options that docs/configuration.md
// documents, the dashboard and QoS ConfigMaps, and that deploy/k8s is the
// chart's default rendering.
//
// `make helm-template` runs the real helm command (go tool helm, built from
// this module's requirements). No cluster runs here: docs/deploy-kubernetes.md
// lists the steps for a real one.
package chartcheck
