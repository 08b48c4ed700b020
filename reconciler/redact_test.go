package reconciler

import (
	"fmt"
	"strings"
	"testing"
)

// Each module's values are taken out of its own texts only, the longest
// first; a value too short to look for, or of another module, stays.
func TestRedact(t *testing.T) {
	var s secretValues
	s.add("db", []byte("hunter2"))
	s.add("db", []byte("hunter2-extra"))
	s.add("db", []byte("on"))
	s.add("app", []byte("k3y!"))
	s.add("mail", []byte("smtp-pass\n")) // a file an editor saved
	for _, c := range []struct{ module, in, want string }{
		{"db", "pw=hunter2-extra, old=hunter2, on", "pw=[secret], old=[secret], on"},
		{"db", "k3y! is app's", "k3y! is app's"},
		{"app", "key k3y! and hunter2", "key [secret] and hunter2"},
		{"mail", "hunter2", "hunter2"},
		{"mail", "auth failed: smtp-pass (read with $(< file))", "auth failed: [secret] (read with $(< file))"},
		{"mail", "raw smtp-pass\n", "raw [secret]"},
		{"db", "", ""},
	} {
		if got := s.redact(c.module, c.in); got != c.want {
			t.Errorf("redact(%s, %q) = %q, want %q", c.module, c.in, got, c.want)
		}
	}
	for i := range maxRedactedPerModule + 5 {
		s.add("many", []byte{'v', 'a', 'l', byte('0' + i%10), byte('a' + i/10)})
	}
	if n := len(s.of["many"]); n != maxRedactedPerModule {
		t.Errorf("%d values kept for one module, want at most %d", n, maxRedactedPerModule)
	}
}

// A provider given more credentials than were once remembered (65 of its
// consumers', at every apply) still has each taken out of its texts.
func TestRedactEveryValueGivenAtEachApply(t *testing.T) {
	var s secretValues
	for range 2 { // two applies
		for i := range 1100 {
			s.add("postgres", []byte(fmt.Sprintf("cred-of-consumer-%04d", i)))
		}
		for i := range 1100 {
			s.add("postgres", []byte(fmt.Sprintf("cred-of-consumer-%04d", i%1000)))
		}
	}
	for _, i := range []int{0, 64, 999} {
		v := fmt.Sprintf("cred-of-consumer-%04d", i)
		if got := s.redact("postgres", "STATEMENT: ALTER ROLE c PASSWORD '"+v+"'"); strings.Contains(got, v) {
			t.Errorf("%s is in the text: %q", v, got)
		}
	}
	if n := len(s.of["postgres"]); n != maxRedactedPerModule {
		t.Errorf("%d values kept, want %d", n, maxRedactedPerModule)
	}
}
