package state

import (
	"context"
	"strings"
	"testing"
	"time"
)

// Issue 12 item 2: why a resource last changed, down to the input that
// moved and the command that moved it.
func TestExplain(t *testing.T) {
	s := openStore(t)
	ctx := context.Background()
	log := commandLog()
	applyAll(t, s, log[:9])
	next, _ := s.AppliedIndex()
	apply := func(r Request) {
		next++
		if err := s.Apply(next, encodeAt(r, t0.Add(time.Duration(next)*time.Minute))); err != nil {
			t.Fatal(err)
		}
	}
	apply(&AssignRequest{Assignment: Assignment{Node: "ace", Module: "postgres"}})
	apply(&UnassignRequest{Assignment: Assignment{Node: "novox", Module: "postgres"}})
	moved := next
	apply(&PublicDomainRequest{Node: "ace", Domain: "example.org"}) // changes no resource of app
	h, err := s.PlanHistory(ctx, "ace", 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"migrate", "app.migrate"} {
		e, err := Explain("ace", h, name)
		if err != nil {
			t.Fatal(err)
		}
		out := e.String()
		if e.Version != moved || e.Cause != "mesh unassign novox postgres" || len(e.Chain) != 2 {
			t.Fatalf("%s: v%d %q\n%s", name, e.Version, e.Cause, out)
		}
		for _, w := range []string{
			"~ rerun step migrate (app): restart-on: /srv/app/db.binding changed",
			"    because: ~ update binding /srv/app/db.binding (app): resolved content changed (digest ",
		} {
			if !strings.Contains(out, w) {
				t.Fatalf("lacks %q:\n%s", w, out)
			}
		}
		if e.Chain[1].Before == "" || e.Chain[1].Before == e.Chain[1].After {
			t.Fatalf("digests: %+v", e.Chain[1])
		}
	}
	// A resource never changed since the oldest version kept: that version
	// made it.
	e, err := Explain("ace", h, "web.server")
	if err != nil || e.Chain[0].Action.Do != "create" {
		t.Fatalf("%v %+v", err, e)
	}
	if _, err := Explain("ace", h, "nosuch"); err == nil || !strings.Contains(err.Error(), "mesh plan ace") {
		t.Fatalf("unknown resource: %v", err)
	}
}
