// Package image holds the bypassd daemon's OCI image: its Containerfile and
// build script (make image), the seccomp profile helper for runtimes whose
// default profile refuses bpf(2) to CAP_BPF, and the container test.
//
// What it owns: the image's contents and labels, and the proof that the
// image works with least privilege. The test builds the image with
// build.sh, runs the daemon under podman in a netlab namespace with only
// the capabilities of docs/operations.md ("Privileges") and no
// --privileged, serves a client in a second container through the shared
// socket directory, checks that the client's UDP went through the daemon's
// ring (ring counters up by what the peer saw, the namespace's kernel UDP
// counters flat), then drops each capability in turn and checks the error
// names it.
//
// What it does not own: the daemon (cmd/bypassd, daemon/), the Debian
// package (deploy/debian) or the Kubernetes manifests (deploy/helm,
// deploy/k8s, checked by the deploy/chartcheck module).
package image
