package cluster

import (
	"errors"
	"testing"
)

// A peer's "not the leader any more" means the write was never applied, so it
// is sent again; other failures after the request left are not retried.
func TestNotLeaderIsRetriedOthersAreNot(t *testing.T) {
	for _, tc := range []struct {
		kind, msg string
		retry     bool
	}{
		{"not-leader", notLeaderMsg, true},
		{"no-leader", notLeaderMsg, true}, // an older peer
		{"no-leader", "no leader is known", false},
		{"", "commit assign: leadership lost while committing log", false},
	} {
		err := errOfKind(tc.kind, tc.msg)
		if got := errors.Is(err, errNotApplied); got != tc.retry {
			t.Errorf("%s %q: retry %v, want %v", tc.kind, tc.msg, got, tc.retry)
		}
	}
}
