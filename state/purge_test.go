package state

import (
	"context"
	"strings"
	"testing"
)

// mesh unassign --purge-data (issue 30): the paths must be the module's
// data directories (anything else is refused and nothing changes); the
// node's plan then lists them to purge, and an assign of the module there
// again drops the purge before any plan carries it; a restore drops them all.
func TestUnassignPurgesData(t *testing.T) {
	ctx := context.Background()
	s := openStore(t)
	var idx uint64
	mustApply(t, s, &idx, &InitRequest{MeshID: "m-1", Node: Node{Name: "ace", Address: "10.0.0.1"}})
	src := "module: pg\nresources:\n  - directory: /srv/pg\n    owner: \"0:0\"\n    mode: \"0755\"\n  - directory: /srv/pg/data\n    owner: \"999:999\"\n    mode: \"0700\"\n    data: true\n  - container: pg.server\n    image: postgres:16\n    mounts: [\"/srv/pg/data:/var/lib/postgresql/data\"]\n"
	mustApply(t, s, &idx, &ModuleAddRequest{Modules: []ModuleSpec{spec("pg.yaml", src)}})
	mustApply(t, s, &idx, &AssignRequest{Assignment: Assignment{Node: "ace", Module: "pg"}})
	for _, bad := range [][]string{{"/srv/pg"}, {"/srv/pg/data", "/etc"}, {"/srv/other"}} {
		err := applyErr(t, s, &idx, &UnassignRequest{Assignment: Assignment{Node: "ace", Module: "pg"}, PurgeData: bad})
		if err == nil || !strings.Contains(err.Error(), "is not a data directory of module \"pg\"; nothing was changed") {
			t.Fatalf("purge %v: %v", bad, err)
		}
	}
	if p, _ := s.Plan(ctx, "ace"); len(p.Plan.Resources) == 0 {
		t.Fatal("a refused purge unassigned the module")
	}
	if v := NewCommand(&UnassignRequest{Assignment: Assignment{Node: "ace", Module: "pg"}, PurgeData: []string{"/srv/pg/data"}}).V; v != purgeMovedFormat {
		t.Fatalf("an unassign with a purge has format %d, want %d", v, purgeMovedFormat)
	}
	if v := NewCommand(&UnassignRequest{Assignment: Assignment{Node: "ace", Module: "pg"}}).V; v != 3 {
		t.Fatalf("an unassign without a purge has format %d, want 3", v)
	}
	mustApply(t, s, &idx, &UnassignRequest{Assignment: Assignment{Node: "ace", Module: "pg"}, PurgeData: []string{"/srv/pg/data"}})
	p, err := s.Plan(ctx, "ace")
	if err != nil || len(p.Plan.Purge) != 1 || p.Plan.Purge[0] != (Purge{Module: "pg", Path: "/srv/pg/data"}) {
		t.Fatalf("the plan after the purge: %+v %v", p.Plan, err)
	}
	mustApply(t, s, &idx, &AssignRequest{Assignment: Assignment{Node: "ace", Module: "pg"}})
	mustApply(t, s, &idx, &UnassignRequest{Assignment: Assignment{Node: "ace", Module: "pg"}})
	if p, _ := s.Plan(ctx, "ace"); len(p.Plan.Purge) != 0 {
		t.Fatalf("a purge outlived the module's assignment: %+v", p.Plan.Purge)
	}
}
