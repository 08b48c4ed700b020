package operate

import (
	"strings"
	"testing"

	"mesh/cluster/api"
)

// An exec runs in one container: a module of several containers on one
// node asks for MODULE.CONTAINER (naming them), and only the same
// container on several nodes asks for --node.
func TestOneSource(t *testing.T) {
	for _, tc := range []struct {
		name   string
		target string
		srcs   []api.Source
		want   string // the container chosen, or words the error must hold
		err    bool
	}{
		{"one", "app.server", []api.Source{{Node: "ace", Container: "app.server"}}, "app.server", false},
		{"module of two containers on one node", "app", []api.Source{{Node: "ace", Container: "app.server"}, {Node: "ace", Container: "app.worker"}},
			"app has several containers (app.server, app.worker): name one, as MODULE.CONTAINER", true},
		{"module of two containers on two nodes", "app", []api.Source{{Node: "ace", Container: "app.worker"}, {Node: "g14", Container: "app.server"}},
			"app has several containers (app.server, app.worker)", true},
		{"one container on two nodes", "app.server", []api.Source{{Node: "ace", Container: "app.server"}, {Node: "g14", Container: "app.server"}},
			"app.server runs on 2 nodes (ace, g14): say which with --node", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src, err := oneSource(tc.target, tc.srcs)
			switch {
			case tc.err && err == nil:
				t.Fatalf("chose %v, want an error saying %q", src, tc.want)
			case tc.err && !strings.Contains(err.Error(), tc.want):
				t.Fatalf("said %q, want it to say %q", err, tc.want)
			case tc.err && strings.Contains(tc.want, "several") && strings.Contains(err.Error(), "--node"):
				t.Fatalf("said %q: --node cannot choose among containers", err)
			case !tc.err && err != nil:
				t.Fatal(err)
			case !tc.err && src.Container != tc.want:
				t.Fatalf("chose %s, want %s", src.Container, tc.want)
			}
		})
	}
}
