package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"

	"mesh/state"
)

// Liveness: every node says hello to every other node over the mutual-TLS
// peer API, every ProbeEvery, and keeps when it last heard from each and
// which binary version it runs. Status shows that view, so a powered-off node
// reads "unreachable", never "ok", and the resolver drops a node's instances
// that long after it stopped answering. Each node sends n-1 hellos a round,
// so the fleet sends n*(n-1): nothing at 3 to 10 nodes, but at 50 it was
// more than two cores' worth (issue "scale", bench/fleet.sh). Past
// helloRate*ProbeInterval+1 nodes the round grows with the fleet, so that a
// node sends at most helloRate hellos a second and the fleet's liveness
// grows with n, not n*n; a node that stops then reads unreachable later
// (15 s at 50 nodes). Nomad bounds its servers' heartbeats a second the
// same way (max_heartbeats_per_second), by lengthening every TTL.

// ProbeInterval is the shortest round of hellos (a fleet of up to 21
// nodes); a node not heard from for three rounds reads unreachable.
const (
	ProbeInterval   = 2 * time.Second
	ReachableWithin = 3 * ProbeInterval
	helloRate       = 10
)

// probeEvery is the round of hellos in a fleet of nodes nodes.
func probeEvery(nodes int) time.Duration {
	return max(ProbeInterval, time.Duration(nodes-1)*time.Second/helloRate)
}

// ProbeEvery is this node's round of hellos now (ProbeInterval in a fleet
// of up to 21 nodes).
func (n *Node) ProbeEvery() time.Duration {
	if d := time.Duration(n.live.every.Load()); d > 0 {
		return d
	}
	return ProbeInterval
}

// ReachableWithin is how long since a node last answered a hello it reads
// reachable: three rounds.
func (n *Node) ReachableWithin() time.Duration { return 3 * n.ProbeEvery() }

// Hello is a node's answer to a hello.
type Hello struct {
	Name    string `json:"name"`
	Version string `json:"version"`
	// Commands is the newest command format the node applies
	// (state.CommandVersion of its binary; absent from older ones: 1).
	Commands int `json:"commands,omitempty"`
	// Free is the space left in the node's data dir (bytes; 0 from older
	// binaries).
	Free uint64 `json:"free,omitempty"`
}

// Seen is what this node knows of another's liveness.
type Seen struct {
	LastSeen time.Time
	Version  string
	Commands int
	// Free is the space its data dir had left when it said hello.
	Free uint64
}

type liveness struct {
	mu   sync.Mutex
	seen map[string]Seen
	// every is the round of hellos (ns), from the number of nodes.
	every atomic.Int64
}

func (n *Node) serveHello(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, Hello{Name: n.cfg.ID, Version: n.cfg.Version, Commands: state.CommandVersion, Free: freeBytes(n.cfg.Dir)})
}

// Seen returns when this node last heard from each other node.
func (n *Node) Seen() map[string]Seen {
	n.live.mu.Lock()
	defer n.live.mu.Unlock()
	out := make(map[string]Seen, len(n.live.seen))
	for k, v := range n.live.seen {
		out[k] = v
	}
	return out
}

// probe says hello to every other node of the replica until ctx ends.
func (n *Node) probe(ctx context.Context) {
	for {
		nodes, err := n.store.Nodes(ctx)
		if err == nil {
			n.live.every.Store(int64(probeEvery(len(nodes))))
			var wg sync.WaitGroup
			for _, nd := range nodes {
				if nd.Name == n.cfg.ID {
					continue
				}
				wg.Add(1)
				go func(name string) {
					defer wg.Done()
					n.hello(ctx, name)
				}(nd.Name)
			}
			wg.Wait()
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(n.ProbeEvery()):
		}
	}
}

// maxHello bounds what hello reads of an answer.
const maxHello = 64 << 10

// readHello decodes a peer's hello, reading at most maxHello of it: a hello
// is a few hundred bytes, and in the two seconds of a probe a peer could
// otherwise send hundreds of MB to each prober, every probe.
func readHello(body io.Reader) (Hello, error) {
	var h Hello
	err := json.NewDecoder(io.LimitReader(body, maxHello)).Decode(&h)
	return h, err
}

// hello asks a node who it is and records that it answered; it reports
// whether it did.
func (n *Node) hello(ctx context.Context, name string) bool {
	addr := n.peerAddr(name)
	if addr == "" {
		return false
	}
	cctx, cancel := context.WithTimeout(ctx, ProbeInterval) // a hello slower than that is as good as none
	defer cancel()
	req, err := http.NewRequestWithContext(cctx, "GET", "https://"+addr+"/v1/hello", nil)
	if err != nil {
		return false
	}
	resp, err := n.peers.Do(req)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	h, err := readHello(resp.Body)
	if resp.StatusCode != http.StatusOK || err != nil || h.Name != name {
		return false
	}
	n.live.mu.Lock()
	n.live.seen[name] = Seen{LastSeen: time.Now(), Version: h.Version, Commands: max(h.Commands, 1), Free: h.Free}
	n.live.mu.Unlock()
	return true
}

// peerAddr is where a node's transport listens, from the Raft configuration.
func (n *Node) peerAddr(name string) string {
	f := n.raft.GetConfiguration()
	if f.Error() != nil {
		return ""
	}
	for _, s := range f.Configuration().Servers {
		if string(s.ID) == name {
			return string(s.Address)
		}
	}
	return ""
}

// canApply refuses a command that a node this one has heard from cannot apply
// yet (its binary is older): a rolling upgrade upgrades every node before a
// command of a new format is proposed. A node never heard from since this
// process started is not held against a write of the formats before the
// overlay (an unreachable node must not stop the mesh's writes); for one of
// the overlay's format or later it is, unless the state shows its binary
// takes them (it gave an overlay key, which only such a binary does): else
// a leader just restarted, before any hello, would append what every older
// node stops on.
func (n *Node) canApply(c *state.Command) error {
	need := c.NeedsVersion()
	if need > state.CommandVersion {
		// A newer follower's command, sent to this older leader: appended,
		// it would stop every node of this binary.
		return &state.RuleError{Kind: state.ErrConflict, Msg: fmt.Sprintf("node %s runs mesh %s, which cannot apply a %s command of format %d yet; upgrade %s first", n.cfg.ID, n.cfg.Version, c.Op, need, n.cfg.ID)}
	}
	nodes, err := n.store.Nodes(context.Background())
	if err != nil {
		return nil
	}
	seen := n.Seen()
	for _, nd := range nodes {
		if nd.Name == n.cfg.ID {
			continue
		}
		s, ok := seen[nd.Name]
		if ok && s.Commands < need {
			return &state.RuleError{Kind: state.ErrConflict, Msg: fmt.Sprintf("node %s runs mesh %s, which cannot apply a %s command yet; upgrade %s first", nd.Name, s.Version, c.Op, nd.Name)}
		}
		if !ok && need >= strictFormat && nd.OverlayKey == "" {
			return &state.RuleError{Kind: state.ErrConflict, Msg: fmt.Sprintf("node %s has not said which mesh it runs since this node started, and a %s command must wait until every node is known to apply it (try again in a few seconds; if %s is down for good, mesh node remove it)", nd.Name, c.Op, nd.Name)}
		}
	}
	return nil
}

// strictFormat is the first command format that a node never heard from is
// held against (state.OpNodeOverlay's).
const strictFormat = 7

// keyMayGo says whether a command only this binary's format carries (a
// certificate key) may be proposed from this node now. The leader that will
// append it must be known to apply it: this node, or a leader that said so
// in its hello; an older leader would append it without a look and stop
// every node of its binary. For the other nodes canApply's rule holds; a
// node being admitted (joining) said its format in its join request.
func (n *Node) keyMayGo(c *state.Command, joining string, joiningFormat int) bool {
	need := c.NeedsVersion()
	if n.canApply(c) != nil || joining != "" && joiningFormat < need {
		return false
	}
	if n.raft.State() == raft.Leader {
		return true
	}
	_, leader := n.raft.LeaderWithID()
	s, ok := n.Seen()[string(leader)]
	return ok && s.Commands >= need
}
