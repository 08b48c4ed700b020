package state

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"mesh/state/manifest"
)

// The rule on host names checked about a module add's hosts only
// (hostClashesAmong, moduleHostsBefore) against the whole check, on fleets
// drawn from the input: few names, so that hosts clash often, through
// explicit hosts, names under domains, two ports of one module and the
// mesh's own domain.
var (
	ruleLabels  = []string{"a", "b", "a.b", "git"}
	ruleDomains = []string{"x.org", "y.org", "b.x.org", "internal"}
	ruleHosts   = []string{"a.x.org", "b.x.org", "a.b.x.org", "git.y.org", "c.org", "a.internal", "x.org", "a.b.y.org"}
)

// ruleManifest is module name with up to three routes drawn from next
// (three ports: a host three routes of one module claim names the first).
func ruleManifest(name string, next func() byte) *manifest.Manifest {
	m := &manifest.Manifest{Module: name}
	for range next() % 4 {
		r := manifest.Route{Name: ruleLabels[next()%4], Port: 80 + int(next()%3)}
		for _, h := range ruleHosts {
			if next()%4 == 0 {
				r.Hosts = append(r.Hosts, h)
			}
		}
		m.Routes = append(m.Routes, r)
	}
	return m
}

// ruleInput is a fleet of three nodes and up to five modules drawn from
// next, its assignments in any order.
func ruleInput(next func() byte) Input {
	in := Input{Domain: "internal", Modules: map[string]*manifest.Manifest{}}
	for i := range 3 {
		n := Node{Name: fmt.Sprintf("n%d", i)}
		for _, d := range ruleDomains[:3] {
			if next()%2 == 0 {
				n.PublicDomains = append(n.PublicDomains, d)
			}
		}
		in.Nodes = append(in.Nodes, n)
	}
	for i := range 5 {
		if next()%4 != 0 {
			name := fmt.Sprintf("m%d", i)
			in.Modules[name] = ruleManifest(name, next)
		}
	}
	for range next() % 8 {
		in.Assignments = append(in.Assignments, Assignment{Node: fmt.Sprintf("n%d", next()%3), Module: fmt.Sprintf("m%d", next()%6)})
	}
	slices.SortFunc(in.Assignments, func(x, y Assignment) int { return strings.Compare(x.Node+" "+x.Module, y.Node+" "+y.Module) })
	in.Assignments = slices.Compact(in.Assignments)
	if next()%2 == 0 { // the order the whole check does not assume
		rand.New(rand.NewPCG(uint64(next()), 1)).Shuffle(len(in.Assignments), func(i, j int) {
			in.Assignments[i], in.Assignments[j] = in.Assignments[j], in.Assignments[i]
		})
	}
	return in
}

// clashHost is the host a sentence of hostClashes is about.
func clashHost(c string) string {
	rest, _ := strings.CutPrefix(c, "host ")
	h, _, _ := strings.Cut(rest, " ")
	return h
}

func FuzzHostClashesAmong(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte("\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a\x0b\x0c\x0d\x0e\x0f\x10\x11\x12\x13\x14\x15"))
	f.Add([]byte("aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"))
	f.Add([]byte("\x00\x00\x00\x00\x00\x00\x00\x02\x00\x01\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\x01\x00\x00\x07\x00\x00\x01\x00\x01\x01"))
	f.Fuzz(func(t *testing.T, data []byte) {
		k := 0
		next := func() byte {
			if k >= len(data) {
				return 0
			}
			k++
			return data[k-1]
		}
		in := ruleInput(next)
		if next()%2 == 0 { // found through the catalogue's index, or by a walk
			in.hostIndex = depsOf(in.Modules)
		}
		// The assignments' order is not the rule's, whatever the input
		// says of it (the proposer's check appends a command's to a sorted
		// input).
		in.assignedByNode = next()%2 == 0
		sorted := in
		sorted.Assignments = slices.Clone(in.Assignments)
		slices.SortFunc(sorted.Assignments, func(x, y Assignment) int { return strings.Compare(x.Node+" "+x.Module, y.Node+" "+y.Module) })
		whole := hostClashes(in)
		if want := hostClashes(sorted); !slices.Equal(whole, want) {
			t.Fatalf("the assignments in another order give %q, sorted %q", whole, want)
		}
		// About any hosts: the whole check's sentences about them.
		var candidates []string
		candidates = append(candidates, ruleHosts...)
		for _, l := range ruleLabels {
			for _, d := range ruleDomains {
				candidates = append(candidates, l+"."+d)
			}
		}
		only := map[string]bool{}
		for _, h := range candidates {
			if next()%3 == 0 {
				only[h] = true
			}
		}
		var want []string
		for _, c := range whole {
			if only[clashHost(c)] {
				want = append(want, c)
			}
		}
		if got := hostClashesAmong(in, only); !slices.Equal(got, want) {
			t.Fatalf("about %v: %q, the whole check's %q (of %q)", slices.Sorted(maps.Keys(only)), got, want, whole)
		}
		// A module add of some modules, new or changed: the rule about
		// their hosts before and after refuses it as the whole rule does.
		after := in
		after.Modules = maps.Clone(in.Modules)
		hosts := map[string]bool{}
		for i := range 6 {
			if next()%3 != 0 {
				continue
			}
			name := fmt.Sprintf("m%d", i)
			m := ruleManifest(name, next)
			hostsClaimed(in, hosts, in.Modules[name], m)
			after.Modules[name] = m
			if after.hostIndex != nil { // edited as catalogueSet edits it
				if after.hostIndex == in.hostIndex {
					after.hostIndex = in.hostIndex.clone()
				}
				after.hostIndex.remove(name, in.Modules[name])
				after.hostIndex.add(name, m)
			}
		}
		if after.hostIndex != nil && !sameDeps(after.hostIndex, depsOf(after.Modules)) {
			t.Fatalf("the index edited by the module add is not the catalogue's after it")
		}
		wholeErr := newClash(whole, hostClashes(after))
		amongErr := newClash(hostClashesAmong(in, hosts), hostClashesAmong(after, hosts))
		if fmt.Sprint(wholeErr) != fmt.Sprint(amongErr) {
			t.Fatalf("the module add is refused for %v about its hosts %v, for %v by the whole rule", amongErr, slices.Sorted(maps.Keys(hosts)), wholeErr)
		}
		// A batch assign: the same about the names it adds.
		assigned := in
		var batch []Assignment
		for range next() % 4 {
			a := Assignment{Node: fmt.Sprintf("n%d", next()%3), Module: fmt.Sprintf("m%d", next()%5)}
			if !slices.Contains(in.Assignments, a) && !slices.Contains(batch, a) {
				batch = append(batch, a)
			}
		}
		assigned.Assignments = append(slices.Clone(in.Assignments), batch...)
		hosts = map[string]bool{}
		hostsAssigned(in, hosts, batch)
		wholeErr = newClash(whole, hostClashes(assigned))
		amongErr = newClash(hostClashesAmong(in, hosts), hostClashesAmong(assigned, hosts))
		if fmt.Sprint(wholeErr) != fmt.Sprint(amongErr) {
			t.Fatalf("the assign of %v is refused for %v about its hosts %v, for %v by the whole rule", batch, amongErr, slices.Sorted(maps.Keys(hosts)), wholeErr)
		}
	})
}

// clone is a copy of d that edits do not reach (remove and add copy a
// list they edit).
func (d *catDeps) clone() *catDeps {
	return &catDeps{consumers: maps.Clone(d.consumers), credentials: maps.Clone(d.credentials), hosted: maps.Clone(d.hosted), routed: maps.Clone(d.routed)}
}
