package metrics

import (
	"context"

	"mesh/reconciler"
)

// Runtime counts the errors of rt's Podman calls, by call.
func (m *Metrics) Runtime(rt reconciler.Runtime) reconciler.Runtime {
	return &countingRuntime{rt: rt, m: m}
}

type countingRuntime struct {
	rt reconciler.Runtime
	m  *Metrics
}

func (c *countingRuntime) count(call string, err error) {
	if err != nil {
		c.m.podmanErrors.WithLabelValues(call).Inc()
	}
}

func (c *countingRuntime) Managed(ctx context.Context) ([]reconciler.Container, error) {
	r, err := c.rt.Managed(ctx)
	c.count("managed", err)
	return r, err
}

func (c *countingRuntime) Lookup(ctx context.Context, name string) (reconciler.Container, bool, error) {
	r, ok, err := c.rt.Lookup(ctx, name)
	c.count("lookup", err)
	return r, ok, err
}

func (c *countingRuntime) ImageExists(ctx context.Context, ref string) (bool, error) {
	ok, err := c.rt.ImageExists(ctx, ref)
	c.count("image_exists", err)
	return ok, err
}

func (c *countingRuntime) Pull(ctx context.Context, ref, policy string) error {
	err := c.rt.Pull(ctx, ref, policy)
	c.count("pull", err)
	return err
}

func (c *countingRuntime) ImageID(ctx context.Context, ref string) (string, error) {
	id, err := c.rt.ImageID(ctx, ref)
	c.count("image_id", err)
	return id, err
}

func (c *countingRuntime) Create(ctx context.Context, spec reconciler.Spec) (string, error) {
	id, err := c.rt.Create(ctx, spec)
	c.count("create", err)
	return id, err
}

func (c *countingRuntime) Start(ctx context.Context, id string) error {
	err := c.rt.Start(ctx, id)
	c.count("start", err)
	return err
}

func (c *countingRuntime) Remove(ctx context.Context, id string) error {
	err := c.rt.Remove(ctx, id)
	c.count("remove", err)
	return err
}

func (c *countingRuntime) Wait(ctx context.Context, id string) (int, error) {
	code, err := c.rt.Wait(ctx, id)
	c.count("wait", err)
	return code, err
}

func (c *countingRuntime) Logs(ctx context.Context, id string, lines int) (string, error) {
	s, err := c.rt.Logs(ctx, id, lines)
	c.count("logs", err)
	return s, err
}

func (c *countingRuntime) HealthCheck(ctx context.Context, name string) (reconciler.HealthResult, error) {
	r, err := c.rt.HealthCheck(ctx, name)
	c.count("healthcheck", err)
	return r, err
}

func (c *countingRuntime) Died(ctx context.Context, died func(id, name string, exitCode int)) error {
	err := c.rt.Died(ctx, died)
	if ctx.Err() == nil {
		c.count("events", err)
	}
	return err
}

func (c *countingRuntime) Restarts(ctx context.Context, name string) (string, int, error) {
	id, n, err := c.rt.Restarts(ctx, name)
	c.count("restarts", err)
	return id, n, err
}
