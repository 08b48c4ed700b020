package reconciler

import "context"

// Around wraps a Runtime with code run around each of its calls: the apply's
// counts, its lock let go during a call while modules apply at once, the
// agent's metrics of failed calls. Call names are the metrics' labels.
type Around struct {
	Runtime
	// Before, when set, runs as a call starts; mutating says it changes
	// what runs (pull, create, start, remove).
	Before func(call string, mutating bool)
	// After, when set, runs as the call ends, a panic included, with its
	// error and the context it was made with.
	After func(ctx context.Context, call string, err error)
}

func (a *Around) around(ctx context.Context, call string, mutating bool) func(*error) {
	if a.Before != nil {
		a.Before(call, mutating)
	}
	return func(err *error) {
		if a.After != nil {
			a.After(ctx, call, *err)
		}
	}
}

func (a *Around) Managed(ctx context.Context) (_ []Container, err error) {
	defer a.around(ctx, "managed", false)(&err)
	return a.Runtime.Managed(ctx)
}

func (a *Around) Lookup(ctx context.Context, name string) (_ Container, _ bool, err error) {
	defer a.around(ctx, "lookup", false)(&err)
	return a.Runtime.Lookup(ctx, name)
}

func (a *Around) ImageExists(ctx context.Context, ref string) (_ bool, err error) {
	defer a.around(ctx, "image_exists", false)(&err)
	return a.Runtime.ImageExists(ctx, ref)
}

func (a *Around) Pull(ctx context.Context, ref, policy string) (err error) {
	defer a.around(ctx, "pull", true)(&err)
	return a.Runtime.Pull(ctx, ref, policy)
}

func (a *Around) ImageID(ctx context.Context, ref string) (_ string, err error) {
	defer a.around(ctx, "image_id", false)(&err)
	return a.Runtime.ImageID(ctx, ref)
}

func (a *Around) ImageVolumes(ctx context.Context, ref string) (_ []string, err error) {
	defer a.around(ctx, "image_volumes", false)(&err)
	return a.Runtime.ImageVolumes(ctx, ref)
}

func (a *Around) Tag(ctx context.Context, id, ref string) (err error) {
	defer a.around(ctx, "tag", true)(&err)
	return a.Runtime.Tag(ctx, id, ref)
}

func (a *Around) Create(ctx context.Context, s Spec) (_ string, err error) {
	defer a.around(ctx, "create", true)(&err)
	return a.Runtime.Create(ctx, s)
}

func (a *Around) Start(ctx context.Context, id string) (err error) {
	defer a.around(ctx, "start", true)(&err)
	return a.Runtime.Start(ctx, id)
}

func (a *Around) Restart(ctx context.Context, id string) (err error) {
	defer a.around(ctx, "restart", true)(&err)
	return a.Runtime.Restart(ctx, id)
}

func (a *Around) Remove(ctx context.Context, id string) (err error) {
	defer a.around(ctx, "remove", true)(&err)
	return a.Runtime.Remove(ctx, id)
}

func (a *Around) Wait(ctx context.Context, id string) (_ int, err error) {
	defer a.around(ctx, "wait", false)(&err)
	return a.Runtime.Wait(ctx, id)
}

func (a *Around) Logs(ctx context.Context, id string, lines int) (_ string, err error) {
	defer a.around(ctx, "logs", false)(&err)
	return a.Runtime.Logs(ctx, id, lines)
}

func (a *Around) HealthCheck(ctx context.Context, name string) (_ HealthResult, err error) {
	defer a.around(ctx, "healthcheck", false)(&err)
	return a.Runtime.HealthCheck(ctx, name)
}

func (a *Around) Died(ctx context.Context, died func(id, name string, exitCode int)) (err error) {
	defer a.around(ctx, "events", false)(&err)
	return a.Runtime.Died(ctx, died)
}

func (a *Around) Restarts(ctx context.Context, name string) (_ string, _ int, err error) {
	defer a.around(ctx, "restarts", false)(&err)
	return a.Runtime.Restarts(ctx, name)
}

func (a *Around) Networks(ctx context.Context) (_ []Network, err error) {
	defer a.around(ctx, "networks", false)(&err)
	return a.Runtime.Networks(ctx)
}

func (a *Around) CreateNetwork(ctx context.Context, n Network) (err error) {
	defer a.around(ctx, "create_network", true)(&err)
	return a.Runtime.CreateNetwork(ctx, n)
}

func (a *Around) RemoveNetwork(ctx context.Context, name string) (err error) {
	defer a.around(ctx, "remove_network", true)(&err)
	return a.Runtime.RemoveNetwork(ctx, name)
}
