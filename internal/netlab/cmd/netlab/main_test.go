package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/bypassd/bypassd/internal/netlab"
)

func TestUsageErrors(t *testing.T) {
	for _, args := range [][]string{
		nil,
		{"bogus"},
		{"up"},
		{"up", "--name", "9bad"},
		{"up", "--name", "x", "--mtu", "100"},
		{"up", "--name", "x", "extra"},
		{"down"},
		{"down", "--name", "a/b"},
		{"sweep", "extra"},
	} {
		var out, errOut bytes.Buffer
		if err := run(args, &out, &errOut); err == nil {
			t.Errorf("run(%q) succeeded", args)
		}
		if out.Len() != 0 {
			t.Errorf("run(%q) wrote to stdout (would be eval'd): %q", args, out.String())
		}
	}
	var out bytes.Buffer
	if err := run([]string{"help"}, &out, &out); err != nil || !strings.Contains(out.String(), "netlab up") {
		t.Errorf("help: %v %q", err, out.String())
	}
}

func TestUpDown(t *testing.T) {
	netlab.RequirePriv(t)
	name := fmt.Sprintf("cli%d", os.Getpid())
	t.Cleanup(func() { netlab.Destroy(name) })

	var out, errOut bytes.Buffer
	if err := run([]string{"up", "--name", name, "--mtu", "2000", "--static-neigh"}, &out, &errOut); err != nil {
		t.Fatalf("up: %v\n%s", err, errOut.String())
	}
	// The output must be sourceable by a POSIX shell.
	script := out.String() + `printf '%s\n' "$NS_A" "$NS_B" "$IF_A" "$IF_B" "$IP4_A" "$IP4_B" "$IP6_A" "$IP6_B" "$MAC_A" "$MAC_B"`
	vals, err := exec.Command("sh", "-c", script).Output()
	if err != nil {
		t.Fatalf("sourcing output: %v\n%s", err, out.String())
	}
	v := strings.Split(strings.TrimSpace(string(vals)), "\n")
	if len(v) != 10 {
		t.Fatalf("got %d values from:\n%s", len(v), out.String())
	}
	for i, s := range v {
		if s == "" {
			t.Errorf("value %d empty in:\n%s", i, out.String())
		}
	}
	nsA, nsB, ifA, ip4B, ip6B := v[0], v[1], v[2], v[5], v[7]
	if nsA != "bdlab-"+name+"-a" || nsB != "bdlab-"+name+"-b" {
		t.Errorf("namespaces %s %s", nsA, nsB)
	}
	show, err := exec.Command("ip", "netns", "exec", nsA, "ip", "-o", "link", "show", "dev", ifA).CombinedOutput()
	if err != nil || !strings.Contains(string(show), "mtu 2000") || !strings.Contains(string(show), v[8]) {
		t.Errorf("link in %s: %v\n%s", nsA, err, show)
	}
	// A tool run the way scripts do it reaches B over both families.
	for _, dst := range []string{ip4B, ip6B} {
		cmd := exec.Command("ip", "netns", "exec", nsA, "sh", "-c", "ip route get "+dst)
		if b, err := cmd.CombinedOutput(); err != nil || !strings.Contains(string(b), ifA) {
			t.Errorf("route to %s in %s: %v %s", dst, nsA, err, b)
		}
	}

	errOut.Reset()
	if err := run([]string{"up", "--name", name}, &bytes.Buffer{}, &errOut); err == nil || !strings.Contains(err.Error(), "already exists") {
		t.Errorf("second up: %v", err)
	}
	if err := run([]string{"sweep"}, &bytes.Buffer{}, &errOut); err != nil {
		t.Errorf("sweep: %v", err)
	}
	if _, err := os.Stat("/run/netns/" + nsA); err != nil {
		t.Errorf("sweep removed a named lab: %v", err)
	}
	for i := 0; i < 2; i++ { // down is idempotent
		if err := run([]string{"down", "--name", name}, &bytes.Buffer{}, &errOut); err != nil {
			t.Fatalf("down #%d: %v", i+1, err)
		}
	}
	list, err := exec.Command("ip", "netns", "list").CombinedOutput()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(list), "bdlab-"+name+"-") {
		t.Errorf("namespaces left after down:\n%s", list)
	}
}
