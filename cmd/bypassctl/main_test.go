package main

import (
	"bytes"
	"encoding/json"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/zap"

	"github.com/bypassd/bypassd/daemon/config"
	"github.com/bypassd/bypassd/daemon/daemontest"
	"github.com/bypassd/bypassd/internal/ctldoc"
	"github.com/bypassd/bypassd/internal/netlab"
	"github.com/bypassd/bypassd/socket"
)

// ctl runs bypassctl in this process against the daemon at sock.
func ctl(t *testing.T, sock string, args ...string) (string, error) {
	t.Helper()
	var out, errb bytes.Buffer
	err := run(append([]string{"--socket", sock}, args...), &out, &errb)
	return out.String(), err
}

func mustCtl(t *testing.T, sock string, args ...string) string {
	t.Helper()
	out, err := ctl(t, sock, args...)
	if err != nil {
		t.Fatalf("bypassctl %v: %v", args, err)
	}
	return out
}

func TestCommandsAgainstDaemon(t *testing.T) {
	p := netlab.NewPair(t, netlab.Options{StaticNeigh: true})
	level := zap.NewAtomicLevelAt(zap.InfoLevel)
	srv := daemontest.Start(t, p, config.Config{LogLevel: &level}, nil)
	sock := srv.SocketPath()

	c, err := socket.Dial(sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	local := netip.AddrPortFrom(p.A.Addr4(), 7001)
	peer := netip.AddrPortFrom(p.B.Addr4(), 7002)
	u, err := c.ListenUDP("udp4", local)
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	u2, err := c.DialUDP("udp4", netip.AddrPortFrom(p.A.Addr4(), 7003), peer)
	if err != nil {
		t.Fatal(err)
	}
	defer u2.Close()

	out := mustCtl(t, sock, "rings")
	for _, want := range []string{"RING", p.A.Name, "afxdp", "running"} {
		if !strings.Contains(out, want) {
			t.Errorf("rings: no %q in:\n%s", want, out)
		}
	}
	out = mustCtl(t, sock, "flows")
	if !strings.Contains(out, local.String()) || !strings.Contains(out, u2.LocalAddr().String()) {
		t.Errorf("flows: want %v and %v in:\n%s", local, u2.LocalAddr(), out)
	}
	out = mustCtl(t, sock, "sessions")
	if !strings.Contains(out, local.String()) || !strings.Contains(out, "bypassctl") {
		t.Errorf("sessions: want the socket on %v and bypassctl's own session in:\n%s", local, out)
	}
	if out := mustCtl(t, sock, "connections"); !strings.Contains(out, "CWND") {
		t.Errorf("connections: no header in:\n%s", out)
	}
	for _, topic := range []string{ctldoc.TopicRings, ctldoc.TopicFlows, ctldoc.TopicSessions, ctldoc.TopicConnections} {
		if !strings.Contains(mustCtl(t, sock, "topics"), topic) {
			t.Errorf("topics lacks %s", topic)
		}
	}

	// --json prints the daemon's document; query prints any topic.
	var rings ctldoc.RingsDoc
	if err := json.Unmarshal([]byte(mustCtl(t, sock, "--json", "rings")), &rings); err != nil {
		t.Fatal(err)
	}
	if len(rings.Rings) != 1 || rings.Rings[0].Interface != p.A.Name || rings.Rings[0].Sockets != 2 {
		t.Errorf("rings document: %+v", rings)
	}
	var flows ctldoc.FlowsDoc
	if err := json.Unmarshal([]byte(mustCtl(t, sock, "query", "flows")), &flows); err != nil {
		t.Fatal(err)
	}
	if len(flows.Flows) != 2 {
		t.Errorf("flows document: %+v", flows)
	}

	if out := mustCtl(t, sock, "log-level", "debug"); !strings.Contains(out, "info -> debug") || level.Level() != zap.DebugLevel {
		t.Errorf("log-level: %q, level now %v", out, level.Level())
	}
}

func TestErrors(t *testing.T) {
	p := netlab.NewPair(t, netlab.Options{StaticNeigh: true})
	srv := daemontest.Start(t, p, config.Config{}, nil)
	sock := srv.SocketPath()
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"query", "no-such-topic"}, "does not know the topic"},
		{[]string{"query", "Bad Topic"}, "lowercase"},
		{[]string{"query"}, "one topic"},
		{[]string{"frobnicate"}, "unknown command"},
		{[]string{"rings", "extra"}, "takes no arguments"},
		{[]string{"log-level", "loud"}, "want debug, info, warn or error"},
		{[]string{}, "no command"},
	}
	for _, c := range cases {
		_, err := ctl(t, sock, c.args...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("bypassctl %v: %v, want an error with %q", c.args, err, c.want)
		}
	}
	_, err := ctl(t, filepath.Join(srv.Dir, "nothing.sock"), "rings")
	if err == nil || !strings.Contains(err.Error(), "nothing.sock") {
		t.Errorf("no daemon: %v", err)
	}
}
