package cluster

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"mesh/state"
)

// MemberConfig is what a node's membership of the mesh starts from.
type MemberConfig struct {
	DataDir string
	Logger  *slog.Logger
	// Version is this binary's version, shown in every node's status.
	Version string
}

// Member is this node's part of the mesh: its identity, its replica and its
// Raft node, with the loops that keep membership healthy. It serves nothing
// locally; the composition root (`mesh agent`) adds the resolver, the
// reconciler and the local API around it.
type Member struct {
	ID    Identity
	Store *state.Store
	Node  *Node
	log   *slog.Logger

	stop   context.CancelFunc
	unlock func()
}

// StartMember locks the data dir, opens the replica and starts Raft. It
// returns once Raft runs, without waiting for a leader; Stop ends it.
func StartMember(cfg MemberConfig) (_ *Member, err error) {
	id, err := ReadIdentity(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	// Before anything opens a store: one process per data dir.
	unlock, err := Lock(cfg.DataDir, "agent")
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			unlock()
		}
	}()
	if err := Tighten(cfg.DataDir); err != nil {
		return nil, err
	}
	log := cfg.Logger.With("node", id.Name)
	store, err := state.Open(filepath.Join(cfg.DataDir, StateFile))
	if err != nil {
		return nil, err
	}
	// A replica that holds nodes but not this one: the node was removed, or
	// node.json's name was changed; Raft would run it as a follower that
	// never finds its place.
	if applied, err := store.AppliedIndex(); err == nil && applied > 0 {
		if nodes, err := store.Nodes(context.Background()); err == nil && len(nodes) > 0 {
			found := false
			var names []string
			for _, n := range nodes {
				found = found || n.Name == id.Name
				names = append(names, n.Name)
			}
			if !found {
				store.Close()
				return nil, fmt.Errorf("%w: %s names this node %q, but its replica (applied up to index %d) holds no node of that name (its nodes: %s): if node.json was edited, put the name back; if the node was removed from the mesh, move this data dir aside and mesh join again",
					ErrDamaged, filepath.Join(cfg.DataDir, IdentityFile), id.Name, applied, strings.Join(names, ", "))
			}
		}
	}
	store.OnDiskFull = func(index uint64) {
		log.Error("the disk is full: applying waits for space (reads and the resolver keep answering from what is applied)", "index", index, "data_dir", cfg.DataDir)
	}
	n, err := New(Config{
		Dir: filepath.Join(cfg.DataDir, RaftDir), ID: id.Name,
		Bind:      net.JoinHostPort(id.Address, strconv.Itoa(id.Port)),
		Advertise: net.JoinHostPort(id.Address, strconv.Itoa(id.Port)),
		LogStore:  id.LogStore, TLSDir: cfg.DataDir, Logger: log, Version: cfg.Version,
	}, store)
	if err != nil {
		store.Close()
		return nil, err
	}
	m := &Member{ID: id, Store: store, Node: n, log: log, unlock: unlock}
	lctx, stop := context.WithCancel(context.Background())
	m.stop = stop
	// Reads, status and the resolver answer without a leader; say so if
	// none comes, without holding the rest of the agent back.
	go func() {
		wctx, cancel := context.WithTimeout(lctx, 15*time.Second)
		defer cancel()
		if err := n.WaitLeader(wctx); err != nil && lctx.Err() == nil {
			log.Warn("no raft leader yet; writes fail until one is elected", "err", err)
		}
	}()
	go n.EnsureVoter(lctx)
	go n.probe(lctx)
	go n.repairMembership(lctx)
	go n.keepCertificate(lctx)
	go n.watchDisk(lctx, MinFree, LowFree)
	log.Info("raft running", "data_dir", cfg.DataDir, "raft", n.Addr(), "state", n.State())
	return m, nil
}

// Stop shuts Raft and the replica down and releases the data dir.
func (m *Member) Stop() error {
	m.stop()
	err := m.Node.Shutdown()
	m.Store.Close()
	m.unlock()
	return err
}
