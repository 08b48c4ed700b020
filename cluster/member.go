package cluster

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"mesh/internal/safefs"
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
	loops  sync.WaitGroup
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
	// A kill -9 in a write of the node's own files (a key, a
	// certificate, the ledger) left its temp file, which holds what was
	// being written; with the lock held, no write of ours is under way.
	if removed, err := safefs.SweepTemps(cfg.DataDir); err != nil {
		log.Warn("could not remove the temp files of writes cut short", "err", err)
	} else if len(removed) > 0 {
		log.Info("removed the temp files of writes cut short", "files", removed)
	}
	store, err := state.Open(filepath.Join(cfg.DataDir, StateFile))
	if err != nil {
		return nil, err
	}
	// node.json's name is the one the node's certificate was issued for: a
	// name edited there would run a Raft follower that never finds its
	// place (and peers would refuse its certificate for it).
	if b, err := os.ReadFile(filepath.Join(cfg.DataDir, CertFile)); err == nil {
		if blk, _ := pem.Decode(b); blk != nil {
			if c, err := x509.ParseCertificate(blk.Bytes); err == nil && c.Subject.CommonName != id.Name {
				store.Close()
				return nil, fmt.Errorf("%w: %s names this node %q, but its certificate (%s) is for %q: put the name %q back in node.json (a node is renamed by removing it and joining again)",
					ErrDamaged, filepath.Join(cfg.DataDir, IdentityFile), id.Name, CertFile, c.Subject.CommonName, c.Subject.CommonName)
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
		Vouch: id.Vouch,
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
	m.loop(func() {
		wctx, cancel := context.WithTimeout(lctx, 15*time.Second)
		defer cancel()
		if err := n.WaitLeader(wctx); err != nil && lctx.Err() == nil {
			log.Warn("no raft leader yet; writes fail until one is elected", "err", err)
		}
	})
	m.loop(func() { n.EnsureVoter(lctx) })
	m.loop(func() { n.probe(lctx) })
	m.loop(func() { n.repairMembership(lctx) })
	m.loop(func() { n.keepTrust(lctx) })
	m.loop(func() { n.keepCertificate(lctx) })
	m.loop(func() { n.keepCA(lctx) })
	floor, low := MinFree, LowFree // as they are now (tests change them)
	m.loop(func() { n.watchDisk(lctx, floor, low) })
	log.Info("raft running", "data_dir", cfg.DataDir, "raft", n.Addr(), "state", n.State())
	return m, nil
}

// loop runs f until Stop, which waits for it.
func (m *Member) loop(f func()) {
	m.loops.Add(1)
	go func() {
		defer m.loops.Done()
		f()
	}()
}

// stopWait bounds how long Stop waits for the loops to see it.
const stopWait = 15 * time.Second

// Stop shuts Raft and the replica down and releases the data dir. The
// loops end before the replica closes: one still reading it would open the
// database again behind the close (its -wal file made anew in a data dir
// being removed).
func (m *Member) Stop() error {
	m.stop()
	err := m.Node.Shutdown() // what a loop waits on in Raft returns
	done := make(chan struct{})
	go func() { m.loops.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(stopWait):
		m.log.Warn("a membership loop did not end; closing the replica under it", "waited", stopWait)
	}
	m.Store.Close()
	m.unlock()
	return err
}
