#!/usr/bin/env python3
"""seccomp-bpf.py [PROFILE]: prints a container runtime's seccomp profile
(default: podman's and CRI-O's /usr/share/containers/seccomp.json) with the
bpf(2) system call allowed, for the bypassd daemon's container.

Why: profiles older than the kernel's CAP_BPF (podman and CRI-O through
containers-common, containerd before 1.7, Docker before 23) allow bpf(2)
only to CAP_SYS_ADMIN, so a daemon given CAP_BPF instead gets EPERM from
seccomp on its first map. The profile printed here lets bpf(2) through to
the kernel, which then checks CAP_BPF (and CAP_PERFMON, CAP_NET_ADMIN) as it
does outside containers; nothing else changes.
Use: podman run --security-opt seccomp=FILE ..., or a Localhost
seccompProfile on Kubernetes (docs/deploy-kubernetes.md)."""
import json
import sys

src = sys.argv[1] if len(sys.argv) > 1 else "/usr/share/containers/seccomp.json"
with open(src) as f:
    profile = json.load(f)
rules = []
for rule in profile.get("syscalls", []):
    names = [n for n in rule.get("names", []) if n != "bpf"]
    if names:
        rules.append(dict(rule, names=names))
rules.append({"names": ["bpf"], "action": "SCMP_ACT_ALLOW"})
profile["syscalls"] = rules
json.dump(profile, sys.stdout, indent=1)
sys.stdout.write("\n")
