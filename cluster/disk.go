package cluster

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hashicorp/raft"
	"golang.org/x/sys/unix"
)

// MinFree is the free space a node wants in its data dir before it proposes
// or commits a write: below it, writes are refused with "disk full on NODE"
// while reads and the resolver keep answering, and they work again by
// themselves once space returns.
var MinFree uint64 = 32 << 20

// LowFree is when a node's data dir counts as short of space: status and
// the log warn from it, well before MinFree stops writes.
var LowFree uint64 = 1 << 30

// ErrDiskFull: the node's data dir has too little space for a write.
var ErrDiskFull = errors.New("disk full")

// Free is the space left in this node's data dir.
func (n *Node) Free() uint64 { return freeBytes(n.cfg.Dir) }

// watchDisk keeps a leader whose data dir is short of space from stopping
// the mesh's writes: below MinFree it hands the leadership to a voter that
// has room (Raft picks the most up to date), so the others keep writing
// while this node says it is short. It looks every few seconds, against the
// floor and the warning it is given (MinFree and LowFree when it started).
func (n *Node) watchDisk(ctx context.Context, floor, low uint64) {
	t := time.NewTicker(3 * time.Second)
	defer t.Stop()
	warned, failed := false, false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		free := freeBytes(n.cfg.Dir)
		if free < low && !warned {
			n.log.Warn("the data dir is short of space: writes stop below the floor", "free_mib", free>>20, "floor_mib", floor>>20, "dir", n.cfg.Dir)
		}
		warned = free < low
		if free >= floor || floor == 0 || n.raft.State() != raft.Leader {
			continue
		}
		if err := n.raft.LeadershipTransfer().Error(); err != nil {
			if !failed {
				n.log.Warn("the data dir is full and the leadership could not be handed over (no other voter takes it); writes wait for space", "err", err)
			}
			failed = true
			continue
		}
		failed = false
		n.log.Warn("the data dir is full: handed the leadership over, so the others keep writing", "free_mib", free>>20)
	}
}

// checkDisk refuses a write when this node's data dir is (nearly) full.
func (n *Node) checkDisk() error {
	free := freeBytes(n.cfg.Dir)
	if free < MinFree && MinFree > 0 {
		return fmt.Errorf("%w on %s: %s has %d MiB free, under the %d MiB a write needs; free some space there (writes and applying resume by themselves; reads and names keep answering)",
			ErrDiskFull, n.cfg.ID, n.cfg.Dir, free>>20, MinFree>>20)
	}
	return nil
}

// freeBytes is the space left for an unprivileged writer in dir.
func freeBytes(dir string) uint64 {
	var st unix.Statfs_t
	if unix.Statfs(dir, &st) != nil {
		return 0
	}
	return st.Bavail * uint64(st.Bsize)
}
