// Package cluster owns the Raft side of a node: the log and stable stores,
// snapshots, the transport, PKI, bootstrapping, membership and applying
// commands. It adapts a state.Store to raft.FSM. The local API is package
// cluster/api; `mesh agent` (agent.go) assembles the node.
//
// It must not decide anything the state decides (placement, plans, names): it
// carries commands to the log and answers reads from the local replica.
package cluster

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	raftwal "github.com/hashicorp/raft-wal"

	"mesh/internal/connlimit"
	"mesh/internal/safefs"
	"mesh/internal/seal"
	"mesh/state"
)

// Defaults.
const (
	DefaultPort     = 7430
	DefaultLogStore = LogStoreWAL
	// ApplyTimeout bounds how long a write waits for the log.
	ApplyTimeout = 10 * time.Second
	// LeaderWait bounds how long a write waits for an election to finish.
	LeaderWait = 4 * time.Second
	// perMiB is the time a write is given for each MiB it carries, on
	// top of the bounds above: a link of 4 Mbit/s (a home uplink) carries
	// a MiB in two seconds.
	perMiB = 2 * time.Second
)

// LargeWrite is the time a write of size bytes is given on top of the
// bounds of a small one, to cross to the leader (a restore of a fleet's
// state weighs tens of MiB). Every bound a write meets along the way
// grows by it: the local API's, the forwarding node's and the leader's
// reading of the body.
func LargeWrite(size int64) time.Duration {
	if size <= 0 {
		return 0
	}
	return time.Duration(size>>20) * perMiB
}

// wrapPeerTransport, when set (tests), wraps the transport of the peers'
// clients of node id, as the node starts.
var wrapPeerTransport func(id string, rt http.RoundTripper) http.RoundTripper

// peerCallTime bounds a call to a peer that carries at most a small body
// (smallCommand); a write with more has LargeWrite more, through a client
// of no bound of its own. A tunable for tests, read when a node starts.
var peerCallTime = newTunable(15 * time.Second)

// Log stores that can back the Raft log (see DESIGN.md for the choice).
const (
	LogStoreBolt = "boltdb"
	LogStoreWAL  = "wal"
)

// Sentinel errors.
var (
	// ErrNoLeader: no leader is reachable, so no write can commit.
	ErrNoLeader = errors.New("no leader is reachable")
)

// Config says where a node keeps its Raft data and how it is reached.
type Config struct {
	// Dir holds the raft log, stable store and snapshots.
	Dir string
	// ID is the node's name.
	ID string
	// Bind is the host:port the transport listens on (":0" picks a port).
	Bind string
	// Advertise is the host:port peers dial; empty: the bound address.
	Advertise string
	// LogStore is LogStoreWAL or LogStoreBolt.
	LogStore string
	// TLSDir holds the mesh CA and this node's certificate and key.
	TLSDir string
	Logger *slog.Logger
	// Version is this binary's version, told to the other nodes.
	Version string
	// Vouch are the voters when this node joined (Identity.Vouch).
	Vouch []string
}

// Node is one Raft member holding a replica in a state.Store.
type Node struct {
	cfg Config
	// large are the places of the forwarded commands over smallCommand
	// the leader reads at once, reads the bodies being read (serveApply).
	large     chan struct{}
	reads     readers
	raft      *raft.Raft
	store     *state.Store
	transport *raft.NetworkTransport
	mux       *mux
	tls       *nodeTLS
	seal      *seal.Identity
	stopOnce  sync.Once
	peers     *http.Client
	peerConns *peerTransport
	// streams is peers with no overall timeout: logs and exec (operate).
	streams *http.Client
	peerAPI *http.Server
	// serving counts the peer API's requests; endServing ends their
	// contexts (Shutdown).
	serving    *inflight
	endServing context.CancelFunc
	// operate serves /v1/op/ (logs and exec) once the agent has set it.
	operate atomic.Pointer[http.Handler]
	logs    io.Closer
	log     *slog.Logger

	live liveness
	stop chan struct{}
	// trustMu orders refreshTrust's reads and writes of the trust (rotate.go).
	trustMu sync.Mutex
	// downloads counts the binary's downloads in flight (bootstrap.go).
	downloads *connlimit.Bounds
	// refusedJoin throttles the warning for a join refused for its
	// secret (anybody on the network can send one).
	refusedJoin connlimit.Throttle
	// joinOpened is the join secret as last opened (sealed.go).
	joinOpened openedSecret

	// Commit notices (committed.go): logStore is Raft's log, read for a
	// notice's term and a catch-up's entries; notices are the leader's to
	// send; caughtUp is the newest notice taken as a follower.
	logStore raft.LogStore
	// logsMu guards the log store's closing (logsClosed): a commit that
	// ended as the node stopped read the log after Shutdown closed it,
	// and raft-wal panics on a closed log.
	logsMu      sync.RWMutex
	logsClosed  bool
	notices     commitNotices
	caughtUp    atomic.Pointer[committedNotice]
	catchUpWake chan struct{}
	// catchingUp is done once catchUp has returned: Shutdown waits for it,
	// so no catch-up touches the replica after the node stops.
	catchingUp sync.WaitGroup
}

// New opens (or creates) the Raft data in cfg.Dir and starts the node. It does
// not bootstrap: Bootstrap does that once, at `mesh init`.
func New(cfg Config, store *state.Store) (*Node, error) {
	if cfg.LogStore == "" {
		cfg.LogStore = DefaultLogStore
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	log := cfg.Logger.With("component", "cluster")
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("create raft dir: %w", err)
	}
	logStore, stable, closer, err := openLogStore(cfg.LogStore, cfg.Dir)
	if err != nil {
		return nil, err
	}
	hl := newHclog(cfg.Logger, "raft")
	removeCutSnapshots(filepath.Join(cfg.Dir, "snapshots", "snapshots"), log)
	snaps, err := raft.NewFileSnapshotStoreWithLogger(filepath.Join(cfg.Dir, "snapshots"), 3, hl)
	if err != nil {
		closer.Close()
		return nil, fmt.Errorf("open snapshot store: %w", err)
	}
	if err := checkRaftData(cfg.Dir, logStore, stable, snaps, store); err != nil {
		closer.Close()
		return nil, err
	}
	if err := checkSnapshots(cfg.Dir, snaps, logStore, store, log); err != nil {
		closer.Close()
		return nil, err
	}
	// The replica is durable and skips entries it already holds, so it is
	// restored from a snapshot only when it is behind the newest one.
	if err := catchUpFromSnapshot(snaps, store, log); err != nil {
		closer.Close()
		return nil, err
	}
	var adv net.Addr
	if cfg.Advertise != "" {
		if adv, err = net.ResolveTCPAddr("tcp", cfg.Advertise); err != nil {
			closer.Close()
			return nil, fmt.Errorf("advertise address %q: %w", cfg.Advertise, err)
		}
	}
	// The node's sealing key (credentials, and on voters the CA key and
	// the join secret, are sealed to it) is in the same dir as its TLS key.
	// One the mesh knows this node by, gone, is not made anew in silence:
	// what was sealed to it opens only with it.
	if _, err := os.Stat(filepath.Join(cfg.TLSDir, seal.IdentityFile)); errors.Is(err, os.ErrNotExist) {
		if me, err := store.Node(context.Background(), cfg.ID); err == nil && me.SealKey != "" {
			closer.Close()
			return nil, fmt.Errorf("%s is missing, but the mesh knows node %s by the sealing key %s: the credentials this node delivers, and on a voter the mesh's CA key and join secret, are sealed to it and open only with it. Put seal.key back from a backup of the data dir; or give the node up: move the data dir aside, mesh node remove %s on another node, and join this machine again (on a mesh whose only voter this is, the CA key and the join secret are then lost: mesh token cannot work again, and the mesh must be made anew)",
				filepath.Join(cfg.TLSDir, seal.IdentityFile), cfg.ID, me.SealKey, cfg.ID)
		}
	}
	sk, err := seal.LoadOrCreate(cfg.TLSDir)
	if err != nil {
		closer.Close()
		return nil, err
	}
	nt, err := loadNodeTLS(cfg.TLSDir)
	if err != nil {
		closer.Close()
		return nil, err
	}
	ln, err := net.Listen("tcp", cfg.Bind)
	if err != nil {
		closer.Close()
		return nil, fmt.Errorf("listen for peers on %s: %w", cfg.Bind, err)
	}
	// A peer must be a node of the replica, with the key recorded for it
	// (keyFits). A node that just joined has an
	// empty replica; until it knows any node, the mesh CA (whose digest its
	// token pinned) vouches for the leader that brings it the state, if
	// it was a voter when this node joined.
	member := replicaMember(store, cfg.Vouch, time.Now().Add(vouchFor), log)
	nt.peerOK = func(name string, cert *x509.Certificate) error {
		if !member(name, cert) {
			return fmt.Errorf("the peer's certificate for %s is not the one the mesh recorded for it (another key, or no such node)", name)
		}
		return nil
	}
	nodes := &nodeAddresses{load: func() (map[netip.Addr]bool, error) {
		list, err := store.Nodes(context.Background())
		if err != nil {
			return nil, err
		}
		set := map[netip.Addr]bool{}
		for _, nd := range list {
			for _, s := range []string{nd.Address, nd.OverlayAddress} {
				if a, err := netip.ParseAddr(s); err == nil {
					set[a.Unmap()] = true
				}
			}
		}
		return set, nil
	}, changed: store.Changed}
	m := newMux(ln, nt, member, nodes.has, log)
	m.emptyReplica = func() bool {
		nodes, err := store.Nodes(context.Background())
		return err == nil && len(nodes) == 0
	}
	m.caughtUp = func() bool {
		me, err := store.Node(context.Background(), cfg.ID)
		return err == nil && keyFits(me, nt.current().Leaf)
	}
	m.run(func() { m.keepRechecking(store.Changed) })
	stop := make(chan struct{})
	trans := raft.NewNetworkTransportWithLogger(&streamLayer{m: m, advertise: adv, stop: stop, known: knownPeer(store), nodeAt: nodeAt(store)}, 3, 10*time.Second, hl)
	rc := raft.DefaultConfig()
	rc.LocalID = raft.ServerID(cfg.ID)
	rc.Logger = hl
	rc.HeartbeatTimeout = heartbeatTimeout
	rc.ElectionTimeout = 500 * time.Millisecond
	// A leader steps down when a quorum has not answered within its lease.
	// At 250 ms a leader whose voters shared a busy machine stepped down
	// while a fleet of 50 agents formed on 2 cores (bench/fleet.sh: another
	// node led after three formations of four, 2 to 8 elections); at 500 ms
	// the first leader still led after four of four (one election in each
	// of the two counted). The lease does not slow a failover: the
	// followers' own heartbeat timeout starts the election.
	rc.LeaderLeaseTimeout = heartbeatTimeout // at most that, or NewRaft refuses
	rc.CommitTimeout = commitTimeout
	rc.SnapshotThreshold = 2048
	rc.TrailingLogs = 4096
	rc.NoSnapshotRestoreOnStart = true
	r, err := raft.NewRaft(rc, &fsm{store: store, log: log}, logStore, stable, snaps, trans)
	if err != nil {
		trans.Close()
		m.Close()
		closer.Close()
		return nil, fmt.Errorf("start raft: %w", err)
	}
	m.run(func() { m.watchLeader(r) })
	n := &Node{cfg: cfg, raft: r, store: store, transport: trans, mux: m, tls: nt, seal: sk, logs: closer, log: log, live: liveness{seen: map[string]Seen{}},
		downloads: connlimit.New(maxBinaryDownloads, maxBinaryDownloadsPerSrc),
		stop:      stop, logStore: logStore, catchUpWake: make(chan struct{}, 1)}
	n.catchingUp.Add(1)
	go func() { defer n.catchingUp.Done(); n.catchUp() }()
	at := nodeAt(store)
	n.peerConns = &peerTransport{cfg: nt.clientConfig(alpnAPI), expect: func(c *tls.Conn, address string) error { return nt.isNodeAt(at, c, address) }}
	n.peerConns.fresh()
	var peerRT http.RoundTripper = n.peerConns
	if wrapPeerTransport != nil {
		peerRT = wrapPeerTransport(cfg.ID, peerRT)
	}
	n.peers = &http.Client{Timeout: peerCallTime.get(), Transport: peerRT}
	n.streams = &http.Client{Transport: peerRT}
	// An idle connection is closed after two minutes: the peers' own idle
	// connections go after one (peerTransport), so none is cut under a request.
	n.large = make(chan struct{}, largeCommands)
	// The requests' base context ends as the node stops: so does a
	// stream (mesh logs -f, mesh exec).
	base, endServing := context.WithCancel(context.Background())
	n.serving, n.endServing = newInflight(), endServing
	n.peerAPI = &http.Server{Handler: n.serving.serve(n.peerHandler()), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute,
		BaseContext: func(net.Listener) context.Context { return base },
		ConnState:   m.connState, ConnContext: m.connContext}
	go n.peerAPI.Serve(m.api)
	log.Info("raft started", "id", cfg.ID, "addr", trans.LocalAddr(), "log_store", cfg.LogStore)
	return n, nil
}

// ErrDamaged: the node's Raft data is missing or damaged.
var ErrDamaged = errors.New("raft data missing or damaged")

// waysOut is what to do about damaged Raft data.
const waysOut = "ways out: if other nodes of the mesh are alive, move this data dir aside and `mesh join` again (the mesh gives it the state back); " +
	"on the last node, restore a copy of the data dir from a backup, or `mesh init` a new mesh and `mesh snapshot restore` a saved snapshot into it"

// checkRaftData refuses to start a node whose replica has applied entries but
// whose Raft log and term are gone (a removed or damaged raft/ directory):
// it would otherwise start silently as a follower that never finds a leader.
func checkRaftData(dir string, logs raft.LogStore, stable raft.StableStore, snaps raft.SnapshotStore, store *state.Store) error {
	applied, err := store.AppliedIndex()
	if err != nil || applied == 0 {
		return nil
	}
	last, lerr := logs.LastIndex()
	term, terr := stable.GetUint64([]byte("CurrentTerm"))
	snapFiles, _ := os.ReadDir(filepath.Join(dir, "snapshots", "snapshots")) // the file store's own
	if lerr == nil && last == 0 && (terr != nil || term == 0) && len(snapFiles) == 0 {
		return fmt.Errorf("%w: the replica has applied up to index %d, but %s holds no Raft log, term or snapshot; %s", ErrDamaged, applied, dir, waysOut)
	}
	// A replica that applied entries took part in a term: a term of 0 is a
	// log store that was emptied (rm raft/wal/*), whatever snapshot is left.
	if terr != nil || term == 0 {
		return fmt.Errorf("%w: the replica has applied up to index %d, but %s holds no Raft term (its log store was emptied or replaced); %s", ErrDamaged, applied, dir, waysOut)
	}
	var snapped uint64
	if list, err := snaps.List(); err == nil && len(list) > 0 {
		snapped = list[0].Index
	}
	// What the replica applied is in the log or in a snapshot: a log that
	// ends before it (a segment cut short by garbage, which the store reads
	// as its end) lost committed entries.
	if lerr == nil && last < applied && snapped < applied {
		return fmt.Errorf("%w: the Raft log in %s ends at index %d and its newest snapshot at %d, before the %d the replica applied: entries were lost (a damaged segment); %s", ErrDamaged, dir, last, snapped, applied, waysOut)
	}
	return verifyLog(logs, snapped)
}

// verifyLog reads every entry of the log and decodes each command: a
// segment damaged on disk (garbage written over it) is named at start,
// instead of stopping the node the day Raft reads that entry, or feeding
// a follower what it cannot apply.
//
// Entries up to the newest snapshot's index (snapped) may be missing: a
// follower's bolt store keeps the entries before a snapshot installed past
// them and appends after it, a gap Raft never reads.
func verifyLog(logs raft.LogStore, snapped uint64) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: reading the Raft log failed (%v); %s", ErrDamaged, r, waysOut)
		}
	}()
	first, err := logs.FirstIndex()
	if err != nil {
		return fmt.Errorf("%w: the Raft log's first index: %v; %s", ErrDamaged, err, waysOut)
	}
	last, err := logs.LastIndex()
	if err != nil {
		return fmt.Errorf("%w: the Raft log's last index: %v; %s", ErrDamaged, err, waysOut)
	}
	if first == 0 {
		return nil
	}
	var l raft.Log
	for i := first; i <= last; i++ {
		if err := logs.GetLog(i, &l); err != nil {
			if errors.Is(err, raft.ErrLogNotFound) && i <= snapped {
				continue
			}
			return fmt.Errorf("%w: entry %d of the Raft log cannot be read: %v; %s", ErrDamaged, i, err, waysOut)
		}
		if l.Index != i {
			return fmt.Errorf("%w: entry %d of the Raft log reads as entry %d; %s", ErrDamaged, i, l.Index, waysOut)
		}
		if l.Type == raft.LogCommand {
			if _, err := state.Decode(l.Data); err != nil {
				return fmt.Errorf("%w: entry %d of the Raft log is not a command (%v): the log is damaged on disk; %s", ErrDamaged, i, err, waysOut)
			}
		}
	}
	return nil
}

func openLogStore(kind, dir string) (_ raft.LogStore, _ raft.StableStore, _ io.Closer, err error) {
	// A damaged store file makes some libraries panic; name it instead.
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: opening the %s log store in %s failed (%v); %s", ErrDamaged, kind, dir, r, waysOut)
		}
	}()
	switch kind {
	case LogStoreBolt:
		b, err := raftboltdb.NewBoltStore(filepath.Join(dir, "raft.db"))
		if err != nil {
			return nil, nil, nil, fmt.Errorf("%w: open raft bolt store in %s: %v; %s", ErrDamaged, dir, err, waysOut)
		}
		return b, b, b, nil
	case LogStoreWAL:
		d := filepath.Join(dir, "wal")
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, nil, nil, err
		}
		w, err := raftwal.Open(d)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("%w: open raft wal in %s: %v; %s", ErrDamaged, d, err, waysOut)
		}
		return w, w, w, nil
	}
	return nil, nil, nil, fmt.Errorf("unknown raft log store %q (use %s or %s)", kind, LogStoreWAL, LogStoreBolt)
}

// checkSnapshots reads the newest Raft snapshot whole (Open checks its
// CRC), so that one damaged on disk (cut short, changed, its meta
// unreadable) is found at start rather than the day a follower needs it or
// this replica catches up from it (Raft, which reads no snapshot at start
// but its meta, passes over one whose meta it cannot read, and would then
// start from an older one, or panic on a log compacted past it). A damaged
// snapshot is set aside, as raft/snapshots/damaged-ID, when the node can do
// without it:
//   - the log holds the entry the replica stands at: a snapshot is written
//     at that index from state.db, as Raft would take one, before the
//     damaged one is set aside (a kill between the two leaves both: the
//     next start finds the new one first, or does the same again);
//   - else the next older snapshot is intact and the log holds every entry
//     after it: Raft starts from that one and replays the rest, which the
//     replica skips where it holds them.
//
// Otherwise the start is refused, saying what is damaged and the ways out.
// Last, the log must hold every entry after the newest snapshot.
func checkSnapshots(dir string, snaps *raft.FileSnapshotStore, logs raft.LogStore, store *state.Store, log *slog.Logger) error {
	path := filepath.Join(dir, "snapshots", "snapshots") // the file store's own
	list, err := snaps.List()
	if err != nil {
		return fmt.Errorf("%w: the Raft snapshots in %s cannot be listed: %v; %s", ErrDamaged, dir, err, waysOut)
	}
	// Each turn sets one damaged snapshot aside (a snapshot written again
	// reads back), until the newest is intact: two can be damaged, and the
	// one written again may stand below the other.
	for turns := 0; ; turns++ {
		entries, _ := os.ReadDir(path)
		if turns > len(entries) {
			return fmt.Errorf("%w: the Raft snapshots in %s are still damaged after %d were set aside; %s", ErrDamaged, dir, turns, waysOut)
		}
		d, err := damagedSnapshot(path, snaps, list)
		if err != nil {
			return fmt.Errorf("%w: the newest Raft snapshot in %s cannot be read: %v; %s", ErrDamaged, dir, err, waysOut)
		}
		if d == nil {
			break
		}
		if err := setDamagedAside(dir, path, snaps, d, list, logs, store, log); err != nil {
			return err
		}
		if list, err = snaps.List(); err != nil {
			return err
		}
	}
	// Raft starts from the newest snapshot and reads every entry of the
	// log after it (it panics on one it cannot read): a log that begins
	// later, or has a gap after it, lost entries.
	var newest uint64
	if len(list) > 0 {
		newest = list[0].Index
	}
	if err := logHolds(logs, newest+1); err != nil {
		return fmt.Errorf("%w: the Raft log in %s %v, past its newest snapshot's %d: entries Raft reads at start are lost; %s", ErrDamaged, dir, err, newest, waysOut)
	}
	return nil
}

// setDamagedAside moves the damaged snapshot d to raft/snapshots/damaged-ID
// once the node can do without it (checkSnapshots), or says why not.
func setDamagedAside(dir, path string, snaps *raft.FileSnapshotStore, d *damagedSnap, list []*raft.SnapshotMeta, logs raft.LogStore, store *state.Store, log *slog.Logger) error {
	aside := func(how string) error {
		to := filepath.Join(dir, "snapshots", "damaged-"+d.id)
		if err := os.Rename(filepath.Join(path, d.id), to); err != nil {
			return fmt.Errorf("set the damaged Raft snapshot %s aside: %w", d.id, err)
		}
		if err := safefs.SyncDir(filepath.Join(dir, "snapshots")); err != nil {
			return err
		}
		log.Warn("the newest Raft snapshot was damaged on disk; it is set aside", "snapshot", d.id, "damage", d.why, "aside", to, "instead", how)
		return nil
	}
	rewriteErr := rewriteSnapshot(path, snaps, d.meta, list, logs, store)
	if rewriteErr == nil {
		return aside("a snapshot written again from state.db")
	}
	// An older one stands in if it is intact and the log holds every
	// entry after it, up to the damaged one's at least.
	if older := d.older(list); older != nil {
		last, lerr := logs.LastIndex()
		if lerr == nil && last >= d.index && logHolds(logs, older.Index+1) == nil {
			if _, rc, oerr := snaps.Open(older.ID); oerr == nil {
				rc.Close()
				return aside("the older snapshot " + older.ID)
			}
		}
	}
	return fmt.Errorf("%w: the newest Raft snapshot %s in %s is damaged (%v: cut short or changed on disk); it cannot be written again (%v), "+
		"and no older intact snapshot with the log after it can stand in; %s", ErrDamaged, d.id, dir, d.why, rewriteErr, waysOut)
}

// logHolds says whether the log holds every entry from index from to its
// last: Raft reads each of them at start.
func logHolds(logs raft.LogStore, from uint64) error {
	first, err := logs.FirstIndex()
	if err != nil {
		return fmt.Errorf("has no first index (%v)", err)
	}
	last, err := logs.LastIndex()
	if err != nil {
		return fmt.Errorf("has no last index (%v)", err)
	}
	if first == 0 || last < from {
		return nil // nothing after from to read
	}
	if first > from {
		return fmt.Errorf("begins at entry %d", first)
	}
	var l raft.Log
	for i := from; i <= last; i++ {
		if err := logs.GetLog(i, &l); err != nil {
			return fmt.Errorf("has no entry %d (%v)", i, err)
		}
	}
	return nil
}

// damagedSnap is the newest snapshot, damaged: its ID, index, why, and its
// meta when that could be read.
type damagedSnap struct {
	id    string
	index uint64
	why   error
	meta  *raft.SnapshotMeta
}

// replicaMember says whether a peer of that name and certificate is a
// node of the replica, with the key recorded for it (keyFits); while the
// replica holds no node (this node just joined), whether it is one of
// vouch, the voters when this node joined (all the CA vouches for when
// vouch is empty, its leader older): a removed node's certificate stays
// valid for a year, and an empty replica cannot tell that it was removed.
// One read: the replica fills while a node catches up, and two reads
// could see it empty and then without the peer.
//
// The list holds until until: past it (none of them brought the state:
// the leadership went to a voter that joined after this node, say), any
// node the CA vouches for is taken, as before the list, rather than wait
// for ever; the log says so, once a minute at most.
func replicaMember(store *state.Store, vouch []string, until time.Time, log *slog.Logger) func(string, *x509.Certificate) bool {
	var said connlimit.Throttle
	return func(name string, cert *x509.Certificate) bool {
		nodes, err := store.Nodes(context.Background())
		if err != nil {
			return false
		}
		if len(nodes) == 0 {
			if len(vouch) == 0 || slices.Contains(vouch, name) {
				return true
			}
			if time.Now().After(until) {
				if said.Now() {
					log.Warn("none of the voters this node joined with brought it the state: it takes a leader the mesh CA vouches for", "voters_then", vouch, "peer", name)
				}
				return true
			}
			return false
		}
		return pinnedIn(nodes, name, cert)
	}
}

// vouchFor is how long a node whose replica is empty takes Raft from the
// voters it joined with alone (replicaMember), from its agent's start.
var vouchFor = 10 * time.Minute

// removeCutSnapshots removes the snapshots a kill cut while Raft wrote
// them (ID.tmp in path, the file store's directory): Raft lists none of
// them and never removes them, so each kill mid-snapshot kept one for
// good (51 MB at 10,000 modules). The caller holds the data dir's lock
// and has not opened the store: no snapshot is being written. A failure
// is logged, not fatal: what is left takes room, nothing else.
func removeCutSnapshots(path string, log *slog.Logger) {
	entries, err := os.ReadDir(path)
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			log.Warn("the snapshots' directory cannot be read to remove those a kill cut", "dir", path, "err", err)
		}
		return
	}
	for _, e := range entries {
		if !e.IsDir() || !strings.HasSuffix(e.Name(), ".tmp") {
			continue
		}
		p := filepath.Join(path, e.Name())
		if err := os.RemoveAll(p); err != nil {
			log.Warn("a snapshot cut by a kill cannot be removed", "dir", p, "err", err)
			continue
		}
		log.Info("removed a snapshot cut by a kill while it was written", "dir", p)
	}
}

// older is the snapshot Raft would start from without d.
func (d *damagedSnap) older(list []*raft.SnapshotMeta) *raft.SnapshotMeta {
	for _, m := range list {
		if m.ID != d.id {
			return m
		}
	}
	return nil
}

// damagedSnapshot says whether the newest snapshot in path (the file
// store's directory) is damaged: one whose meta cannot be read, newer (by
// the term and index of its name) than every one listed, or the newest
// listed, whose CRC does not check or whose state is gone. Any other
// failure to read it is returned as it is.
func damagedSnapshot(path string, snaps *raft.FileSnapshotStore, list []*raft.SnapshotMeta) (*damagedSnap, error) {
	listed := map[string]bool{}
	for _, m := range list {
		listed[m.ID] = true
	}
	entries, err := os.ReadDir(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	var d *damagedSnap
	var dterm uint64
	for _, e := range entries {
		name := e.Name()
		if !e.IsDir() || strings.HasSuffix(name, ".tmp") || listed[name] {
			continue
		}
		parts := strings.Split(name, "-")
		if len(parts) != 3 {
			continue
		}
		term, terr := strconv.ParseUint(parts[0], 10, 64)
		index, ierr := strconv.ParseUint(parts[1], 10, 64)
		if terr != nil || ierr != nil {
			continue
		}
		// Damage is a meta that is gone, does not decode, or is of a
		// version Raft does not read; another failure to read it is
		// returned as it is.
		raw, err := os.ReadFile(filepath.Join(path, name, "meta.json"))
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("snapshot %s: %w", name, err)
		}
		var meta raft.SnapshotMeta
		if err == nil && json.Unmarshal(raw, &meta) == nil && meta.Version >= raft.SnapshotVersionMin && meta.Version <= raft.SnapshotVersionMax {
			continue
		}
		if d == nil || term > dterm || term == dterm && index > d.index {
			d, dterm = &damagedSnap{id: name, index: index, why: errors.New("its meta.json cannot be read")}, term
		}
	}
	if d != nil && (len(list) == 0 || dterm > list[0].Term || dterm == list[0].Term && d.index > list[0].Index) {
		return d, nil
	}
	if len(list) == 0 {
		return nil, nil
	}
	_, rc, err := snaps.Open(list[0].ID)
	switch {
	case err == nil:
		return nil, rc.Close()
	case err.Error() == "CRC mismatch", errors.Is(err, os.ErrNotExist), errors.Is(err, io.ErrUnexpectedEOF):
		return &damagedSnap{id: list[0].ID, index: list[0].Index, why: err, meta: list[0]}, nil
	}
	return nil, fmt.Errorf("snapshot %s: %w", list[0].ID, err)
}

// rewriteSnapshot writes a snapshot from the replica at the index it
// stands at, in place of a damaged one, with what Raft keeps beside it:
// the term of that entry and the configuration as of it, the last one in
// the log up to it, over a meta's (the damaged one's when it could be read,
// else the newest listed) whose following entries the log holds. The log
// must hold the entry; the snapshot must not be one the store's retention
// (three) would remove as it is written. One that does not read back is
// removed from path (the file store's directory).
func rewriteSnapshot(path string, snaps *raft.FileSnapshotStore, damaged *raft.SnapshotMeta, list []*raft.SnapshotMeta, logs raft.LogStore, store *state.Store) (err error) {
	defer func() {
		if r := recover(); r != nil { // DecodeConfiguration panics on garbage
			err = fmt.Errorf("reading the log: %v", r)
		}
	}()
	applied, err := store.AppliedIndex()
	if err != nil {
		return err
	}
	first, ferr := logs.FirstIndex()
	last, lerr := logs.LastIndex()
	if ferr != nil || lerr != nil || applied == 0 || first == 0 || applied < first || applied > last {
		return fmt.Errorf("the log (entries %d to %d) does not hold the entry the replica stands at, %d", first, last, applied)
	}
	above := 0
	for _, m := range list {
		if m.Index >= applied {
			above++
		}
	}
	if above >= 3 {
		return fmt.Errorf("the replica stands at entry %d, behind %d snapshots, and one written there would not be kept", applied, above)
	}
	var l raft.Log
	if err := logs.GetLog(applied, &l); err != nil {
		return err
	}
	term := l.Term
	base := damaged
	if base == nil && len(list) > 0 {
		base = list[0]
	}
	// The base's configuration stands as of its index (no later one up to
	// it): only the entries after that are read, if any up to applied. A
	// follower's bolt log may lack the entries below a snapshot installed
	// past them, which a read from the log's first entry stopped at.
	var conf raft.Configuration
	var confIndex uint64
	from := first
	if base != nil && base.ConfigurationIndex <= applied && (applied <= base.Index || first <= base.Index+1) {
		conf, confIndex = base.Configuration, base.ConfigurationIndex
		from = max(first, base.Index+1)
	}
	for i := from; i <= applied; i++ {
		if err := logs.GetLog(i, &l); err != nil {
			return err
		}
		if l.Type == raft.LogConfiguration {
			conf, confIndex = raft.DecodeConfiguration(l.Data), i
		}
	}
	if confIndex == 0 {
		return fmt.Errorf("the configuration as of entry %d is neither in the log nor in a snapshot's meta", applied)
	}
	sink, err := snaps.Create(1, applied, term, conf, confIndex, peerEncoder{})
	if err != nil {
		return err
	}
	if err := store.WriteSnapshot(context.Background(), sink); err != nil {
		sink.Cancel()
		return err
	}
	if now, err := store.AppliedIndex(); err != nil || now != applied {
		sink.Cancel()
		return fmt.Errorf("the replica moved to index %d while it was written (%v)", now, err)
	}
	if err := sink.Close(); err != nil {
		return err
	}
	_, rc, err := snaps.Open(sink.ID())
	if err != nil {
		// Left, it would be the newest, the one Raft starts from.
		if rerr := os.RemoveAll(filepath.Join(path, sink.ID())); rerr != nil {
			return fmt.Errorf("the snapshot written again does not read back (%w), and it cannot be removed: %v", err, rerr)
		}
		return fmt.Errorf("the snapshot written again does not read back: %w", err)
	}
	return rc.Close()
}

// peerEncoder encodes a peer's address as the TCP transports do, for the
// meta's Peers (kept by raft for old versions); nothing else of a
// transport is asked for when a snapshot is created.
type peerEncoder struct{ raft.Transport }

func (peerEncoder) EncodePeer(_ raft.ServerID, addr raft.ServerAddress) []byte { return []byte(addr) }

func catchUpFromSnapshot(snaps *raft.FileSnapshotStore, store *state.Store, log *slog.Logger) error {
	list, err := snaps.List()
	if err != nil || len(list) == 0 {
		return err
	}
	applied, err := store.AppliedIndex()
	if err != nil {
		return err
	}
	if list[0].Index <= applied {
		return nil
	}
	_, rc, err := snaps.Open(list[0].ID)
	if err != nil {
		return fmt.Errorf("open snapshot %s: %w", list[0].ID, err)
	}
	defer rc.Close()
	log.Info("replica is behind the newest snapshot; restoring it", "applied", applied, "snapshot", list[0].Index)
	return store.Restore(context.Background(), rc)
}

// Bootstrap makes this node the sole voter of a new cluster.
func (n *Node) Bootstrap() error {
	cfg := raft.Configuration{Servers: []raft.Server{{
		ID: raft.ServerID(n.cfg.ID), Address: n.transport.LocalAddr(), Suffrage: raft.Voter,
	}}}
	if err := n.raft.BootstrapCluster(cfg).Error(); err != nil {
		return fmt.Errorf("bootstrap raft: %w", err)
	}
	return nil
}

// Addr is the transport's bound address.
func (n *Node) Addr() string { return string(n.transport.LocalAddr()) }

// WaitLeader waits until some node leads, or ctx ends.
func (n *Node) WaitLeader(ctx context.Context) error {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		if addr, _ := n.raft.LeaderWithID(); addr != "" {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for a raft leader: %w", ErrNoLeader)
		case <-t.C:
		}
	}
}

// Apply proposes a command and waits until it is applied on this node. The
// error is the rule the command broke (from the FSM), or why it did not commit.
//
// Without a leader (just after start, during an election, or cut off from the
// majority) it waits for one for LeaderWait; a write that a leader refused
// because it had just lost leadership, and so never applied, is sent again to
// the next leader within the same deadline. A write that may have been applied
// is never sent twice.
func (n *Node) Apply(ctx context.Context, c *state.Command) (uint64, error) {
	timeout := ApplyTimeout
	if d, ok := ctx.Deadline(); ok {
		timeout = time.Until(d)
	}
	if err := n.checkDisk(); err != nil {
		return 0, err
	}
	deadline := time.Now().Add(LeaderWait)
	var last error
	for {
		if n.raft.State() == raft.Leader {
			idx, err := n.commit(c, timeout)
			if !errors.Is(err, errNotApplied) {
				return idx, err
			}
			last = err // never appended: safe to send to the next leader
		} else if n.Leader() != "" && time.Since(n.raft.LastContact()) < 4*heartbeatTimeout {
			// A leader not heard from for a few heartbeats is not one to wait on.
			// A big command (a restore) gets more time to cross (LargeWrite).
			wait := LeaderWait + LargeWrite(int64(len(c.Body)))
			fctx, cancel := context.WithTimeout(ctx, wait)
			idx, err := n.forward(fctx, c)
			timedOut := errors.Is(fctx.Err(), context.DeadlineExceeded)
			cancel()
			if timedOut && err != nil {
				return 0, fmt.Errorf("%w: the leader %s did not answer within %s; the write may or may not have been applied (mesh status shows)", ErrNoLeader, n.Leader(), wait)
			}
			if err == nil || !errors.Is(err, errNotSent) && !errors.Is(err, errNotApplied) {
				return idx, err
			}
			last = err
		}
		if time.Now().After(deadline) {
			msg := fmt.Sprintf("%v within %s; this node may be cut off from the majority of voters (reads, mesh roster and the resolver still answer from its replica)", ErrNoLeader, LeaderWait)
			if last != nil {
				msg += " (last try: " + last.Error() + ")"
			}
			return 0, fmt.Errorf("%w: %s", ErrNoLeader, strings.TrimPrefix(msg, ErrNoLeader.Error()+" "))
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("%w: %v", ErrNoLeader, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Propose applies req through Raft as Apply does, stamped with this node's
// time (the proposer's: the FSM never reads a clock).
func (n *Node) Propose(ctx context.Context, req state.Request) (uint64, error) {
	c := state.NewCommand(req)
	c.Time = time.Now().UTC()
	return n.Apply(ctx, c)
}

// commit appends c on this node as leader and waits for it to apply. An
// error wrapping errNotApplied means it was never appended (this node no
// longer leads), so it may be sent to the next leader.
func (n *Node) commit(c *state.Command, timeout time.Duration) (uint64, error) {
	if err := n.canApply(c); err != nil {
		return 0, err
	}
	if err := n.checkDisk(); err != nil {
		return 0, err
	}
	f := n.raft.Apply(c.Encode(), timeout)
	err := f.Error()
	switch {
	case err == nil:
		n.tellCommitted(f.Index())
		if err, ok := f.Response().(error); ok && err != nil {
			return f.Index(), err
		}
		return f.Index(), nil
	case errors.Is(err, raft.ErrNotLeader):
		return 0, fmt.Errorf("%w: %w: %w", ErrNoLeader, errNotApplied, err)
	case state.IsDiskFull(err):
		return 0, fmt.Errorf("%w on %s: %v; free some space in %s", ErrDiskFull, n.cfg.ID, err, n.cfg.Dir)
	case errors.Is(err, raft.ErrLeadershipLost):
		return 0, fmt.Errorf("commit %s: leadership changed while it committed; it may or may not have been applied (mesh status shows): %w", c.Op, err)
	}
	return 0, fmt.Errorf("commit %s: %w", c.Op, err)
}

// commitTimeout is how often Raft sends each follower the leader's commit
// index when there is nothing new to send; commit notices (committed.go) tell
// followers sooner, so this is only the fallback for a notice lost or taken
// before the follower held its entry. Each of these empty appends reads the
// previous entry from the leader's log and costs a round trip per follower:
// at 20 ms they took 40% of an idle leader's CPU with ten nodes
// (bench/fleet.sh); at 250 ms (500 at most, Raft staggers it), a tenth of
// that. A variable for tests.
var commitTimeout = 250 * time.Millisecond

// heartbeatTimeout is Raft's; a follower hears from a healthy leader well
// within it.
const heartbeatTimeout = 500 * time.Millisecond

// Voters counts the voters of the raft configuration this node holds.
func (n *Node) Voters() (int, error) {
	f := n.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return 0, err
	}
	v := 0
	for _, s := range f.Configuration().Servers {
		if s.Suffrage == raft.Voter {
			v++
		}
	}
	return v, nil
}

// Version is this node's binary version.
func (n *Node) Version() string { return n.cfg.Version }

// State says whether this node leads, follows or is a candidate.
func (n *Node) State() string { return n.raft.State().String() }

// Leader is the leader's ID, or "".
func (n *Node) Leader() string {
	_, id := n.raft.LeaderWithID()
	return string(id)
}

// Linearize returns once this node, the leader, has committed a barrier
// entry in its current term, and so has applied to its replica every write
// committed before the call: a read of the replica then is linearizable.
// The barrier is a log write, so each such read costs one; the cheaper
// read-index (the commit index, then VerifyLeader) is not enough here: a
// leader just elected knows the commit index only as it was when it
// followed, which can be older than a write its predecessor acknowledged
// (TestLinearizeOnNewLeader), and entries that are no command (a new
// leader's no-op, a barrier, a configuration) never reach the replica's
// applied index, so waiting for the commit index on it can hang. A node
// that is not the leader, or that a quorum no longer follows (deposed
// while paused or cut off), gets ErrNoLeader.
func (n *Node) Linearize(ctx context.Context) error {
	if n.raft.State() != raft.Leader {
		return fmt.Errorf("%w: %s is not the leader (the leader is %q); ask the leader", ErrNoLeader, n.cfg.ID, n.Leader())
	}
	if err := linearize(ctx, n.raft); err != nil {
		return fmt.Errorf("%w: %s could not commit a barrier with a quorum: %v", ErrNoLeader, n.cfg.ID, err)
	}
	return nil
}

func linearize(ctx context.Context, r *raft.Raft) error {
	limit := 5 * time.Second
	if d, ok := ctx.Deadline(); ok {
		limit = time.Until(d)
	}
	f := r.Barrier(limit)
	done := make(chan error, 1)
	go func() { done <- f.Error() }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Snapshot takes a snapshot now (tests and `mesh` maintenance).
func (n *Node) Snapshot() error { return n.raft.Snapshot().Error() }

// Shutdown stops Raft and closes the stores.
func (n *Node) Shutdown() error {
	n.stopOnce.Do(func() { close(n.stop) })
	n.catchingUp.Wait()
	err := n.raft.Shutdown().Error()
	n.endServing()
	n.peerAPI.Close()
	if !n.serving.close(peerStopWait) {
		n.log.Warn("a request to the peer API did not end; closing the replica under it", "waited", peerStopWait)
	}
	n.transport.Close()
	n.mux.Close()
	n.logsMu.Lock()
	n.logsClosed = true
	n.logsMu.Unlock()
	if cerr := n.logs.Close(); err == nil {
		err = cerr
	}
	return err
}

// fsm adapts state.Store to raft.FSM.
type fsm struct {
	store *state.Store
	log   *slog.Logger
}

func (f *fsm) Apply(l *raft.Log) any {
	if l.Type != raft.LogCommand {
		return nil
	}
	if err := f.store.Apply(l.Index, l.Data); err != nil {
		return err
	}
	return nil
}

func (f *fsm) Snapshot() (raft.FSMSnapshot, error) {
	var b bytesBuffer
	if err := f.store.WriteSnapshot(context.Background(), &b); err != nil {
		return nil, err
	}
	return &b, nil
}

func (f *fsm) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	return f.store.Restore(context.Background(), rc)
}

// bytesBuffer is a snapshot already taken in memory; Persist only writes it.
type bytesBuffer struct{ b []byte }

func (b *bytesBuffer) Write(p []byte) (int, error) { b.b = append(b.b, p...); return len(p), nil }

func (b *bytesBuffer) Persist(sink raft.SnapshotSink) error {
	if _, err := sink.Write(b.b); err != nil {
		sink.Cancel()
		return err
	}
	return sink.Close()
}

func (b *bytesBuffer) Release() {}

// Stats is Raft's own view of itself: state, term, commit_index,
// applied_index, last_log_index and the rest (strings, as Raft gives them).
func (n *Node) Stats() map[string]string { return n.raft.Stats() }
