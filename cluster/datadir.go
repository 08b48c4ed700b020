package cluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"time"

	"mesh/internal/seal"
	"mesh/internal/wgkey"
	"mesh/state"
)

// Files in a node's data dir.
const (
	IdentityFile = "node.json"
	StateFile    = "state.db"
	RaftDir      = "raft"
	SocketFile   = "mesh.sock"
)

// Identity is what a data dir says about its node. It is node-local.
type Identity struct {
	Name     string `json:"name"`
	Address  string `json:"address"`
	Port     int    `json:"port"`
	MeshID   string `json:"mesh_id"`
	LogStore string `json:"log_store"`
	// Overlay is the mesh's overlay prefix, "off", or "" for a node of a
	// mesh made before the overlay; OverlayAddress is this node's address
	// on it (given at init or join; a node that got none then reads it from
	// its replica), OverlayPort its WireGuard UDP port. mesh setup reads
	// them to prepare a rootless host before its agent runs.
	Overlay        string `json:"overlay,omitempty"`
	OverlayAddress string `json:"overlay_address,omitempty"`
	OverlayPort    int    `json:"overlay_port,omitempty"`
	// Vouch are the voters when this node joined (JoinReply.Voters):
	// while its replica is empty, the only nodes whose Raft connections
	// it takes (on the CA's word: it knows no node's key yet). Empty for
	// the first node, and for one that joined through an older leader.
	Vouch []string `json:"vouch,omitempty"`
}

var nodeNameRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// ReadIdentity reads a data dir's identity, saying what to do when there is none.
func ReadIdentity(dir string) (Identity, error) {
	var id Identity
	b, err := os.ReadFile(filepath.Join(dir, IdentityFile))
	if errors.Is(err, os.ErrNotExist) {
		return id, fmt.Errorf("data dir %s holds no node; create one with `mesh init --name NODE --address IP --data-dir %s`", dir, dir)
	}
	if err != nil {
		return id, fmt.Errorf("read node identity: %w", err)
	}
	if err := json.Unmarshal(b, &id); err != nil {
		return id, fmt.Errorf("node identity %s is damaged: %w", filepath.Join(dir, IdentityFile), err)
	}
	return id, nil
}

func writeIdentity(dir string, id Identity) error {
	b, _ := json.MarshalIndent(id, "", "  ")
	return writeFileAtomic(filepath.Join(dir, IdentityFile), append(b, '\n'), 0o600)
}

// InitConfig is what `mesh init` is given.
type InitConfig struct {
	DataDir  string
	Name     string
	Address  string
	Port     int
	Domain   string
	LogStore string
	// Voters is how many nodes vote in Raft (the first ones to join); 3 by default.
	Voters int
	// Overlay is the mesh's overlay prefix (default state.DefaultOverlay)
	// or state.OverlayOff; OverlayPort this node's WireGuard UDP port.
	Overlay     string
	OverlayPort int
	Now         func() time.Time
}

// Init creates a new mesh whose first node is this data dir: it bootstraps
// Raft, commits the init command and stops. Nothing is left half-made: on
// failure the data dir is removed if Init created it.
func Init(ctx context.Context, cfg InitConfig) (err error) {
	if !nodeNameRE.MatchString(cfg.Name) {
		return fmt.Errorf("node name %q is not a DNS label; use lower-case letters, digits and '-'", cfg.Name)
	}
	addr, perr := netip.ParseAddr(cfg.Address)
	if perr != nil {
		return fmt.Errorf("--address %q is not an IP address (the address other nodes reach this one at)", cfg.Address)
	}
	if cfg.Port <= 0 || cfg.Port > 65535 {
		return fmt.Errorf("--port %d is not a port", cfg.Port)
	}
	if cfg.Domain == "" {
		cfg.Domain = state.DefaultDomain
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Overlay == "" {
		cfg.Overlay = state.DefaultOverlay
	}
	if cfg.Overlay != state.OverlayOff {
		if _, err := state.ParseOverlay(cfg.Overlay); err != nil {
			return fmt.Errorf("--overlay: %w", err)
		}
	}
	if cfg.OverlayPort == 0 {
		cfg.OverlayPort = state.DefaultOverlayPort
	}
	if id, rerr := ReadIdentity(cfg.DataDir); rerr == nil {
		return fmt.Errorf("data dir %s already holds node %q of mesh %s; use another --data-dir, or remove it to start over", cfg.DataDir, id.Name, id.MeshID)
	}
	finish, err := prepareDir(cfg.DataDir, "init")
	if err != nil {
		return err
	}
	defer func() { finish(err) }()
	meshID := make([]byte, 8)
	rand.Read(meshID)
	id := Identity{Name: cfg.Name, Address: addr.String(), Port: cfg.Port, MeshID: hex.EncodeToString(meshID), LogStore: cfg.LogStore}
	if id.LogStore == "" {
		id.LogStore = DefaultLogStore
	}
	ca, err := NewCA(id.MeshID)
	if err != nil {
		return fmt.Errorf("create the mesh CA: %w", err)
	}
	keyPEM, csrPEM, err := NewKey(cfg.Name, addr.String())
	if err != nil {
		return err
	}
	certPEM, err := ca.Sign(csrPEM, cfg.Name, addr.String())
	if err != nil {
		return err
	}
	if err := writeIdentityFiles(cfg.DataDir, ca.CertPEM, certPEM, keyPEM); err != nil {
		return err
	}
	if cfg.Voters <= 0 {
		cfg.Voters = 3
	}
	store, err := state.Open(filepath.Join(cfg.DataDir, StateFile))
	if err != nil {
		return err
	}
	defer store.Close()
	n, err := New(Config{
		Dir: filepath.Join(cfg.DataDir, RaftDir), ID: cfg.Name,
		Bind:      net.JoinHostPort(bindHost(addr), strconv.Itoa(cfg.Port)),
		Advertise: net.JoinHostPort(addr.String(), strconv.Itoa(cfg.Port)),
		LogStore:  id.LogStore, TLSDir: cfg.DataDir,
	}, store)
	if err != nil {
		return err
	}
	defer n.Shutdown()
	if err := n.Bootstrap(); err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if err := n.WaitLeader(wctx); err != nil {
		return err
	}
	for n.State() != "Leader" {
		select {
		case <-wctx.Done():
			return fmt.Errorf("this node did not become leader of its new mesh: %w", wctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
	// The CA key and the join secret are sealed to the first node, the
	// only voter yet; each voter that joins is sealed in by a voter.
	sk := n.Seal()
	me := []string{sk.Recipient()}
	sealedKey, err := n.SealToVoters(string(ca.KeyPEM), me)
	if err != nil {
		return err
	}
	sealedSecret, err := n.SealToVoters(seal.NewSecret(), me)
	if err != nil {
		return err
	}
	first := state.Node{Name: cfg.Name, Address: addr.String(), Voter: true, Port: cfg.Port, SealKey: sk.Recipient()}
	id.Overlay = cfg.Overlay
	if cfg.Overlay != state.OverlayOff {
		wk, err := wgkey.LoadOrCreate(cfg.DataDir)
		if err != nil {
			return err
		}
		first.OverlayKey, first.OverlayEndpoint = wk.Public(), netip.AddrPortFrom(addr, uint16(cfg.OverlayPort)).String()
		id.OverlayPort = cfg.OverlayPort
	}
	c := state.NewCommand(&state.InitRequest{MeshID: id.MeshID, Domain: cfg.Domain, Node: first, Overlay: cfg.Overlay,
		CACert: string(ca.CertPEM), SealedCAKey: sealedKey, SealedJoinSecret: sealedSecret, Voters: cfg.Voters})
	c.Time = cfg.Now().UTC()
	if _, err := n.Apply(wctx, c); err != nil {
		return err
	}
	if me, err := store.Node(wctx, cfg.Name); err == nil {
		id.OverlayAddress = me.OverlayAddress
	}
	return writeIdentity(cfg.DataDir, id)
}

// prepareDir checks that a data dir is new or empty, creates it (0700),
// takes its lock and tightens a dir made beforehand with wider modes. finish
// releases the lock and, when the work failed, removes the dir if it made it:
// nothing is left half-made.
func prepareDir(dir, what string) (finish func(error), err error) {
	created := false
	if _, serr := os.Stat(dir); errors.Is(serr, os.ErrNotExist) {
		created = true
	} else if entries, _ := os.ReadDir(dir); len(entries) > 1 || len(entries) == 1 && entries[0].Name() != LockFile {
		return nil, fmt.Errorf("data dir %s is not empty and holds no mesh node; give an empty or new --data-dir", dir)
	}
	unlock, err := Lock(dir, what)
	if err != nil {
		return nil, err
	}
	finish = func(err error) {
		if err != nil && created {
			os.RemoveAll(dir)
		}
		unlock()
	}
	if err := Tighten(dir); err != nil {
		finish(err)
		return nil, err
	}
	return finish, nil
}

// bindHost is the host the transport binds: the node's address, since that is
// the one peers dial.
func bindHost(a netip.Addr) string { return a.String() }

// JoinConfig is what `mesh join` is given.
type JoinConfig struct {
	DataDir string
	// Peer is ADDRESS[:PORT] of any node of the mesh.
	Peer     string
	Token    string
	Name     string
	Address  string
	Port     int
	LogStore string
	// OverlayPort is this node's WireGuard UDP port.
	OverlayPort int
	// Replace takes the place of a node of that name that has run.
	Replace bool
	// Note, if set, hears what the join waits for (a change of leader).
	Note func(string)
}

// joinWait bounds how long a join goes on starting attempts while the mesh
// has no leader; the last may take joinClient's 30 s more, within the 2
// minutes `mesh join` gives it (a variable for tests).
var joinWait = 45 * time.Second

// joinThroughElections is joinClient, tried again while the mesh has no
// leader or changes leader under the join (a commit the leader lost, a
// leader that stepped down before it added the node to Raft): the leader
// admits the same request (name, address, key) again as the same node,
// so a join that was half applied completes instead of leaving the operator
// an error that says it may or may not have been. Any other error ends it.
func joinThroughElections(ctx context.Context, note func(string), peer string, tok Token, req JoinRequest) (JoinReply, error) {
	start, wait := time.Now(), 250*time.Millisecond
	for try := 1; ; try++ {
		rep, err := joinClient(ctx, peer, tok, req)
		if err == nil || !errors.Is(err, ErrNoLeader) {
			return rep, err
		}
		if time.Since(start)+wait > joinWait {
			return rep, fmt.Errorf("%w (tried %d times over %s; the mesh's voters may be down: mesh status on one of them shows)", err, try, time.Since(start).Round(time.Second))
		}
		if note != nil {
			note(fmt.Sprintf("the mesh has no leader for the moment (an election, or a leader that stepped down under the join); trying the same join again (attempt %d)", try+1))
		}
		select {
		case <-ctx.Done():
			return rep, fmt.Errorf("%w (tried %d times)", err, try)
		case <-time.After(wait):
		}
		wait = min(2*wait, 2*time.Second)
	}
}

// Join admits this data dir into an existing mesh: it proves the token to a
// node of the mesh (whose CA the token pins), gets a certificate for a CSR,
// and prepares the data dir. `mesh agent` then runs it as a replica.
func Join(ctx context.Context, cfg JoinConfig) (err error) {
	tok, err := ParseToken(cfg.Token)
	if err != nil {
		return err
	}
	if !nodeNameRE.MatchString(cfg.Name) {
		return fmt.Errorf("node name %q is not a DNS label; use lower-case letters, digits and '-'", cfg.Name)
	}
	addr, perr := netip.ParseAddr(cfg.Address)
	if perr != nil {
		return fmt.Errorf("--address %q is not an IP address (the address other nodes reach this one at)", cfg.Address)
	}
	if id, rerr := ReadIdentity(cfg.DataDir); rerr == nil {
		if id.MeshID != tok.MeshID {
			return fmt.Errorf("data dir %s belongs to mesh %s (node %q), not to mesh %s of this token; meshes are never merged: use another --data-dir", cfg.DataDir, id.MeshID, id.Name, tok.MeshID)
		}
		return fmt.Errorf("data dir %s already holds node %q of this mesh; start it with `mesh agent`", cfg.DataDir, id.Name)
	}
	finish, err := prepareDir(cfg.DataDir, "join")
	if err != nil {
		return err
	}
	defer func() { finish(err) }()
	peer := cfg.Peer
	if _, _, serr := net.SplitHostPort(peer); serr != nil {
		peer = net.JoinHostPort(peer, strconv.Itoa(DefaultPort))
	}
	keyPEM, csrPEM, err := NewKey(cfg.Name, addr.String())
	if err != nil {
		return err
	}
	sk, err := seal.LoadOrCreate(cfg.DataDir)
	if err != nil {
		return err
	}
	if cfg.OverlayPort == 0 {
		cfg.OverlayPort = state.DefaultOverlayPort
	}
	wk, err := wgkey.LoadOrCreate(cfg.DataDir)
	if err != nil {
		return err
	}
	rep, err := joinThroughElections(ctx, cfg.Note, peer, tok, JoinRequest{MeshID: tok.MeshID, Secret: tok.Secret, Name: cfg.Name, Address: addr.String(), Port: cfg.Port, CSR: string(csrPEM), SealKey: sk.Recipient(), Commands: state.CommandVersion, Replace: cfg.Replace, Until: tok.Until,
		OverlayKey: wk.Public(), OverlayEndpoint: netip.AddrPortFrom(addr, uint16(cfg.OverlayPort)).String()})
	if err != nil {
		return fmt.Errorf("join through %s: %w", peer, err)
	}
	if err := os.MkdirAll(filepath.Join(cfg.DataDir, RaftDir), 0o700); err != nil {
		return fmt.Errorf("create data dir: %w", err)
	}
	if err := writeIdentityFiles(cfg.DataDir, []byte(rep.CA), []byte(rep.Cert), keyPEM); err != nil {
		return err
	}
	logStore := cfg.LogStore
	if logStore == "" {
		logStore = DefaultLogStore
	}
	id := Identity{Name: cfg.Name, Address: addr.String(), Port: cfg.Port, MeshID: rep.MeshID, LogStore: logStore, Overlay: rep.Overlay, OverlayAddress: rep.OverlayAddress, Vouch: rep.Voters}
	if rep.Overlay == state.OverlayOff {
		os.Remove(filepath.Join(cfg.DataDir, wgkey.File)) // never used
	} else {
		id.OverlayPort = cfg.OverlayPort
	}
	return writeIdentity(cfg.DataDir, id)
}
