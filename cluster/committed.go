package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
)

// Telling followers of a commit at once.
//
// hashicorp/raft sends a follower the leader's commit index only with the
// next entries, or with an empty append every CommitTimeout (250-500 ms here),
// so without help every other node applies a change, and every other
// resolver answers the new names, that much later. A barrier entry would
// carry the index at once, but it costs a log write and an fsync on the
// leader and on each follower before the follower may apply anything.
//
// Instead, once a command has committed and applied on the leader, the
// leader tells each other server "index I of term T is committed" over the
// peer API. A follower that holds entry I with term T in its own log knows,
// by Raft's log matching, that it holds exactly the committed entries up to
// I, and applies them from its own log (state.Store.CatchUp); Raft's Apply
// of the same entries later skips them. A notice is taken only from the
// server this follower knows as its leader, and only for an entry it holds
// with that term; anything else is left to Raft, which delivers the commit
// as it always did. A lost notice costs only time.

// committedNotice is the body of POST /v1/committed.
type committedNotice struct {
	Index uint64 `json:"index"`
	Term  uint64 `json:"term"`
}

// commitNotices holds, per other server, the newest notice to send, and one
// sender for each, so a slow or dead follower never holds up the others and
// a burst of commits costs one call per follower.
type commitNotices struct {
	mu    sync.Mutex
	peers map[raft.ServerID]*noticeSlot
}

type noticeSlot struct {
	latest atomic.Pointer[committedNotice]
	wake   chan struct{}
}

// raise makes p hold c unless it holds a notice of that index or later.
func raise(p *atomic.Pointer[committedNotice], c *committedNotice) {
	for {
		old := p.Load()
		if old != nil && old.Index >= c.Index || p.CompareAndSwap(old, c) {
			return
		}
	}
}

// tellCommitted queues a notice of the command committed at index for every
// other server of the configuration. Called on the leader after the command
// applied here.
func (n *Node) tellCommitted(index uint64) {
	if !noticesOn.Load() {
		return
	}
	var l raft.Log
	n.logsMu.RLock()
	if n.logsClosed {
		n.logsMu.RUnlock()
		return // the node stopped
	}
	err := n.logStore.GetLog(index, &l)
	n.logsMu.RUnlock()
	if err != nil {
		return // compacted already: Raft tells the followers
	}
	notice := &committedNotice{Index: index, Term: l.Term}
	f := n.raft.GetConfiguration()
	if f.Error() != nil {
		return
	}
	n.notices.mu.Lock()
	defer n.notices.mu.Unlock()
	if n.notices.peers == nil {
		n.notices.peers = map[raft.ServerID]*noticeSlot{}
	}
	for _, s := range f.Configuration().Servers {
		if s.ID == raft.ServerID(n.cfg.ID) {
			continue
		}
		slot := n.notices.peers[s.ID]
		if slot == nil {
			slot = &noticeSlot{wake: make(chan struct{}, 1)}
			n.notices.peers[s.ID] = slot
			go n.sendNotices(s.ID, slot)
		}
		raise(&slot.latest, notice)
		select {
		case slot.wake <- struct{}{}:
		default:
		}
	}
}

// sendNotices sends one server its newest notice each time there is one,
// until the node stops or the server leaves the configuration.
func (n *Node) sendNotices(id raft.ServerID, slot *noticeSlot) {
	var sent uint64
	for {
		select {
		case <-n.stop:
			return
		case <-slot.wake:
		}
		notice := slot.latest.Load()
		if notice == nil || notice.Index <= sent {
			continue
		}
		addr := n.peerAddr(string(id))
		if addr == "" { // no longer in the configuration
			n.notices.mu.Lock()
			delete(n.notices.peers, id)
			n.notices.mu.Unlock()
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), noticeTimeout)
		var out struct{}
		if err := n.call(ctx, addr, "/v1/committed", notice, &out); err != nil {
			n.log.Debug("commit notice not delivered; Raft delivers the commit", "peer", id, "index", notice.Index, "err", err)
		}
		cancel()
		sent = notice.Index
	}
}

// noticesOn: tests turn notices off to see Raft's own pace.
var noticesOn atomic.Bool

func init() { noticesOn.Store(true) }

// noticeTimeout bounds one notice: past it, Raft's own commit timeout has
// delivered the commit anyway.
const noticeTimeout = time.Second

// serveCommitted takes a leader's notice of a commit. It answers at once;
// the entries are applied by catchUp.
func (n *Node) serveCommitted(w http.ResponseWriter, r *http.Request) {
	from := n.peerName(r)
	if from == "" {
		boundRest(w)
		http.Error(w, "a certificate of a current node of this mesh is required", http.StatusForbidden)
		return
	}
	var c committedNotice
	if err := json.NewDecoder(io.LimitReader(r.Body, 4096)).Decode(&c); err != nil || c.Index == 0 {
		http.Error(w, "a notice is {index, term}", http.StatusBadRequest)
		return
	}
	if _, leader := n.raft.LeaderWithID(); string(leader) != from {
		// Only the leader this node follows knows what is committed.
		http.Error(w, fmt.Sprintf("%s is not the leader this node follows", from), http.StatusConflict)
		return
	}
	raise(&n.caughtUp, &c)
	select {
	case n.catchUpWake <- struct{}{}:
	default:
	}
	writeJSON(w, http.StatusOK, struct{}{})
}

// catchUp applies what the leader's notices say is committed, from this
// node's own log, once it holds the notice's entry with the notice's term.
func (n *Node) catchUp() {
	for {
		select {
		case <-n.stop:
			return
		case <-n.catchUpWake:
		}
		c := n.caughtUp.Load()
		if c == nil {
			continue
		}
		// A commit needs only a majority: the notice may come before this
		// follower has stored the entry. It looks again for a little while.
		for deadline := time.Now().Add(notHeldWait); ; {
			err := n.applyCommitted(c)
			if err == nil {
				break
			}
			if !errors.Is(err, errNotHeld) || time.Now().After(deadline) {
				n.log.Debug("commit notice not applied; Raft delivers the commit", "index", c.Index, "err", err)
				break
			}
			select {
			case <-n.stop:
				return
			case <-n.catchUpWake:
				c = n.caughtUp.Load()
			case <-time.After(time.Millisecond):
			}
		}
	}
}

// notHeldWait is how long a follower looks for a notice's entry in its own
// log before leaving the commit to Raft (whose next empty append comes
// within commitTimeout's 250-500 ms): a busy leader's append may reach a
// non-voter well after the majority committed it.
const notHeldWait = 250 * time.Millisecond

// errNotHeld: this node's log does not hold the notice's entry (yet), or
// holds another term's entry there.
var errNotHeld = errors.New("entry not held with that term")

func (n *Node) applyCommitted(c *committedNotice) error {
	var l raft.Log
	if err := n.logStore.GetLog(c.Index, &l); err != nil || l.Term != c.Term {
		return errNotHeld
	}
	_, err := n.store.CatchUp(c.Index, func(i uint64) ([]byte, bool, error) {
		var e raft.Log
		if err := n.logStore.GetLog(i, &e); err != nil {
			return nil, false, err
		}
		return e.Data, e.Type == raft.LogCommand, nil
	})
	return err
}
