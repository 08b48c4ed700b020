package state

import (
	"fmt"
	"strings"
	"testing"
)

// A command of many modules keeps a cause that names ten of them and how
// many more (format 17), in each version of a module it adds, each plan
// and each name it moves; one of ten keeps them all and its format; and a
// command of format 16, replayed from an older log, keeps what format 16
// kept: every one.
func TestCausesNameTenModules(t *testing.T) {
	rolling := func(j int) ModuleSpec { // health checked: its versions are kept
		name := fmt.Sprintf("m%02d", j)
		return spec(name+".yaml", fmt.Sprintf("module: %[1]s\nresources:\n  - container: %[1]s.server\n    image: localhost/busybox:1\n    health: {command: [\"true\"]}\n", name))
	}
	var ten, twelve []ModuleSpec
	var names []string
	for j := range 12 {
		twelve = append(twelve, rolling(j))
		names = append(names, fmt.Sprintf("m%02d", j))
		if j < 10 {
			ten = append(ten, rolling(j))
		}
	}
	if v := NewCommand(&ModuleAddRequest{Modules: ten}).V; v >= shortCauseFormat {
		t.Fatalf("a module add of ten modules is of format %d: an older node would refuse it", v)
	}
	if v := NewCommand(&ModuleAddRequest{Modules: twelve}).V; v != shortCauseFormat {
		t.Fatalf("a module add of twelve modules is of format %d, want %d", v, shortCauseFormat)
	}
	if v := NewCommand(&AssignRequest{Assignment: Assignment{Node: "ace", Module: "m00"}, More: names[1:]}).V; v != shortCauseFormat {
		t.Fatalf("an assign of twelve modules is of format %d, want %d", v, shortCauseFormat)
	}
	if v := NewCommand(&UnassignRequest{Assignment: Assignment{Node: "ace", Module: "m00"}, More: names[1:]}).V; v != shortCauseFormat {
		t.Fatalf("an unassign of twelve modules is of format %d, want %d", v, shortCauseFormat)
	}
	short := "m00.yaml m01.yaml m02.yaml m03.yaml m04.yaml m05.yaml m06.yaml m07.yaml m08.yaml m09.yaml and 2 more"
	whole := "m00.yaml m01.yaml m02.yaml m03.yaml m04.yaml m05.yaml m06.yaml m07.yaml m08.yaml m09.yaml m10.yaml m11.yaml"

	causes := func(s *Store, q string) map[string]bool {
		t.Helper()
		rows, err := s.db.Query(q)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		out := map[string]bool{}
		for rows.Next() {
			var c string
			if err := rows.Scan(&c); err != nil {
				t.Fatal(err)
			}
			out[c] = true
		}
		return out
	}
	for _, tc := range []struct {
		name    string
		v       int // the command's format; 0: NewCommand's
		modules []ModuleSpec
		want    string
	}{
		{"twelve", 0, twelve, "mesh module add " + short},
		{"ten", 0, ten, "mesh module add " + strings.TrimSuffix(whole, " m10.yaml m11.yaml")},
		{"twelve of format 16", batchHostsFormat, twelve, "mesh module add " + whole},
	} {
		s := openStore(t)
		var idx uint64
		mustApply(t, s, &idx, &InitRequest{MeshID: "m-1", Domain: "internal", Node: Node{Name: "ace", Address: "10.0.0.1"}})
		c := NewCommand(&ModuleAddRequest{Modules: tc.modules})
		if tc.v != 0 {
			c.V = tc.v
		}
		c.Time = t0
		idx++
		if err := s.Apply(idx, c.Encode()); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		got := causes(s, `SELECT DISTINCT cause FROM module_history`)
		if len(got) != 1 || !got[tc.want] {
			t.Fatalf("%s: the versions' causes %v, want %q", tc.name, got, tc.want)
		}
		var n int
		if err := s.db.QueryRow(`SELECT count(*) FROM module_history`).Scan(&n); err != nil || n != len(tc.modules) {
			t.Fatalf("%s: %d versions kept (%v), want %d", tc.name, n, err, len(tc.modules))
		}
		if tc.name != "twelve" {
			continue
		}
		// An assign and an unassign of the twelve: the plan's cause and
		// each name's.
		for _, r := range []Request{
			&AssignRequest{Assignment: Assignment{Node: "ace", Module: "m00"}, More: names[1:]},
			&UnassignRequest{Assignment: Assignment{Node: "ace", Module: "m00"}, More: names[1:]},
		} {
			mustApply(t, s, &idx, r)
			want := fmt.Sprintf("mesh %s ace m00 m01 m02 m03 m04 m05 m06 m07 m08 m09 and 2 more", r.Op())
			if got := causes(s, fmt.Sprintf(`SELECT cause FROM plans WHERE version = %d`, idx)); len(got) != 1 || !got[want] {
				t.Fatalf("%s: the plan's cause %v, want %q", r.Op(), got, want)
			}
			if got := causes(s, fmt.Sprintf(`SELECT DISTINCT cause FROM roster_history WHERE idx = %d`, idx)); len(got) != 1 || !got[want] {
				t.Fatalf("%s: the names' cause %v, want %q", r.Op(), got, want)
			}
		}
	}
}
