package cluster

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"strconv"
	"time"

	"mesh/state"
)

// AgentConfig is what `mesh agent` runs with.
type AgentConfig struct {
	DataDir string
	Logger  *slog.Logger
	// Version is this binary's version, shown in every node's status.
	Version string
}

// Agent is a running node: its replica, Raft and local API.
type Agent struct {
	ID    Identity
	Store *state.Store
	Node  *Node
	API   *API
	log   *slog.Logger

	stopVoter context.CancelFunc
	unlock    func()
}

// StartAgent opens the data dir and starts Raft and the local API. It returns
// once the API socket is listening; Stop ends it.
func StartAgent(ctx context.Context, cfg AgentConfig) (_ *Agent, err error) {
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
	a := &Agent{ID: id, Store: store, Node: n, log: log, unlock: unlock}
	a.API = NewAPI(n, store, id, log)
	sock := filepath.Join(cfg.DataDir, SocketFile)
	errc := make(chan error, 1)
	go func() { errc <- a.API.Serve(sock) }()
	// Wait until the socket answers, or Serve fails.
	deadline := time.Now().Add(10 * time.Second)
	for {
		select {
		case err := <-errc:
			n.Shutdown()
			store.Close()
			return nil, err
		default:
		}
		if c, err := net.DialTimeout("unix", sock, 100*time.Millisecond); err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			n.Shutdown()
			store.Close()
			return nil, fmt.Errorf("local API did not come up on %s", sock)
		}
		time.Sleep(20 * time.Millisecond)
	}
	wctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if err := n.WaitLeader(wctx); err != nil {
		log.Warn("no raft leader yet; writes fail until one is elected", "err", err)
	}
	vctx, vcancel := context.WithCancel(context.Background())
	a.stopVoter = vcancel
	go n.EnsureVoter(vctx)
	go n.probe(vctx)
	go n.repairMembership(vctx)
	log.Info("agent ready", "data_dir", cfg.DataDir, "raft", n.Addr(), "state", n.State())
	return a, nil
}

// Stop shuts the API, Raft and the replica down.
func (a *Agent) Stop() error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	a.stopVoter()
	a.API.Shutdown(ctx)
	err := a.Node.Shutdown()
	a.Store.Close()
	a.unlock()
	return err
}
