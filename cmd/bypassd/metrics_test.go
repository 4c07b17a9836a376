package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/bypassd/bypassd/internal/ctlproto"
	"github.com/bypassd/bypassd/internal/netlab"
	"github.com/bypassd/bypassd/socket"
	"github.com/bypassd/bypassd/stats"
)

// Ports inside the test's own network namespace: its loopback is private,
// so fixed ports cannot clash with anything else.
const (
	metricsPort    = "19465"
	prometheusPort = "19090"
)

// nsHTTP is an HTTP client whose connections are made inside ns.
func nsHTTP(ns *netlab.NS) *http.Client {
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			var c net.Conn
			err := ns.Do(func() error {
				var err error
				// The socket is created on this (namespace-locked)
				// thread, so it lives in ns.
				c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
				return err
			})
			return c, err
		},
	}}
}

func get(t *testing.T, c *http.Client, u string) string {
	t.Helper()
	resp, err := c.Get(u)
	if err != nil {
		t.Fatalf("GET %s: %v", u, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s %v\n%s", u, resp.Status, err, b)
	}
	return string(b)
}

// metricValue returns the value of the sample whose name and labels start
// with prefix in a /metrics text.
func metricValue(t *testing.T, text, prefix string) float64 {
	t.Helper()
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(line, prefix) {
			f := strings.Fields(line)
			v, err := strconv.ParseFloat(f[len(f)-1], 64)
			if err != nil {
				t.Fatalf("sample %q: %v", line, err)
			}
			return v
		}
	}
	t.Fatalf("no sample %q in /metrics:\n%s", prefix, text)
	return 0
}

// TestMetrics runs bypassd with --metrics-addr, puts traffic through a
// client, and checks /metrics directly, against the Grafana dashboard, and
// through a real Prometheus server scraping it.
func TestMetrics(t *testing.T) {
	netlab.RequirePriv(t)
	lab := netlab.NewPair(t, netlab.Options{StaticNeigh: true})
	dir := t.TempDir()
	sock := filepath.Join(dir, "ctl.sock")
	d := startDaemon(t, lab.A.NS, "-i", lab.A.Name, "--socket", sock, "--run-dir", dir, "--stats-dir", filepath.Join(dir, "stats"),
		"--frames", "256", "--queue-bytes", "64K", "--metrics-addr", "127.0.0.1:"+metricsPort, "--stats-interval", "20ms")
	d.waitReady(t)
	web := nsHTTP(lab.A.NS)
	metricsURL := "http://127.0.0.1:" + metricsPort + "/metrics"

	// A client with a socket, so that every family of series exists.
	c, err := socket.Dial(sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	u, err := c.ListenUDP("udp4", netip.AddrPortFrom(lab.A.Addr4(), 0))
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	var peer *net.UDPConn
	if err := lab.B.NS.Do(func() error {
		peer, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(lab.B.Addr4(), 0)))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	to := u.LocalAddr().(*net.UDPAddr).AddrPort()
	send := func(n int) {
		t.Helper()
		buf := make([]byte, 2048)
		for i := 0; i < n; i++ {
			if _, err := peer.WriteToUDPAddrPort(make([]byte, 100), to); err != nil {
				t.Fatal(err)
			}
			_ = u.SetReadDeadline(time.Now().Add(5 * time.Second))
			if _, _, err := u.ReadFromUDPAddrPort(buf); err != nil {
				t.Fatalf("receive %d: %v", i, err)
			}
		}
	}
	send(10)

	text := get(t, web, metricsURL)
	ring := fmt.Sprintf(`{interface=%q,queue="0"}`, lab.A.Name)
	pid := strconv.Itoa(os.Getpid())
	if v := metricValue(t, text, "bypassd_ring_rx_packets_total"+ring); v != 10 {
		t.Errorf("bypassd_ring_rx_packets_total = %v, want 10", v)
	}
	if v := metricValue(t, text, "bypassd_client_rx_packets_total{command="); v != 10 {
		t.Errorf("bypassd_client_rx_packets_total = %v, want 10", v)
	}
	for _, want := range []string{
		`bypassd_build_info{goversion="go`, fmt.Sprintf(`protocol_version="%d"`, ctlproto.Version), fmt.Sprintf(`stats_version="%d"`, stats.Version),
		`bypassd_client_sockets{command=`, `pid="` + pid + `"} 1`,
		`bypassd_xdp_redirected_packets_total{interface="` + lab.A.Name + `"} 10`,
		`bypassd_ring_rx_dropped_packets_total{interface="` + lab.A.Name + `",queue="0",reason="queue_full"} 0`,
		`bypassd_control_requests_total{code="OPEN"} 1`, `bypassd_sessions 1`, `bypassd_clients 1`,
		"# TYPE bypassd_ring_rx_packets_total counter", "# TYPE bypassd_sockets gauge",
		"go_goroutines ", "process_cpu_seconds_total ",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}

	t.Run("GrafanaDashboard", func(t *testing.T) { checkDashboard(t, text) })
	t.Run("Prometheus", func(t *testing.T) {
		promURL := startPrometheus(t, lab.A.NS, dir)
		query := func(q string) (float64, bool) {
			body := get(t, web, promURL+"/api/v1/query?query="+url.QueryEscape(q))
			var r struct {
				Status string
				Data   struct {
					Result []struct {
						Value [2]any
					}
				}
			}
			if err := json.Unmarshal([]byte(body), &r); err != nil || r.Status != "success" {
				t.Fatalf("query %s: %v %s", q, err, body)
			}
			if len(r.Data.Result) == 0 {
				return 0, false
			}
			s, _ := r.Data.Result[0].Value[1].(string)
			v, err := strconv.ParseFloat(s, 64)
			return v, err == nil
		}
		waitFor := func(what string, ok func() bool) {
			t.Helper()
			deadline := time.Now().Add(30 * time.Second)
			for !ok() {
				if time.Now().After(deadline) {
					t.Fatalf("Prometheus: %s never happened", what)
				}
				time.Sleep(200 * time.Millisecond)
			}
		}
		q := `bypassd_client_rx_packets_total{pid="` + pid + `"}`
		var before float64
		waitFor("a first scrape of bypassd", func() bool {
			v, ok := query(q)
			before = v
			return ok
		})
		send(25)
		waitFor("the counter rising by 25", func() bool {
			v, ok := query(q)
			return ok && v >= before+25
		})
		if v, ok := query(`sum(bypassd_ring_rx_packets_total)`); !ok || v < 35 {
			t.Errorf("ring counter through Prometheus: %v %v, want 35", v, ok)
		}
		if v, ok := query(`up{job="bypassd"}`); !ok || v != 1 {
			t.Errorf("up = %v %v", v, ok)
		}
	})
}

// startPrometheus runs Debian's prometheus inside ns, scraping bypassd every
// second, and returns its URL. Without the binary the test is skipped
// (failed under BYPASSD_REQUIRE_PRIV=1, where the lab must be complete).
func startPrometheus(t *testing.T, ns *netlab.NS, dir string) string {
	t.Helper()
	bin, err := exec.LookPath("prometheus")
	if err != nil {
		msg := "prometheus is not installed (Debian package prometheus; `make deps` installs it)"
		if os.Getenv("BYPASSD_REQUIRE_PRIV") == "1" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	pdir := filepath.Join(dir, "prometheus")
	if err := os.MkdirAll(pdir, 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(pdir, "prometheus.yml")
	conf := fmt.Sprintf(`global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: bypassd
    static_configs:
      - targets: ["127.0.0.1:%s"]
`, metricsPort)
	if err := os.WriteFile(cfg, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	out := &lockedBuffer{}
	cmd := ns.Command(nil, bin, "--config.file="+cfg, "--storage.tsdb.path="+filepath.Join(pdir, "data"),
		"--web.listen-address=127.0.0.1:"+prometheusPort, "--log.level=warn")
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	runtime.LockOSThread() // see startDaemon: Pdeathsig follows the forking thread
	t.Cleanup(runtime.UnlockOSThread)
	if err := cmd.Start(); err != nil {
		t.Fatalf("start prometheus: %v", err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("prometheus output:\n%s", out.String())
		}
	})
	base := "http://127.0.0.1:" + prometheusPort
	web := nsHTTP(ns)
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := web.Get(base + "/-/ready")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return base
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("prometheus not ready after 30 s: %v\n%s", err, out.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// lockedBuffer collects a process's output while the test may read it.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// metricName finds metric names in PromQL: bypassd's own and the Go and
// process collectors'.
var metricName = regexp.MustCompile(`\b(bypassd|go|process)_[a-z0-9_]+\b`)

// checkDashboard checks that every metric docs/grafana/bypassd.json names
// is in a live /metrics text.
func checkDashboard(t *testing.T, metrics string) {
	b, err := os.ReadFile("../../docs/grafana/bypassd.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash any
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("docs/grafana/bypassd.json is not JSON: %v", err)
	}
	exported := map[string]bool{}
	for _, line := range strings.Split(metrics, "\n") {
		if f := strings.Fields(line); len(f) >= 3 && f[0] == "#" && f[1] == "TYPE" {
			exported[f[2]] = true
		}
	}
	var queries []string
	var walk func(v any, key string)
	walk = func(v any, key string) {
		switch x := v.(type) {
		case map[string]any:
			for k, y := range x {
				walk(y, k)
			}
		case []any:
			for _, y := range x {
				walk(y, key)
			}
		case string:
			if key == "expr" || key == "query" || key == "definition" {
				queries = append(queries, x)
			}
		}
	}
	walk(dash, "")
	if len(queries) < 20 {
		t.Fatalf("only %d queries found in the dashboard", len(queries))
	}
	seen := map[string]bool{}
	for _, q := range queries {
		names := metricName.FindAllString(q, -1)
		if len(names) == 0 && q != "prometheus" {
			t.Errorf("query %q names no metric", q)
		}
		for _, n := range names {
			seen[n] = true
			if !exported[n] {
				t.Errorf("the dashboard queries %s (in %q), which bypassd does not export", n, q)
			}
		}
	}
	t.Logf("%d queries over %d metrics, all exported", len(queries), len(seen))
}
