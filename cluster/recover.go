package cluster

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"strconv"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"

	"mesh/state"
)

// RecoverResult says what mesh recover did and what is left to do.
type RecoverResult struct {
	Node   string
	MeshID string
	// Lost are the voters that were dropped from the Raft configuration.
	Lost []string
	// Others are the other nodes still in the state (to remove or rejoin).
	Others []string
}

// Recover makes this data dir's node the only voter of its mesh, keeping its
// state, CA and names: for when the majority of voters is gone for good
// (Consul's peers.json, etcd's --force-new-cluster). The agent must be
// stopped (the data dir's lock says so). The Raft log is replayed into the
// replica first, so nothing this node had committed is lost.
func Recover(ctx context.Context, dataDir string) (RecoverResult, error) {
	var res RecoverResult
	id, err := ReadIdentity(dataDir)
	if err != nil {
		return res, err
	}
	unlock, err := Lock(dataDir, "recover")
	if err != nil {
		return res, fmt.Errorf("%w (stop the agent first: mesh recover works on a stopped node)", err)
	}
	defer unlock()
	store, err := state.Open(filepath.Join(dataDir, StateFile))
	if err != nil {
		return res, err
	}
	defer store.Close()
	dir := filepath.Join(dataDir, RaftDir)
	logs, stable, closer, err := openLogStore(id.LogStore, dir)
	if err != nil {
		return res, err
	}
	defer closer.Close()
	hl := hclog.New(&hclog.LoggerOptions{Name: "raft", Level: hclog.Warn, Output: io.Discard})
	snaps, err := raft.NewFileSnapshotStoreWithLogger(filepath.Join(dir, "snapshots"), 3, hl)
	if err != nil {
		return res, fmt.Errorf("open snapshot store: %w", err)
	}
	// What Raft had as its configuration, to say who is dropped.
	if last, err := logs.LastIndex(); err == nil {
		for i := last; i > 0; i-- {
			var l raft.Log
			if logs.GetLog(i, &l) != nil {
				break
			}
			if l.Type == raft.LogConfiguration {
				for _, s := range raft.DecodeConfiguration(l.Data).Servers {
					if string(s.ID) != id.Name && s.Suffrage == raft.Voter {
						res.Lost = append(res.Lost, string(s.ID))
					}
				}
				break
			}
		}
	}
	addr := net.JoinHostPort(id.Address, strconv.Itoa(id.Port))
	_, trans := raft.NewInmemTransport(raft.ServerAddress(addr))
	rc := raft.DefaultConfig()
	rc.LocalID = raft.ServerID(id.Name)
	rc.Logger = hl
	conf := raft.Configuration{Servers: []raft.Server{{Suffrage: raft.Voter, ID: raft.ServerID(id.Name), Address: raft.ServerAddress(addr)}}}
	if err := raft.RecoverCluster(rc, &fsm{store: store, log: slog.New(slog.NewTextHandler(io.Discard, nil))}, logs, stable, snaps, trans, conf); err != nil {
		return res, fmt.Errorf("recover raft: %w", err)
	}
	st, err := store.Settings(ctx)
	if err != nil {
		return res, err
	}
	nodes, err := store.Nodes(ctx)
	if err != nil {
		return res, err
	}
	for _, n := range nodes {
		if n.Name != id.Name {
			res.Others = append(res.Others, n.Name)
		}
	}
	res.Node, res.MeshID = id.Name, st.MeshID
	return res, nil
}
