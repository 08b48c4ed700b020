package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"mesh/agent/overlay"
)

var (
	overlayPeers     = prometheus.NewDesc("mesh_overlay_peers", "Peers this node's overlay device has.", nil, nil)
	overlayHandshake = prometheus.NewDesc("mesh_overlay_peer_last_handshake_seconds", "When the overlay last completed a handshake with the peer (Unix time; 0: never).", []string{"peer"}, nil)
	overlayRx        = prometheus.NewDesc("mesh_overlay_peer_received_bytes_total", "Bytes received over the overlay from the peer.", []string{"peer"}, nil)
	overlayTx        = prometheus.NewDesc("mesh_overlay_peer_sent_bytes_total", "Bytes sent over the overlay to the peer.", []string{"peer"}, nil)
)

// Overlay has each scrape read the overlay's peers from stats (nil when
// the overlay is not up).
func (m *Metrics) Overlay(stats func() map[string]overlay.PeerStats) {
	m.reg.MustRegister(&overlayCollector{stats: stats})
}

type overlayCollector struct {
	stats func() map[string]overlay.PeerStats
}

func (c *overlayCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{overlayPeers, overlayHandshake, overlayRx, overlayTx} {
		ch <- d
	}
}

func (c *overlayCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.stats()
	ch <- prometheus.MustNewConstMetric(overlayPeers, prometheus.GaugeValue, float64(len(s)))
	for name, p := range s {
		at := 0.0
		if !p.LastHandshake.IsZero() {
			at = float64(p.LastHandshake.UnixNano()) / 1e9
		}
		ch <- prometheus.MustNewConstMetric(overlayHandshake, prometheus.GaugeValue, at, name)
		ch <- prometheus.MustNewConstMetric(overlayRx, prometheus.CounterValue, float64(p.RxBytes), name)
		ch <- prometheus.MustNewConstMetric(overlayTx, prometheus.CounterValue, float64(p.TxBytes), name)
	}
}
