package state

import (
	"bytes"
	"compress/flate"
	"context"
	"encoding/json"
	"io"
	"strings"
	"testing"
)

// A plan's body is kept packed, read back the same, and a plain one (an
// earlier binary's) reads as it is; a damaged or bomb-like one is an
// error, never a panic or the node's memory.
func TestPlanBodyPacking(t *testing.T) {
	body := `{"node":"ace","resources":[` + strings.Repeat(`{"kind":"directory","name":"/srv/x"},`, 200) + `{"kind":"file"}]}`
	packed := packPlan(body)
	if packed[0] != packedPlan || len(packed) > len(body)/5 {
		t.Fatalf("packed %d bytes into %d (first byte %q)", len(body), len(packed), packed[0])
	}
	got, err := unpackPlan(packed)
	if err != nil || string(got) != body {
		t.Fatalf("unpacked: %v, same=%v", err, string(got) == body)
	}
	if n, err := resourceCount(packed); err != nil || n != 201 {
		t.Fatalf("resources of the packed plan: %d, %v", n, err)
	}
	// What it packs is plain DEFLATE: the standard library's inflater (an
	// earlier binary's) reads it too.
	if got, err := io.ReadAll(flate.NewReader(bytes.NewReader(packed[1:]))); err != nil || string(got) != body {
		t.Fatalf("the standard inflater on a packed body: %v, same=%v", err, string(got) == body)
	}
	if got, err := unpackPlan([]byte(body)); err != nil || string(got) != body {
		t.Fatalf("a plain body: %v", err)
	}
	if _, err := unpackPlan(append([]byte{packedPlan}, "not deflate at all"...)); err == nil {
		t.Fatal("a damaged body unpacked")
	}
	if _, err := resourceCount(packed[:len(packed)/2]); err == nil {
		t.Fatal("a cut body was counted")
	}
	was := maxPlanBody
	defer func() { maxPlanBody = was }()
	maxPlanBody = 1 << 20
	var bomb bytes.Buffer
	bomb.WriteByte(packedPlan)
	w, _ := flate.NewWriter(&bomb, flate.BestCompression)
	w.Write(make([]byte, 4<<20))
	w.Close()
	if _, err := unpackPlan(bomb.Bytes()); err == nil || !strings.Contains(err.Error(), "inflates past 1 MB") {
		t.Fatalf("a body that inflates past the bound: %v", err)
	}
}

// The store keeps plans packed, and so does a snapshot; a restore gives the
// same state back, packs an earlier binary's plain bodies and refuses a
// body that is neither; a damaged stored plan fails its reads with a clear
// error.
func TestPlansPackedInTheStore(t *testing.T) {
	ctx := context.Background()
	s := openStore(t)
	var idx uint64
	mustApply(t, s, &idx, &InitRequest{MeshID: "m-1", Node: Node{Name: "ace", Address: "10.0.0.1"}})
	mustApply(t, s, &idx, &ModuleAddRequest{Modules: []ModuleSpec{spec("git.yaml", edgeGitSrc)}})
	mustApply(t, s, &idx, &AssignRequest{Assignment: Assignment{Node: "ace", Module: "git"}})
	var stored []byte
	if err := s.db.QueryRow(`SELECT body FROM plans WHERE node = 'ace' ORDER BY version DESC LIMIT 1`).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	if len(stored) == 0 || stored[0] != packedPlan {
		t.Fatalf("the stored plan is not packed: %.40q", stored)
	}
	p, err := s.Plan(ctx, "ace")
	if err != nil || len(p.Plan.Resources) == 0 {
		t.Fatalf("plan: %+v, %v", p, err)
	}
	dump := dumpJSON(t, s)
	if !strings.Contains(dump, `"body":"z`) {
		t.Fatal("the snapshot's plans are not packed")
	}
	r := openStore(t)
	if err := r.Restore(ctx, strings.NewReader(dump)); err != nil {
		t.Fatal(err)
	}
	if err := r.db.QueryRow(`SELECT body FROM plans WHERE node = 'ace' ORDER BY version DESC LIMIT 1`).Scan(&stored); err != nil || stored[0] != packedPlan {
		t.Fatalf("a restore left the plan unpacked: %v", err)
	}
	if again := dumpJSON(t, r); !sameState(dump, again) {
		t.Fatal("a restored snapshot gives another state back")
	}
	// An earlier binary's plain body reads as it is.
	plain, _ := unpackPlan(stored)
	if _, err := s.db.Exec(`UPDATE plans SET body = ? WHERE node = 'ace'`, string(plain)); err != nil {
		t.Fatal(err)
	}
	if q, err := s.Plan(ctx, "ace"); err != nil || len(q.Plan.Resources) != len(p.Plan.Resources) {
		t.Fatalf("a plain stored plan: %v", err)
	}
	if _, err := s.db.Exec(`UPDATE plans SET body = ? WHERE node = 'ace'`, append([]byte{packedPlan}, "damaged"...)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Plan(ctx, "ace"); err == nil || !strings.Contains(err.Error(), "damaged") {
		t.Fatalf("a damaged stored plan read: %v", err)
	}
	for _, tc := range []struct{ body, want string }{
		{string(plain), ""}, // an earlier binary's snapshot
		{"z!!!", "not base64"},
		{"<xml/>", "neither JSON nor packed"},
	} {
		var sn Snapshot
		json.Unmarshal([]byte(dump), &sn)
		for _, row := range sn.Tables["plans"] {
			row["body"] = tc.body
		}
		b, _ := json.Marshal(sn)
		r := openStore(t)
		err := r.Restore(ctx, bytes.NewReader(b))
		if tc.want == "" {
			if err != nil {
				t.Fatalf("a snapshot with plain bodies: %v", err)
			}
			r.db.QueryRow(`SELECT body FROM plans WHERE node = 'ace' ORDER BY version DESC LIMIT 1`).Scan(&stored)
			if q, err := r.Plan(ctx, "ace"); err != nil || stored[0] != packedPlan || len(q.Plan.Resources) != len(p.Plan.Resources) {
				t.Fatalf("a plain body restored: %v (first byte %q)", err, stored[0])
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Fatalf("a snapshot whose plan body is %q: %v", tc.body, err)
		}
	}
}

// BenchmarkPlanDeflaters packs a plan of 100 modules (a node's at 10,000
// modules over 100 nodes) with the deflater packWith uses and with the
// standard library's, for the figures planWriters' comment gives.
func BenchmarkPlanDeflaters(b *testing.B) {
	defer benchRuns()()
	f, _ := newBenchFleet(b, 10, 1000)
	f.assignStraight(b, 10, 999)
	check := checkComposition
	checkComposition, alwaysFull = false, true
	defer func() { checkComposition, alwaysFull = check, false }()
	f.apply(b, &AssignRequest{Assignment: Assignment{Node: "n009", Module: "m00999"}})
	pv, err := f.s.Plan(context.Background(), "n003")
	if err != nil {
		b.Fatal(err)
	}
	body, _ := json.Marshal(pv.Plan)
	if len(pv.Plan.Resources) < 100 {
		b.Fatalf("a plan of %d resources", len(pv.Plan.Resources))
	}
	b.Run("packWith", func(b *testing.B) {
		var out []byte
		for i := 0; i < b.N; i++ {
			out = packPlan(body)
		}
		b.ReportMetric(float64(len(body)), "in-bytes")
		b.ReportMetric(float64(len(out)), "out-bytes")
	})
	b.Run("stdlib", func(b *testing.B) {
		var out bytes.Buffer
		w, _ := flate.NewWriter(nil, flate.BestSpeed)
		for i := 0; i < b.N; i++ {
			out.Reset()
			out.WriteByte(packedPlan)
			w.Reset(&out)
			w.Write(body)
			w.Close()
		}
		b.ReportMetric(float64(len(body)), "in-bytes")
		b.ReportMetric(float64(out.Len()), "out-bytes")
	})
}
