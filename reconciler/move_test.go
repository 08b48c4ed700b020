package reconciler

import (
	"context"
	"encoding/json"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"mesh/state"
	"mesh/state/manifest"
)

// A move's receiver refuses a data directory that holds another module's
// path: swapping the copy in sets the directory aside, and that path with
// it (a review found a move of a module declaring /srv/shared would have
// taken the data of the modules under it).
func TestOthersUnder(t *testing.T) {
	b := appliedSecretBed(t, "v", "k")
	mail := filepath.Join(b.dir, "mail")
	if got := b.r.PathModule(mail); got != "mail" {
		t.Fatalf("the ledger gives %s to %q", mail, got)
	}
	for _, tc := range []struct{ path, module, want string }{
		{b.dir, "other", mail + " (module mail)"},                // around mail's paths: the first in order
		{mail, "other", mail + " (module mail)"},                 // mail's own directory
		{b.dir, "mail", ""},                                      // the module's own paths are its to move
		{filepath.Join(b.dir, "elsewhere"), "other", ""},         // nothing under it
		{filepath.Join(b.dir, "mai"), "other", ""},               // a prefix of a name is not a parent
		{filepath.Join(mail, "smtp.password", "x"), "other", ""}, // under a path, not around it
	} {
		if got := b.r.OthersUnder(tc.path, tc.module); got != tc.want {
			t.Errorf("OthersUnder(%s, %s) = %q, want %q", tc.path, tc.module, got, tc.want)
		}
	}
}

// A move's adoption that cannot save the ledger (a full disk) leaves the
// ledger in memory as it was: the receiver puts back what it swapped in,
// and a later save must not give the module a directory that is not its.
func TestAdoptTakesBackWhatItCouldNotSave(t *testing.T) {
	b := appliedSecretBed(t, "v", "k")
	before, err := json.Marshal(b.r.ledger)
	if err != nil {
		t.Fatal(err)
	}
	mail := filepath.Join(b.dir, "mail")
	moved := filepath.Join(b.dir, "srv", "moved")
	path := b.r.ledger.path
	b.r.ledger.path = filepath.Join(path, "not-a-directory") // the save fails
	arr := Arrival{Move: 7, Until: time.Now().Add(time.Hour)}
	err = b.r.Adopt("moved", arr, map[string]Marker{"moved.init": {Digest: "d"}, "mail.x": {Digest: "e"}},
		[]string{moved, mail}, []string{filepath.Join(b.dir, "srv")}, nil)
	if err == nil {
		t.Fatal("Adopt saved a ledger under a file")
	}
	after, _ := json.Marshal(b.r.ledger)
	if string(after) != string(before) {
		t.Errorf("a failed adoption changed the ledger in memory:\nbefore %s\nafter  %s", before, after)
	}
	b.r.ledger.path = path
	if err := b.r.Adopt("moved", arr, map[string]Marker{"moved.init": {Digest: "d"}}, []string{moved}, nil, nil); err != nil {
		t.Fatal(err)
	}
	if got := b.r.PathModule(moved); got != "moved" {
		t.Errorf("after a save that worked the ledger gives %s to %q", moved, got)
	}
}

// A move brings the files a module declares inside its data directories
// with the copy: adopted with them, the first apply on the new node takes
// them as the module's (one the manifest says differently is kept aside,
// then written), not "exists and the mesh did not write it", which made
// such a module one that never moved (a review found it).
func TestAdoptTakesTheFilesDeclaredInsideData(t *testing.T) {
	for _, adopt := range []bool{true, false} {
		dir := t.TempDir()
		src := strings.ReplaceAll(`module: app
resources:
  - directory: {{d}}/app
  - directory: {{d}}/app/data
    data: true
  - directory: {{d}}/app/data/conf
  - file: {{d}}/app/data/conf/app.ini
    content: "x = 1"
  - file: {{d}}/app/data/other.ini
    content: "y = 1"
`, "{{d}}", dir)
		data := filepath.Join(dir, "app", "data")
		os.MkdirAll(filepath.Join(data, "conf"), 0o755)
		os.WriteFile(filepath.Join(data, "conf", "app.ini"), []byte("x = 1"), 0o644)
		os.WriteFile(filepath.Join(data, "other.ini"), []byte("y = 0, edited where it ran"), 0o644)
		os.WriteFile(filepath.Join(data, "db"), []byte("the data"), 0o600)
		r, err := New(Config{Node: "ace", DNS: netip.MustParseAddr("169.254.53.53"), LedgerPath: filepath.Join(dir, "ledger.json")}, newFake())
		if err != nil {
			t.Fatal(err)
		}
		m, err := manifest.Parse("app.yaml", []byte(src))
		if err != nil {
			t.Fatal(err)
		}
		var within map[string]string
		if adopt {
			within = DeclaredInData(m, []string{data})
			if len(within) != 3 || within[filepath.Join(data, "conf")] != manifest.KindDirectory || within[filepath.Join(data, "other.ini")] != manifest.KindFile {
				t.Fatalf("declared inside the data directory: %v", within)
			}
		}
		// What the ledger has there already (the module ran here before,
		// and took over a file it left) is kept whole.
		taken := PathEntry{Kind: manifest.KindFile, Module: "app", Digest: "d1", Original: &Original{Kept: "kept/1", Digest: "d0"}}
		r.ledger.Paths[filepath.Join(data, "conf", "app.ini")] = taken
		if err := r.Adopt("app", Arrival{Move: 3, Until: time.Now().Add(time.Hour)}, nil, []string{data}, []string{filepath.Join(dir, "app")}, within); err != nil {
			t.Fatal(err)
		}
		if e := r.ledger.Paths[filepath.Join(data, "conf", "app.ini")]; e.Original == nil || e.Digest != "d1" {
			t.Fatalf("the entry there before the adoption: %+v", e)
		}
		delete(r.ledger.Paths, filepath.Join(data, "conf", "app.ini"))
		if adopt {
			r.ledger.Paths[filepath.Join(data, "conf", "app.ini")] = PathEntry{Kind: manifest.KindFile, Module: "app"}
		}
		in := state.Input{Domain: "internal", Nodes: []state.Node{{Name: "ace", Address: "10.0.0.1"}}, Assignments: []state.Assignment{{Node: "ace", Module: "app"}}}
		rep := r.Apply(context.Background(), 1, composeAce(t, &in, []string{src}))
		other, _ := os.ReadFile(filepath.Join(data, "other.ini"))
		if !adopt {
			if o := outcome(rep, "/app/data/conf/app.ini"); o.Outcome != state.Failed || !strings.Contains(o.Reason, "exists and the mesh did not write it") {
				t.Fatalf("without the adoption of the files inside: %+v (the case this mends)", o)
			}
			continue
		}
		for _, res := range rep.Resources {
			if res.Outcome == state.Failed {
				t.Errorf("%s: %s", res.Name, res.Reason)
			}
		}
		if string(other) != "y = 1" {
			t.Errorf("other.ini holds %q, want the manifest's", other)
		}
		if b, _ := os.ReadFile(filepath.Join(data, "db")); string(b) != "the data" {
			t.Errorf("the data: %q", b)
		}
		if o := outcome(rep, "/app/data/other.ini"); !strings.Contains(o.Reason, "kept") {
			t.Errorf("other.ini, edited where it ran, was written over without a copy: %+v", o)
		}
	}
}

// A credential's file that came with a move's copy, adopted, goes when the
// module does not start here (the move aborted): whatever it holds, as a
// secret's file does, not kept as an edited file would be.
func TestAdoptedCredentialGoesWithoutTheModule(t *testing.T) {
	dir := t.TempDir()
	data := filepath.Join(dir, "app", "data")
	os.MkdirAll(data, 0o755)
	cred := filepath.Join(data, "db.password")
	os.WriteFile(cred, []byte("consumer's credential"), 0o600)
	os.WriteFile(filepath.Join(data, "db"), []byte("the data"), 0o600)
	r, err := New(Config{Node: "ace", DNS: netip.MustParseAddr("169.254.53.53"), LedgerPath: filepath.Join(dir, "ledger.json")}, newFake())
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Adopt("app", Arrival{Move: 3, Until: time.Now().Add(time.Hour)}, nil, []string{data}, nil, map[string]string{cred: manifest.KindCredential}); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		r.Apply(context.Background(), 1, &state.Plan{Node: "ace"})
	}
	if _, err := os.Lstat(cred); !os.IsNotExist(err) {
		t.Fatalf("the credential's file stays without the module: %v", err)
	}
	if b, _ := os.ReadFile(filepath.Join(data, "db")); string(b) != "the data" {
		t.Fatalf("the data: %q", b)
	}
}
