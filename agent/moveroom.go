package agent

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path/filepath"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"mesh/cluster"
)

// A move's copy and TO's disk. The copy is written beside each data
// directory, on its filesystem, which is often the one that holds the
// node's own state and the other modules' data: a copy larger than what
// is free filled it, and Raft, the ledger and every module there failed
// with it. So TO refuses a copy that would leave that filesystem under
// cluster.LowFree (where the node counts as short of space) before it
// writes anything, by the size FROM announces, and stops one that takes
// it under that while it is written (FROM's announce is an estimate, and
// others write there too). Either way FROM aborts the move at once: a try
// again would fill the disk again.

// errNoRoom: TO has not the room for a copy.
var errNoRoom = errors.New("not enough room for the copy")

// moveFree is the space left for an unprivileged writer on the
// filesystem of p (tests replace it).
var moveFree = func(p string) (uint64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(p, &st); err != nil {
		return 0, err
	}
	return st.Bavail * uint64(st.Bsize), nil
}

// roomEvery is how many bytes of a copy's stream TO reads between two
// looks at the free space.
const roomEvery = 64 << 20

// roomFor says, as errNoRoom, when a filesystem a copy of data is written
// on (each directory's parent, which exists) has not need bytes free and
// cluster.LowFree more.
func roomFor(node string, data []string, need uint64) error {
	for _, d := range data {
		dir := filepath.Dir(d)
		free, err := moveFree(dir)
		if err != nil {
			return fmt.Errorf("the free space of %s: %w", dir, err)
		}
		if free < need+cluster.LowFree {
			what := "a copy of what is left"
			if need > 0 {
				what = "a copy of " + size(int64(need))
			}
			return fmt.Errorf("%w on %s: the filesystem of %s has %s free, and %s would leave it under the %s the node keeps free; free some space there, or move the module to another node",
				errNoRoom, node, dir, size(int64(free)), what, size(int64(cluster.LowFree)))
		}
	}
	return nil
}

// dataSize is the space data's files take on FROM (allocated blocks, so
// a sparse file counts what it holds): an estimate for TO's first look.
// It follows no link; what it cannot read it leaves out.
func dataSize(data []string) uint64 {
	var n uint64
	for _, d := range data {
		filepath.WalkDir(d, func(p string, e fs.DirEntry, err error) error {
			if err != nil || !e.Type().IsRegular() {
				return nil
			}
			if fi, err := e.Info(); err == nil {
				if st, ok := fi.Sys().(*syscall.Stat_t); ok {
					n += uint64(st.Blocks) * 512
				}
			}
			return nil
		})
	}
	return n
}

// roomGuard reads a copy's stream and looks at the room left every
// roomEvery bytes: a read fails with err (errNoRoom) once a filesystem is
// under the floor.
type roomGuard struct {
	r          io.Reader
	node       string
	data       []string
	read, next uint64
	mu         sync.Mutex
	err        error
}

func (g *roomGuard) Read(p []byte) (int, error) {
	if err := g.failed(); err != nil {
		return 0, err
	}
	n, err := g.r.Read(p)
	g.read += uint64(n)
	if g.read >= g.next {
		g.next = g.read + roomEvery
		if rerr := roomFor(g.node, g.data, 0); errors.Is(rerr, errNoRoom) {
			g.mu.Lock()
			g.err = rerr
			g.mu.Unlock()
			return n, rerr
		}
	}
	return n, err
}

// failed is the room's error, once a look found too little.
func (g *roomGuard) failed() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.err
}
