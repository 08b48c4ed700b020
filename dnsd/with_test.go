package dnsd

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"

	"github.com/miekg/dns"
)

// With answers what NewIndex of the changed names answers, and leaves the
// index it was made from answering what it did.
func TestIndexWith(t *testing.T) {
	rnd := rand.New(rand.NewPCG(5, 6))
	addr := func() netip.Addr { return netip.AddrFrom4([4]byte{10, 0, byte(rnd.IntN(3)), byte(1 + rnd.IntN(5))}) }
	names := map[string][]netip.Addr{}
	for i := range 500 {
		names[fmt.Sprintf("m%d.internal", i)] = []netip.Addr{addr()}
	}
	ix := NewIndex("internal", names, 1)
	for round := range 200 {
		before := NewIndex("internal", names, 1)
		changes := map[string][]netip.Addr{}
		for range 1 + rnd.IntN(5) {
			n := fmt.Sprintf("m%d.internal", rnd.IntN(600)) // some new, some gone
			switch rnd.IntN(3) {
			case 0:
				changes[n] = nil
			case 1:
				changes[n] = []netip.Addr{addr()}
			default:
				changes[n] = []netip.Addr{addr(), addr()}
			}
		}
		next := ix.With(changes, uint32(round+2))
		if !ix.Equal(before) {
			t.Fatalf("round %d: With changed the index it was made from", round)
		}
		for n, a := range changes {
			if len(a) == 0 {
				delete(names, n)
			} else {
				names[n] = a
			}
		}
		if want := NewIndex("internal", names, 1); !next.Equal(want) {
			t.Fatalf("round %d: With(%v) answers other names than NewIndex", round, changes)
		}
		r := next.Lookup(dns.Question{Name: "m1.internal.", Qtype: dns.TypeA, Qclass: dns.ClassINET}, 5)
		if want := len(names["m1.internal"]); len(r.Answer) != want {
			t.Fatalf("round %d: m1 answers %d addresses, want %d", round, len(r.Answer), want)
		}
		ix = next
	}
}
