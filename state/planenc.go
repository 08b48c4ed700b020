package state

import (
	"bytes"
	"crypto/sha256"
	"encoding"
	"encoding/hex"
	"encoding/json"
	"hash/fnv"
	"io"
	"maps"
	"sync"

	"github.com/klauspost/compress/flate"

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
	src, via                                      *manifest.Resource
	enc                                           []byte
	gen                                           uint64 // keptPlan.gen
	// at is its place in the node's last plan (keptPlan.order).
	at int
}

// keepResource is what planBody keeps of r, with its JSON enc.
func keepResource(r *Resource, enc []byte) keptResource {
	return keptResource{module: r.Module, kind: r.Kind, name: r.Name, content: r.Content, digest: r.Digest, provider: r.Provider,
		pull: r.Pull, restart: r.Restart, credential: r.Credential, secrets: r.Secrets, src: r.src, via: r.via, enc: enc}
}

// same says r encodes to the JSON k was kept with. Decl and Typed are
// copied from the manifest's resource src names, and a parsed manifest is
// never changed, so the same src (never nil) gives the same both; a
// delivered credential's are made from its directory's declaration via
// alone; every other field is compared. TestSameResourceComparesEveryField fails when a
// field is added to Resource and not here.
func (k *keptResource) same(r *Resource) bool {
	return (k.src != nil && k.src == r.src || k.src == nil && r.src == nil && k.via != nil && k.via == r.via) &&
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
// is set when the plan was encoded whole; else the text is its chunks'
// texts one after the other.
type planText struct {
	whole  []byte
	chunks []*planChunk
	size   int
	digest string
	// hashedFrom is the first chunk hash wrote (tests).
	hashedFrom int
}

// A plan's text is cut into chunks (issue "scale", item 1): a chunk ends
// with a module whose name's FNV-1a hash is a multiple of chunkEvery (a
// run of about chunkEvery modules), and the head and the tail (routes,
// publish address, purges) are chunks of their own. The cuts depend on
// the modules' names alone, so an assign changes the chunk its module
// falls in and no other. Each chunk is deflated on its own, sync-flushed
// (byte-aligned, not final), with the last chunkDict bytes of the chunk
// before as its dictionary: the chunks' streams put one after the other,
// and an empty final block, are one DEFLATE stream whose back-references
// reach only into the text before them, which any inflater reads. A
// chunk's stream is a function of its text and of the text before it,
// so a chunk the same as in the node's last plan, after the same chunk,
// is not deflated again; and the sha256 state after each chunk is kept,
// so a plan the same as the last one up to a chunk is hashed from there.
// The stored bytes are a function of the plan's text alone, whatever was
// kept (TestPackedPlanIsItsTextAlone).
const (
	chunkEvery = 8
	chunkDict  = 4 << 10
)

// planChunk is one chunk of a plan's text: lead (the plan's head in the
// first chunk, its tail in the last), then its resources' encodings, each
// after a comma but the first chunk's first.
type planChunk struct {
	key   string // the module of its first resource; tailKey for the tail
	first bool
	lead  []byte
	encs  [][]byte
	size  int
	// after is the sha256 state after this chunk, packed its stream (nil
	// until pack deflates it, or taken from the last plan's same chunk).
	after, packed []byte
}

// tailKey keys the tail chunk: no module is named with a NUL.
const tailKey = "\x00tail"

func (c *planChunk) writeTo(w io.Writer) {
	w.Write(c.lead)
	for i, enc := range c.encs {
		if i > 0 || !c.first {
			w.Write(comma)
		}
		w.Write(enc)
	}
}

// same says c's text is d's.
func (c *planChunk) same(d *planChunk) bool {
	if c.key != d.key || c.first != d.first || len(c.encs) != len(d.encs) || !bytes.Equal(c.lead, d.lead) {
		return false
	}
	for i := range c.encs {
		if !sameBytes(c.encs[i], d.encs[i]) {
			return false
		}
	}
	return true
}

// sameBytes is bytes.Equal, without reading the bytes of one slice
// twice: most encodings a chunk is compared with are the same kept
// encoding (a node's plan of 100 modules is 140 kB, which the compare
// read from memory at every command).
func sameBytes(a, b []byte) bool {
	if len(a) != len(b) {
		return false
	}
	return len(a) == 0 || &a[0] == &b[0] || bytes.Equal(a, b)
}

// cutAfter says a chunk ends with module mod.
func cutAfter(mod string) bool {
	h := fnv.New32a()
	io.WriteString(h, mod)
	return h.Sum32()%chunkEvery == 0
}

// writeTo writes the text to w, which does not fail (a hash, a deflater
// into a buffer).
func (t *planText) writeTo(w io.Writer) {
	if t.whole != nil {
		w.Write(t.whole)
		return
	}
	for _, c := range t.chunks {
		c.writeTo(w)
	}
}

var comma = []byte{','}

// bytes is the text joined (tests).
func (t *planText) bytes() []byte {
	var b bytes.Buffer
	t.writeTo(&b)
	return b.Bytes()
}

// hash sets t.digest, Plan.Digest's digest of the text, hashing the
// chunks from the first of them not in prefix (the states after the
// chunks the text begins with, as the last plan did).
func (t *planText) hash(prefix [][]byte) {
	h := sha256.New()
	if t.whole != nil {
		h.Write(t.whole)
		t.digest = hex.EncodeToString(h.Sum(nil))
		return
	}
	from := 0
	if len(prefix) > 0 {
		if err := h.(encoding.BinaryUnmarshaler).UnmarshalBinary(prefix[len(prefix)-1]); err == nil {
			from = len(prefix)
			for i := range from {
				t.chunks[i].after = prefix[i]
			}
		} else {
			h.Reset()
		}
	}
	t.hashedFrom = from
	for _, c := range t.chunks[from:] {
		c.writeTo(h)
		c.after, _ = h.(encoding.BinaryMarshaler).MarshalBinary()
	}
	t.digest = hex.EncodeToString(h.Sum(nil))
}

// chunkWriters deflate chunks, always reset with their dictionary (a
// writer of planWriters is reset without one).
var chunkWriters = sync.Pool{New: func() any {
	w, _ := flate.NewWriter(nil, flate.BestSpeed)
	return w
}}

// finalBlock is an empty final block of fixed codes: the end of a stream
// of sync-flushed chunks.
var finalBlock = []byte{0x03, 0x00}

// pack is how state.db keeps the text: packPlan's format, deflating the
// chunks no kept stream was taken for.
func (t *planText) pack() []byte {
	if t.whole != nil {
		return packPlan(t.whole)
	}
	var dict bytes.Buffer
	size := 1 + len(finalBlock)
	for i, c := range t.chunks {
		if c.packed == nil {
			var b bytes.Buffer
			b.Grow(c.size/8 + 64)
			dict.Reset()
			if i > 0 {
				t.chunks[i-1].writeTo(&dict)
			}
			d := dict.Bytes()
			d = d[max(0, len(d)-chunkDict):]
			w := chunkWriters.Get().(*flate.Writer)
			w.ResetDict(&b, d)
			c.writeTo(w)
			w.Flush()
			w.ResetDict(nil, nil) // keeps no dictionary of ours
			chunkWriters.Put(w)
			c.packed = b.Bytes()
		}
		size += len(c.packed)
	}
	out := make([]byte, 0, size)
	out = append(out, packedPlan)
	for _, c := range t.chunks {
		out = append(out, c.packed...)
	}
	return append(out, finalBlock...)
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
	shell.Resources, shell.Routes = []Resource{}, nil // spliced in below
	head, err := json.Marshal(&shell)
	if err != nil {
		panic(err) // a Plan always encodes
	}
	node, _ := json.Marshal(p.Node)
	prefix := append(append([]byte(`{"node":`), node...), `,"resources":[`...)
	if !bytes.HasPrefix(head, prefix) || len(head) <= len(prefix) || head[len(prefix)] != ']' {
		// Not the shape this splices into: encode it whole.
		whole := *p
		whole.Resources = make([]Resource, len(p.Resources))
		for i := range p.Resources {
			whole.Resources[i] = *p.Resources[i].withDecl()
		}
		body, err := json.Marshal(&whole)
		if err != nil {
			panic(err)
		}
		text = &planText{whole: body, size: len(body)}
		text.hash(nil)
		return text, text.digest
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
	tail := head[len(prefix):]
	if len(p.Routes) > 0 {
		tail = kept.routesTail(p.Routes, tail)
	}
	encs := make([][]byte, len(p.Resources))
	size := len(head) + max(len(p.Resources)-1, 0)
	last, order := kept.order, make([]*keptResource, len(p.Resources))
	next := 0 // where in last the resource after the one found is
	for i := range p.Resources {
		r := &p.Resources[i]
		var k *keptResource
		switch {
		case r.src != nil:
			if next < len(last) && last[next] != nil && last[next].src == r.src {
				k = last[next]
			} else {
				k = kept.of[r.src]
			}
			if k != nil {
				next = k.at + 1
				order[i] = k
			}
		case r.via != nil:
			k = kept.delivered[deliveredKey{r.via, r.Name}]
		}
		if k != nil && k.same(r) {
			encs[i] = k.enc
			size += len(k.enc)
			k.gen = kept.gen
			continue
		}
		if encs[i], err = json.Marshal(r.withDecl()); err != nil {
			panic(err)
		}
		size += len(encs[i])
		if r.src == nil && r.via == nil {
			continue
		}
		if k == nil {
			k = new(keptResource)
			if r.src != nil {
				kept.of[r.src] = k
				order[i] = k
			} else {
				if kept.delivered == nil {
					kept.delivered = map[deliveredKey]*keptResource{}
				}
				kept.delivered[deliveredKey{r.via, r.Name}] = k
			}
		}
		*k = keepResource(r, encs[i])
		k.gen = kept.gen
	}
	// What the last plan had and this one has not (of holds the last
	// plan's resources, no more).
	for _, k := range last {
		if k != nil && k.gen != kept.gen {
			delete(kept.of, k.src)
		}
	}
	for i, k := range order {
		if k != nil {
			k.at = i
		}
	}
	kept.order = order
	for dk, k := range kept.delivered {
		if k.gen != kept.gen {
			delete(kept.delivered, dk)
		}
	}
	size += len(tail) - len(head[len(prefix):])
	text = &planText{chunks: cutPlan(p, prefix, tail, encs), size: size}
	text.hash(kept.reuse(text.chunks))
	kept.chunks = text.chunks
	return text, text.digest
}

// cutPlan cuts a plan's text into chunks: head, then the encodings of
// p's resources (encs), then tail.
func cutPlan(p *Plan, head, tail []byte, encs [][]byte) []*planChunk {
	chunks := make([]*planChunk, 0, 2+len(encs)/(4*chunkEvery))
	c := &planChunk{first: true, lead: head, size: len(head)}
	if len(encs) > 0 {
		c.key = p.Resources[0].Module
	}
	for i, enc := range encs {
		if i > 0 && p.Resources[i].Module != p.Resources[i-1].Module && cutAfter(p.Resources[i-1].Module) {
			chunks = append(chunks, c)
			c = &planChunk{key: p.Resources[i].Module}
		}
		if len(c.encs) == 0 {
			c.encs = encs[i:i]
		}
		c.encs = c.encs[:len(c.encs)+1] // encs[i] is the next of encs
		c.size += len(enc) + 1
	}
	return append(chunks, c, &planChunk{key: tailKey, lead: tail, size: len(tail)})
}

// reuse takes, for the chunks of a plan's text, what the node's last
// plan's chunks give: the stream of each chunk the same as one of them
// after the chunk before it there too, and the hash states after the
// chunks the two plans begin alike with (returned).
func (k *keptPlan) reuse(chunks []*planChunk) (prefix [][]byte) {
	if len(k.chunks) == 0 {
		return nil
	}
	at := make(map[string]int, len(k.chunks))
	for i, c := range k.chunks {
		at[c.key] = i
	}
	alike, prev := true, -1
	for j, c := range chunks {
		i, ok := at[c.key]
		if !ok || !c.same(k.chunks[i]) {
			alike, prev = false, -1
			continue
		}
		if i == j && alike && k.chunks[i].after != nil {
			prefix = append(prefix, k.chunks[i].after)
		} else {
			alike = false
		}
		if i == 0 || prev == i-1 {
			c.packed = k.chunks[i].packed
		}
		prev = i
	}
	return prefix
}

// keptPlan is what planBody keeps of a node's last plan: its resources by
// their declaration, each marked with the gen of the last plan it was in.
type keptPlan struct {
	of  map[*manifest.Resource]*keptResource
	gen uint64
	// order is of's resources in the order of the last plan (nil where
	// a resource has no src): planBody finds most of a plan's resources
	// in it, at the place after the one before, rather than in of (at
	// 10,000 modules the lookups of a node's 500 were a tenth of an
	// assign's composing), and sweeps what it did not find from it.
	order []*keptResource
	// delivered are the delivered credentials', by their directory's
	// declaration and their path: a database's node delivers one per
	// consumer, and encoding them all with every command was a third of
	// an assign in a fleet of wired modules.
	delivered map[deliveredKey]*keptResource
	// chunks are the last plan's text's (cutPlan).
	chunks []*planChunk
	// routes and routeEncs are the last plan's routes and their
	// encodings: a node of 100 modules routes 200 names, and encoding
	// them with every assign was a tenth of it (then looking each up in
	// a map of them was a twentieth).
	routes    []Route
	routeEncs [][]byte
}

type deliveredKey struct {
	via  *manifest.Resource
	name string
}

// routeLook is how far past where it is expected routesTail looks for a
// route of the last plan (a command moves a few modules' routes).
const routeLook = 8

// routesTail is the plan's tail with its routes: tail is the plan's
// encoded without routes (']' and what follows the resources), and the
// routes come right after the resources (Plan's field order). A route
// equal to one of the last plan's near where it was takes its encoding;
// any other is encoded.
func (k *keptPlan) routesTail(routes []Route, tail []byte) []byte {
	encs := make([][]byte, len(routes))
	size := len(tail) + len(`,"routes":[]`) + len(routes) - 1
	next := 0 // where in k.routes the route after the one found is
	for i, r := range routes {
		for j := next; j < min(next+routeLook, len(k.routes)); j++ {
			if k.routes[j] == r {
				encs[i], next = k.routeEncs[j], j+1
				break
			}
		}
		if encs[i] == nil {
			enc, err := json.Marshal(r)
			if err != nil {
				panic(err) // a Route always encodes
			}
			encs[i] = enc
		}
		size += len(encs[i])
	}
	// The plan's Routes are never changed once composed.
	k.routes, k.routeEncs = routes, encs
	out := make([]byte, 0, size)
	out = append(out, `],"routes":[`...)
	for i, enc := range encs {
		if i > 0 {
			out = append(out, ',')
		}
		out = append(out, enc...)
	}
	out = append(out, ']')
	return append(out, tail[1:]...)
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
