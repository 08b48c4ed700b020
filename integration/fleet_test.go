package integration

import (
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// answerAddrs is every address a resolver answers name with, sorted; ok is
// false when it gave no answer.
func answerAddrs(co *dns.Conn, name string) (addrs []string, ok bool) {
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), dns.TypeA)
	co.SetDeadline(time.Now().Add(time.Second))
	if err := co.WriteMsg(m); err != nil {
		return nil, false
	}
	r, err := co.ReadMsg()
	if err != nil || r.Rcode != dns.RcodeSuccess || len(r.Answer) == 0 {
		return nil, false
	}
	for _, rr := range r.Answer {
		if a, ok := rr.(*dns.A); ok {
			addrs = append(addrs, a.A.String())
		}
	}
	slices.Sort(addrs)
	return addrs, true
}

// A fleet past the size at which liveness's round grows (22 agents, in
// CI; the bench runs 50): every resolver answers an assign; a module on two
// nodes, one of which is killed with -9, is answered by every other resolver
// with the live one alone, within three rounds and a margin, and status
// reads the dead node unreachable and every other reachable; then a kill -9
// of the leader, after which a write through another voter is accepted and
// answered by every resolver still up.
func TestFleetBed(t *testing.T) {
	const count = 22
	f := newFleet(t, count)
	n1 := f.n[1]
	var files []string
	for _, name := range []string{"fq0", "fq1", "fq2"} {
		files = append(files, n1.manifest(name, "module: {{name}}\n", map[string]string{"name": name}))
	}
	n1.mesh(append([]string{"module", "add"}, files...)...)
	leader := f.client(1)
	if err := f.assign(leader, 5, "fq0"); err != nil {
		t.Fatal(err)
	}
	f.allAnswered(t, "fq0.internal", f.addr(5), time.Now(), 60*time.Second, nil)

	// fq1 on n21 and n22; every resolver answers both, then n22 dies.
	for _, target := range []int{21, 22} {
		if err := f.assign(leader, target, "fq1"); err != nil {
			t.Fatal(err)
		}
	}
	both := []string{f.addr(21), f.addr(22)}
	slices.Sort(both)
	answers := func(want []string, skip map[int]bool) (bool, string) {
		for i, co := range f.conns {
			if skip[i+1] {
				continue
			}
			got, _ := answerAddrs(co, "fq1.internal")
			if !slices.Equal(got, want) {
				return false, fmt.Sprintf("n%d answers fq1 with %v, want %v", i+1, got, want)
			}
		}
		return true, ""
	}
	eventually(t, 60*time.Second, "every resolver answers fq1 with n21 and n22", func() (bool, string) { return answers(both, nil) })
	dead := f.n[count]
	killed := f.kill(count)
	// Three rounds of 2.1 s at 22 nodes, a round for the feed to notice,
	// and the contention of 22 agents on this machine's two cores.
	eventually(t, 30*time.Second, "every other resolver answers fq1 with n21 alone", func() (bool, string) {
		return answers([]string{f.addr(21)}, map[int]bool{count: true})
	})
	t.Logf("the resolvers dropped the killed node's instance after %s", time.Since(killed).Round(100*time.Millisecond))
	// Its last hello answered was at most a round before the kill, so it
	// reads unreachable no sooner than two rounds after it (4.2 s).
	if d := time.Since(killed); d < 3*time.Second {
		t.Fatalf("the killed node dropped out after %s, before liveness could tell: the resolvers do not wait for liveness", d)
	}
	var st struct {
		Nodes []struct {
			Name      string
			Reachable bool
		}
	}
	if err := json.Unmarshal([]byte(f.n[3].mesh("status", "--json")), &st); err != nil {
		t.Fatal(err)
	}
	if len(st.Nodes) != count {
		t.Fatalf("status lists %d nodes, want %d", len(st.Nodes), count)
	}
	for _, nd := range st.Nodes {
		if nd.Reachable != (nd.Name != dead.name) {
			t.Fatalf("status from n3: %s reachable=%v", nd.Name, nd.Reachable)
		}
	}

	// The leader dies; a write through n2 lands and every resolver still
	// up answers it.
	killed = f.kill(1)
	d := f.assignOnceAccepted(t, f.client(2), 3, "fq2", killed)
	t.Logf("a write was accepted %s after the leader's kill", d.Round(time.Millisecond))
	f.allAnswered(t, "fq2.internal", f.addr(3), killed, 60*time.Second, map[int]bool{1: true, count: true})
}
