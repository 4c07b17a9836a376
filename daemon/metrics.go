package daemon

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"

	"github.com/bypassd/bypassd/internal/ctlproto"
	"github.com/bypassd/bypassd/stats"
)

// metricsServer serves /metrics for Prometheus.
type metricsServer struct {
	srv    *http.Server
	addr   net.Addr
	served chan error
}

// startMetrics listens on config.Config.MetricsAddr (in the daemon's network
// namespace) and serves the registry.
func (d *Daemon) startMetrics() error {
	if d.cfg.MetricsAddr == "" {
		return nil
	}
	reg, err := stats.NewRegistry(stats.NewCollector(d.metricsSnapshot, d.cfg.MetricsMaxClients),
		stats.BuildInfo{Version: d.cfg.Version, ProtocolVersion: ctlproto.Version})
	if err != nil {
		return fmt.Errorf("metrics: %w", err)
	}
	ln, err := net.Listen("tcp", d.cfg.MetricsAddr)
	if err != nil {
		return fmt.Errorf("metrics address %s: %w (is another program on that port? choose another with --metrics-addr, or give an empty one to serve no metrics)", d.cfg.MetricsAddr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{
		ErrorLog: zap.NewStdLog(d.log.Named("metrics")), Registry: reg}))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "bypassd: metrics are at /metrics")
	})
	m := &metricsServer{addr: ln.Addr(), served: make(chan error, 1),
		srv: &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, ErrorLog: zap.NewStdLog(d.log.Named("metrics"))}}
	go func() { m.served <- m.srv.Serve(ln) }()
	d.metrics = m
	return nil
}

// MetricsAddr returns the address /metrics is served on ("" when it is
// not), with the port the kernel chose for port 0.
func (d *Daemon) MetricsAddr() string {
	if d.metrics == nil {
		return ""
	}
	return d.metrics.addr.String()
}

// stopMetrics stops serving, waiting for scrapes in progress.
func (d *Daemon) stopMetrics() error {
	m := d.metrics
	if m == nil {
		return nil
	}
	d.metrics = nil
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := m.srv.Shutdown(ctx)
	if serr := <-m.served; !errors.Is(serr, http.ErrServerClosed) && serr != nil {
		err = errors.Join(err, serr)
	}
	if err != nil {
		return fmt.Errorf("metrics: %w", err)
	}
	return nil
}

// metricsSnapshot reads every counter for one scrape (raw, never zeroed).
func (d *Daemon) metricsSnapshot() *stats.Metrics {
	st := &d.stats
	st.mu.Lock()
	defer st.mu.Unlock()
	m := &stats.Metrics{Rings: d.ringBlocks(), Daemon: d.daemonCounters()}
	m.TCs = d.tcMetrics()
	for _, c := range st.clients {
		c.mu.Lock()
		v := c.view(d, false)
		c.mu.Unlock()
		m.Clients = append(m.Clients, stats.ClientMetrics{PID: c.pid, Command: c.command, Started: c.started.UnixNano(),
			Sockets: v.nsockets, QueueMemory: v.queueMem, Totals: v.total})
	}
	for i := range d.ctl.requests {
		code := ctlproto.Code(i)
		name := "unknown"
		if i > 0 {
			if !code.Known() || code == ctlproto.CodeShutdown || code == ctlproto.CodeSocketError {
				continue
			}
			name = code.String()
		}
		m.Requests = append(m.Requests, stats.RequestCount{Code: name, Requests: d.ctl.requests[i].Load(), Errors: d.ctl.errors[i].Load()})
	}
	return m
}
