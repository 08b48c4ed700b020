package metrics

import (
	"context"

	"mesh/reconciler"
)

// Runtime counts the errors of rt's Podman calls, by call. The events
// stream ending with its context is not an error.
func (m *Metrics) Runtime(rt reconciler.Runtime) reconciler.Runtime {
	return &reconciler.Around{Runtime: rt, After: func(ctx context.Context, call string, err error) {
		if err != nil && !(call == "events" && ctx.Err() != nil) {
			m.podmanErrors.WithLabelValues(call).Inc()
		}
	}}
}
