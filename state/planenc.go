package state

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"maps"

	"mesh/state/manifest"
)

// A plan's JSON, written from the encodings of its resources (issue
// "scale", item 1). A node's plan is one JSON document whose digest names
// it, and encoding it whole was most of an assign's cost once only the
// nodes a command changes are composed: 3.4 ms for a node of 100 modules,
// ten times that of a node of 10. Most of a recomposed node's resources
// are what they were, so the FSM keeps each node's last encoded resources,
// and a resource equal to one kept (sameResource) is copied, not encoded.
// The bytes are encoding/json's, so the digest is the one Plan.Digest
// gives: with checkComposition on, every incremental command is compared
// with a full composition, whose digests are Plan.Digest's.

// keptResource is one resource's JSON in a plan and what it was encoded
// from: the fields of Resource its declaration does not give (Decl and
// Typed are named by src). It holds no copy of the declaration: a
// Resource is 1.2 kB, and a node of 100 modules keeps 600 of them.
type keptResource struct {
	module, kind, name, content, digest, provider string
	pull, restart                                 uint64
	credential                                    *Pair
	secrets                                       map[string]string
	src                                           *manifest.Resource
	enc                                           []byte
}

// keepResource is what planBody keeps of r, with its JSON enc.
func keepResource(r *Resource, enc []byte) keptResource {
	return keptResource{module: r.Module, kind: r.Kind, name: r.Name, content: r.Content, digest: r.Digest, provider: r.Provider,
		pull: r.Pull, restart: r.Restart, credential: r.Credential, secrets: r.Secrets, src: r.src, enc: enc}
}

// same says r encodes to the JSON k was kept with. Decl and Typed are
// copied from the manifest's resource src names, and a parsed manifest is
// never changed, so the same src (never nil) gives the same both; every
// other field is compared. TestSameResourceComparesEveryField fails when a
// field is added to Resource and not here.
func (k *keptResource) same(r *Resource) bool {
	return k.src != nil && k.src == r.src &&
		k.module == r.Module && k.kind == r.Kind && k.name == r.Name &&
		k.content == r.Content && k.digest == r.Digest && k.provider == r.Provider &&
		k.pull == r.Pull && k.restart == r.Restart &&
		(k.credential == nil) == (r.Credential == nil) && (k.credential == nil || *k.credential == *r.Credential) &&
		maps.Equal(k.secrets, r.Secrets)
}

// sameResource says a and b encode to the same JSON, as planBody decides
// it: b is the same as what it keeps of a.
func sameResource(a, b *Resource) bool {
	k := keepResource(a, nil)
	return k.same(b)
}

// planBody is p's JSON and its digest, as json.Marshal and Plan.Digest
// give them, reusing the encodings of the resources p shares with node's
// last plan encoded here. It keeps p's for the next; the caller holds
// applyMu. Keeping is no promise that p is stored: an encoding is a
// function of what it was encoded from, whatever the command's outcome.
func (s *Store) planBody(p *Plan) (body []byte, digest string) {
	shell := *p
	shell.Resources = []Resource{}
	head, err := json.Marshal(&shell)
	if err != nil {
		panic(err) // a Plan always encodes
	}
	node, _ := json.Marshal(p.Node)
	prefix := append(append([]byte(`{"node":`), node...), `,"resources":[`...)
	if !bytes.HasPrefix(head, prefix) || len(head) <= len(prefix) || head[len(prefix)] != ']' {
		// Not the shape this splices into: encode it whole.
		body, err = json.Marshal(p)
		if err != nil {
			panic(err)
		}
		return body, digestOf(body)
	}
	if s.encoded == nil {
		s.encoded = map[string]map[*manifest.Resource]*keptResource{}
	}
	before := s.encoded[p.Node]
	// Each resource's JSON first, kept or encoded, so that the body is
	// made once at its size (grown as it was written, it was copied twice
	// for an assign's new resources).
	encs := make([][]byte, len(p.Resources))
	size := len(head) + len(p.Resources)
	for i := range p.Resources {
		r := &p.Resources[i]
		if k, ok := before[r.src]; ok && k.same(r) {
			encs[i] = k.enc
		} else if encs[i], err = json.Marshal(r); err != nil {
			panic(err)
		}
		size += len(encs[i])
	}
	body = make([]byte, 0, size)
	body = append(body, prefix...)
	type span struct{ start, end int }
	spans := make([]span, len(p.Resources))
	for i, enc := range encs {
		if i > 0 {
			body = append(body, ',')
		}
		start := len(body)
		body = append(body, enc...)
		spans[i] = span{start, len(body)}
	}
	body = append(body, head[len(prefix):]...)
	// The kept encodings are slices of this body, which holds their only
	// copy: the body before is let go. What is kept of the resources is
	// one array (a map's value over 128 bytes is allocated apart, one
	// allocation per resource).
	after := make(map[*manifest.Resource]*keptResource, len(p.Resources))
	kept := make([]keptResource, len(p.Resources))
	for i := range p.Resources {
		r := &p.Resources[i]
		if r.src == nil {
			continue
		}
		kept[i] = keepResource(r, body[spans[i].start:spans[i].end:spans[i].end])
		after[r.src] = &kept[i]
	}
	s.encoded[p.Node] = after
	return body, digestOf(body)
}

func digestOf(b []byte) string {
	d := sha256.Sum256(b)
	return hex.EncodeToString(d[:])
}

// forgetEncoded drops the kept encodings of the nodes not in nodes.
func (s *Store) forgetEncoded(nodes []Node) {
	keep := map[string]bool{}
	for _, n := range nodes {
		keep[n.Name] = true
	}
	for n := range s.encoded {
		if !keep[n] {
			delete(s.encoded, n)
		}
	}
}
