package reconciler

import (
	"encoding/json"
	"path/filepath"
	"testing"
	"time"
)

// A move's receiver refuses a data directory that holds another module's
// path: swapping the copy in sets the directory aside, and that path with
// it (a review found a move of a module declaring /srv/shared would have
// taken the data of the modules under it).
func TestOthersUnder(t *testing.T) {
	b := newSecretBed(t)
	b.set("smtp", "v")
	b.set("api", "k")
	if rep := b.apply(); rep.Error != "" {
		t.Fatal(rep.Error)
	}
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
	b := newSecretBed(t)
	b.set("smtp", "v")
	b.set("api", "k")
	if rep := b.apply(); rep.Error != "" {
		t.Fatal(rep.Error)
	}
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
		[]string{moved, mail}, []string{filepath.Join(b.dir, "srv")})
	if err == nil {
		t.Fatal("Adopt saved a ledger under a file")
	}
	after, _ := json.Marshal(b.r.ledger)
	if string(after) != string(before) {
		t.Errorf("a failed adoption changed the ledger in memory:\nbefore %s\nafter  %s", before, after)
	}
	b.r.ledger.path = path
	if err := b.r.Adopt("moved", arr, map[string]Marker{"moved.init": {Digest: "d"}}, []string{moved}, nil); err != nil {
		t.Fatal(err)
	}
	if got := b.r.PathModule(moved); got != "moved" {
		t.Errorf("after a save that worked the ledger gives %s to %q", moved, got)
	}
}
