package agent

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
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

// filesystemOf is the filesystem of p (its device) and the space left
// there for an unprivileged writer: where a move's copy or a restore is
// written, and whether it fits (tests replace it).
var filesystemOf = func(p string) (dev, free uint64, err error) {
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		return 0, 0, err
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(p, &fs); err != nil {
		return 0, 0, err
	}
	return st.Dev, fs.Bavail * uint64(fs.Bsize), nil
}

// roomEvery is how many bytes of a copy's stream TO reads between two
// looks at the free space.
const roomEvery = 64 << 20

// roomFor says, as errNoRoom, when a filesystem a copy of data is written
// on (each directory's parent, which exists) has not the room for the
// directories written there (sizes, by directory, as FROM announced them;
// none: only the floor) and cluster.LowFree more.
func roomFor(node string, data []string, sizes []uint64) error {
	return roomOn(node, data, sizes, "free some space there, or move the module to another node")
}

// roomOn is roomFor for any copy written beside data (a move's, a
// restore's), fix saying what to do when one does not fit.
func roomOn(node string, data []string, sizes []uint64, fix string) error {
	type fsNeed struct {
		dir        string
		need, free uint64
	}
	var order []*fsNeed
	byDev := map[uint64]*fsNeed{}
	for i, d := range data {
		dir := filepath.Dir(d)
		dev, free, err := filesystemOf(dir)
		if err != nil {
			return fmt.Errorf("the free space of %s: %w", dir, err)
		}
		f := byDev[dev]
		if f == nil {
			f = &fsNeed{dir: dir, free: free}
			byDev[dev] = f
			order = append(order, f)
		}
		if i < len(sizes) {
			f.need = addSat(f.need, sizes[i])
		}
	}
	for _, f := range order {
		if f.free < addSat(f.need, cluster.LowFree) {
			what := "a copy of what is left"
			if f.need > 0 {
				what = "a copy of " + size(int64(min(f.need, 1<<62)))
			}
			return fmt.Errorf("%w on %s: the filesystem of %s has %s free, and %s would leave it under the %s the node keeps free; %s",
				errNoRoom, node, f.dir, size(int64(min(f.free, 1<<62))), what, size(int64(cluster.LowFree)), fix)
		}
	}
	return nil
}

// addSat is a+b, at most the largest uint64 (an announced size is the
// sender's word).
func addSat(a, b uint64) uint64 {
	if a+b < a {
		return ^uint64(0)
	}
	return a + b
}

// dataSizes is the space each of data's directories' files take on FROM
// (allocated blocks, so a sparse file counts what it holds; a file of
// several hard links once a directory, as the copy writes it): an
// estimate for TO's first look. It follows no link; what it cannot read
// it leaves out.
func dataSizes(data []string) []uint64 {
	type inode struct{ dev, ino uint64 }
	out := make([]uint64, len(data))
	for i, d := range data {
		seen := map[inode]bool{}
		filepath.WalkDir(d, func(p string, e fs.DirEntry, err error) error {
			if err != nil || !e.Type().IsRegular() {
				return nil
			}
			fi, err := e.Info()
			if err != nil {
				return nil
			}
			st, ok := fi.Sys().(*syscall.Stat_t)
			if !ok {
				return nil
			}
			if st.Nlink > 1 {
				k := inode{uint64(st.Dev), st.Ino}
				if seen[k] {
					return nil
				}
				seen[k] = true
			}
			out[i] = addSat(out[i], uint64(st.Blocks)*512)
			return nil
		})
	}
	return out
}

// sizesParam is sizes as a query's value, and parseSizes its reading: one
// per directory, or none (an announce that does not name every directory
// is not used).
func sizesParam(sizes []uint64) string {
	var b strings.Builder
	for i, n := range sizes {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.FormatUint(n, 10))
	}
	return b.String()
}

func parseSizes(v string, dirs int) []uint64 {
	parts := strings.Split(v, ",")
	if v == "" || len(parts) != dirs {
		return nil
	}
	out := make([]uint64, dirs)
	for i, p := range parts {
		n, err := strconv.ParseUint(p, 10, 64)
		if err != nil {
			return nil
		}
		out[i] = n
	}
	return out
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
		if rerr := roomFor(g.node, g.data, nil); errors.Is(rerr, errNoRoom) {
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
