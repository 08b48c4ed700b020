package state

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
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
	gen                                           uint64 // keptPlan.gen
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

// planText is a plan's JSON in pieces, never joined in the FSM: a node's
// plan of 100 modules is 140 kB, and an assign that joined it into one
// body to hash it and deflate it (and kept its resources' encodings as
// slices of it, in a new array and map) allocated 0.35 MB, a quarter of
// all it allocated; the collections that garbage brings slow the applies
// they overlap two to four times (the slowest applies were those). whole
// is set when the plan was encoded whole; else the text is head, the
// encodings separated by commas, and tail.
type planText struct {
	whole, head, tail []byte
	encs              [][]byte
	size              int
}

// writeTo writes the text to w, which does not fail (a hash, a deflater
// into a buffer).
func (t *planText) writeTo(w io.Writer) {
	if t.whole != nil {
		w.Write(t.whole)
		return
	}
	w.Write(t.head)
	for i, enc := range t.encs {
		if i > 0 {
			w.Write(comma)
		}
		w.Write(enc)
	}
	w.Write(t.tail)
}

var comma = []byte{','}

// bytes is the text joined (tests).
func (t *planText) bytes() []byte {
	var b bytes.Buffer
	t.writeTo(&b)
	return b.Bytes()
}

// digest is Plan.Digest's digest of the text.
func (t *planText) digest() string {
	h := sha256.New()
	t.writeTo(h)
	return hex.EncodeToString(h.Sum(nil))
}

// pack is packPlan of the text.
func (t *planText) pack() []byte {
	return packWith(t.writeTo, t.size)
}

// planBody is p's JSON and its digest, as json.Marshal and Plan.Digest
// give them, reusing the encodings of the resources p shares with node's
// last plan encoded here. It keeps p's for the next, editing what it kept
// in place: a resource's encoding is its own allocation, kept until the
// resource changes or leaves the plan. The caller holds applyMu. Keeping
// is no promise that p is stored: an encoding is a function of what it
// was encoded from, whatever the command's outcome.
func (s *Store) planBody(p *Plan) (text *planText, digest string) {
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
		body, err := json.Marshal(p)
		if err != nil {
			panic(err)
		}
		text = &planText{whole: body, size: len(body)}
		return text, text.digest()
	}
	if s.encoded == nil {
		s.encoded = map[string]*keptPlan{}
	}
	kept := s.encoded[p.Node]
	if kept == nil {
		kept = &keptPlan{of: make(map[*manifest.Resource]*keptResource, len(p.Resources))}
		s.encoded[p.Node] = kept
	}
	kept.gen++
	text = &planText{head: prefix, tail: head[len(prefix):], encs: make([][]byte, len(p.Resources)), size: len(head) + max(len(p.Resources)-1, 0)}
	for i := range p.Resources {
		r := &p.Resources[i]
		k := kept.of[r.src]
		if k != nil && k.same(r) {
			text.encs[i] = k.enc
			text.size += len(k.enc)
			k.gen = kept.gen
			continue
		}
		if text.encs[i], err = json.Marshal(r); err != nil {
			panic(err)
		}
		text.size += len(text.encs[i])
		if r.src == nil {
			continue
		}
		if k == nil {
			k = new(keptResource)
			kept.of[r.src] = k
		}
		*k = keepResource(r, text.encs[i])
		k.gen = kept.gen
	}
	for src, k := range kept.of {
		if k.gen != kept.gen {
			delete(kept.of, src)
		}
	}
	return text, text.digest()
}

// keptPlan is what planBody keeps of a node's last plan: its resources by
// their declaration, each marked with the gen of the last plan it was in.
type keptPlan struct {
	of  map[*manifest.Resource]*keptResource
	gen uint64
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
