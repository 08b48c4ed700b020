package reconciler

import (
	"path/filepath"
	"testing"
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
