// Package metrics is the agent's Prometheus metrics (mesh agent
// --metrics-listen): Raft, the resolver, applies and Podman calls, each fed
// by the composition root through a hook, so no other package imports
// Prometheus.
package metrics

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"mesh/internal/connlimit"
	"mesh/state"
	"mesh/state/manifest"
)

// Metrics holds the agent's collectors in a registry of its own.
type Metrics struct {
	reg *prometheus.Registry

	queries      *prometheus.CounterVec
	queryTime    *prometheus.HistogramVec
	applyTime    prometheus.Histogram
	applies      *prometheus.CounterVec
	mutations    prometheus.Counter
	replacements *prometheus.CounterVec
	stepsRun     prometheus.Counter
	kept         prometheus.Gauge
	podmanErrors *prometheus.CounterVec
}

// New makes the metrics; raftStats (Raft's Stats) is read at each scrape.
func New(raftStats func() map[string]string) *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		queries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mesh_dns_queries_total", Help: "Queries the resolver answered, by rcode and by whether they were forwarded upstream.",
		}, []string{"rcode", "forwarded"}),
		queryTime: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "mesh_dns_query_duration_seconds", Help: "Time to answer a query, by whether it was forwarded upstream.",
			Buckets: []float64{.00005, .0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5},
		}, []string{"forwarded"}),
		applyTime: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "mesh_apply_duration_seconds", Help: "Time to apply a plan (resync applies included).",
			Buckets: prometheus.ExponentialBuckets(0.005, 2.5, 12),
		}),
		applies: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mesh_applies_total", Help: "Applies of a plan, by result (ok, or failed: some module failed).",
		}, []string{"result"}),
		mutations: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "mesh_apply_mutations_total", Help: "Changes applies made: mutating Podman calls and files or directories written or removed.",
		}),
		replacements: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mesh_container_replacements_total", Help: "Containers replaced, by the kind of reason: declaration, restart-on, step (a step it names ran), pull (its image changed at mesh module pull), other.",
		}, []string{"reason"}),
		stepsRun: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "mesh_steps_run_total", Help: "Run-once steps run.",
		}),
		kept: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "mesh_kept_paths", Help: "Paths the last apply kept instead of removing (they hold what the mesh did not put there).",
		}),
		podmanErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mesh_podman_call_errors_total", Help: "Podman calls that failed, by call.",
		}, []string{"call"}),
	}
	m.reg.MustRegister(m.queries, m.queryTime, m.applyTime, m.applies, m.mutations, m.replacements, m.stepsRun, m.kept, m.podmanErrors,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if raftStats != nil {
		m.reg.MustRegister(&raftCollector{stats: raftStats})
	}
	return m
}

// DataDirFree has each scrape read the space left in the data dir.
func (m *Metrics) DataDirFree(free func() uint64) {
	m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "mesh_data_dir_free_bytes", Help: "Space left in the node's data dir; writes through the node stop below the floor (32 MiB).",
	}, func() float64 { return float64(free()) }))
}

// ObserveQuery counts one answered query (dnsd.Config.Observe).
func (m *Metrics) ObserveQuery(rcode int, forwarded bool, took time.Duration) {
	f := strconv.FormatBool(forwarded)
	name, ok := dns.RcodeToString[rcode]
	if !ok {
		name = strconv.Itoa(rcode)
	}
	m.queries.WithLabelValues(name, f).Inc()
	m.queryTime.WithLabelValues(f).Observe(took.Seconds())
}

// ObserveApply records one apply's report (reconciler.Config.Observe).
func (m *Metrics) ObserveApply(rep *state.Report, took time.Duration) {
	m.applyTime.Observe(took.Seconds())
	result := "ok"
	if rep.Error != "" {
		result = "failed"
	}
	m.applies.WithLabelValues(result).Inc()
	m.mutations.Add(float64(rep.Mutations))
	kept := 0
	for _, r := range rep.Resources {
		switch r.Outcome {
		case state.Replaced:
			if r.Kind == manifest.KindContainer {
				m.replacements.WithLabelValues(reasonClass(r.Reason)).Inc()
			}
		case state.Ran:
			m.stepsRun.Inc()
		case state.Kept:
			kept++
		}
	}
	m.kept.Set(float64(kept))
}

// reasonClass bounds the label's values: the reasons themselves name paths.
func reasonClass(reason string) string {
	switch {
	case strings.Contains(reason, "mesh module pull"):
		return "pull"
	case strings.HasPrefix(reason, "step "):
		return "step"
	case strings.HasPrefix(reason, "restart-on:"):
		return "restart-on"
	case strings.Contains(reason, " changed"):
		return "declaration"
	}
	return "other"
}

// Handler serves the metrics in Prometheus's text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
}

// serveIdle is how long a scraper's idle connection is kept, and
// serveMaxConns and serveMaxConnsPerSource how many may be open.
var serveIdle = 2 * time.Minute

const (
	serveMaxConns          = 64
	serveMaxConnsPerSource = 16
)

// Serve listens on addr and serves /metrics until ctx ends.
func (m *Metrics) Serve(ctx context.Context, addr string) (net.Addr, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	// Whoever reaches the port is bounded, as at the web page: each
	// connection held open costs a descriptor and a goroutine, and one kept
	// idle after a scrape was held for ever.
	ln = &connlimit.Listener{Listener: ln, Bounds: connlimit.NewByNetwork(serveMaxConns, serveMaxConnsPerSource)}
	mux := http.NewServeMux()
	mux.Handle("/metrics", m.Handler())
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second,
		WriteTimeout: 30 * time.Second, IdleTimeout: serveIdle, MaxHeaderBytes: 64 << 10}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		srv.Shutdown(sctx)
	}()
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			ln.Close()
		}
	}()
	return ln.Addr(), nil
}

// raftCollector reads Raft's stats at each scrape.
type raftCollector struct{ stats func() map[string]string }

var (
	raftState   = prometheus.NewDesc("mesh_raft_state", "1 for this node's Raft state (follower, candidate, leader, shutdown).", []string{"state"}, nil)
	raftTerm    = prometheus.NewDesc("mesh_raft_term", "Raft's current term.", nil, nil)
	raftCommit  = prometheus.NewDesc("mesh_raft_commit_index", "The highest log index known committed.", nil, nil)
	raftApplied = prometheus.NewDesc("mesh_raft_applied_index", "The highest log index applied to the replica.", nil, nil)
	raftLastLog = prometheus.NewDesc("mesh_raft_last_log_index", "The last index in this node's log.", nil, nil)
	raftLag     = prometheus.NewDesc("mesh_raft_apply_lag", "Committed entries not applied yet (commit index - applied index).", nil, nil)
)

func (c *raftCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{raftState, raftTerm, raftCommit, raftApplied, raftLastLog, raftLag} {
		ch <- d
	}
}

func (c *raftCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.stats()
	num := func(k string) float64 {
		v, _ := strconv.ParseUint(s[k], 10, 64)
		return float64(v)
	}
	for _, st := range []string{"Follower", "Candidate", "Leader", "Shutdown"} {
		v := 0.0
		if s["state"] == st {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(raftState, prometheus.GaugeValue, v, strings.ToLower(st))
	}
	ch <- prometheus.MustNewConstMetric(raftTerm, prometheus.GaugeValue, num("term"))
	ch <- prometheus.MustNewConstMetric(raftCommit, prometheus.GaugeValue, num("commit_index"))
	ch <- prometheus.MustNewConstMetric(raftApplied, prometheus.GaugeValue, num("applied_index"))
	ch <- prometheus.MustNewConstMetric(raftLastLog, prometheus.GaugeValue, num("last_log_index"))
	lag := num("commit_index") - num("applied_index")
	if lag < 0 {
		lag = 0
	}
	ch <- prometheus.MustNewConstMetric(raftLag, prometheus.GaugeValue, lag)
}
