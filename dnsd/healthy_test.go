package dnsd

import (
	"fmt"
	"net/netip"
	"testing"
)

func TestAnswerLeavesOutWhatIsDownButNeverAnswersNothing(t *testing.T) {
	a, b, c := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("10.0.0.3")
	for _, tc := range []struct {
		name string
		in   []Instance
		want string
	}{
		{"all healthy", []Instance{{a, true}, {b, true}}, "[10.0.0.1 10.0.0.2]"},
		{"one unhealthy or unreachable", []Instance{{a, true}, {b, false}, {c, true}}, "[10.0.0.1 10.0.0.3]"},
		{"only one up", []Instance{{a, false}, {b, false}, {c, true}}, "[10.0.0.3]"},
		{"none up: all of them", []Instance{{a, false}, {b, false}}, "[10.0.0.1 10.0.0.2]"},
		{"a single instance that is down still answers", []Instance{{a, false}}, "[10.0.0.1]"},
		{"no instance", nil, "[]"},
	} {
		if got := fmt.Sprint(Answer(tc.in)); got != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, got, tc.want)
		}
	}
}
