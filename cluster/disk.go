package cluster

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// MinFree is the free space a node wants in its data dir before it proposes
// or commits a write: below it, writes are refused with "disk full on NODE"
// while reads and the resolver keep answering, and they work again by
// themselves once space returns.
var MinFree uint64 = 32 << 20

// ErrDiskFull: the node's data dir has too little space for a write.
var ErrDiskFull = errors.New("disk full")

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
