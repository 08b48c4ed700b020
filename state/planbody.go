package state

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"sync"

	"github.com/klauspost/compress/flate"
)

// How state.db keeps a plan's body (issue "scale", item 4). A plan version
// is a node's whole plan, and the history keeps 100 of them per node: at
// 1,000 modules over 100 nodes, 20,000 commands left 169 MB of state.db,
// 40 times the fleet's state without its history (bench/statesize.sh). A
// version differs little from the one before and its JSON repeats itself,
// so each body is kept deflated: packedPlan ('z') and the raw DEFLATE
// stream, 12 times smaller at 100 resources. A body that starts with '{'
// is plain JSON (what earlier binaries wrote). A snapshot carries a packed
// body as 'z' and the stream in base64 (inflated, the history of a fleet
// of 10,000 modules would be a snapshot of gigabytes, in memory while it
// is written), a plain one as it is; a restore packs plain ones. Schema
// version 19 says that bodies may be packed, so that an older binary
// refuses this state.db, and a newer node's snapshot, rather than fail to
// read a plan.
const packedPlan = 'z'

// maxPlanBody bounds what unpackPlan inflates: a damaged row must not take
// the node's memory. A plan of 10,000 resources is about 14 MB. (A var for
// the test of the bound.)
var maxPlanBody = 64 << 20

// The deflater is klauspost/compress's, not the standard library's: its
// level 1 deflates a plan of 100 modules (164 kB) in about half the time
// (0.28-0.31 against 0.54-0.57 ms on the machine of 2026-12-05), into 4 %
// fewer bytes (BenchmarkPlanDeflaters); at 10,000 modules the standard one
// took a seventh of an assign. Its stream is plain DEFLATE, which any
// inflater reads (an older binary's too: TestPlanBodyPacking).
var planWriters = sync.Pool{New: func() any {
	w, _ := flate.NewWriter(nil, flate.BestSpeed)
	return w
}}

// packPlan is how a plan's JSON is stored.
func packPlan[T string | []byte](body T) []byte {
	return packWith(func(w io.Writer) {
		w.Write([]byte(body)) // no copy for a []byte
	}, len(body))
}

// packWith is packPlan of what write writes (size bytes, if known).
func packWith(write func(io.Writer), size int) []byte {
	var b bytes.Buffer
	b.Grow(size/8 + 64)
	b.WriteByte(packedPlan)
	w := planWriters.Get().(*flate.Writer)
	w.Reset(&b)
	// Writes to a bytes.Buffer do not fail.
	write(w)
	w.Close()
	planWriters.Put(w)
	return b.Bytes()
}

// unpackPlan is a stored body's JSON.
func unpackPlan(stored []byte) ([]byte, error) {
	if len(stored) == 0 || stored[0] != packedPlan {
		return stored, nil
	}
	r := flate.NewReader(bytes.NewReader(stored[1:]))
	defer r.Close()
	out, err := io.ReadAll(io.LimitReader(r, int64(maxPlanBody)+1))
	if err != nil {
		return nil, fmt.Errorf("the stored plan is damaged: %w", err)
	}
	if len(out) > maxPlanBody {
		return nil, fmt.Errorf("the stored plan inflates past %d MB: damaged", maxPlanBody>>20)
	}
	return out, nil
}

// resourceCount is how many resources a stored plan holds.
func resourceCount(stored []byte) (int, error) {
	body, err := unpackPlan(stored)
	if err != nil {
		return 0, err
	}
	var p struct {
		Resources []json.RawMessage `json:"resources"`
	}
	if err := json.Unmarshal(body, &p); err != nil {
		return 0, fmt.Errorf("the stored plan is damaged: %w", err)
	}
	return len(p.Resources), nil
}

// snapshotPlan is a stored body as a snapshot carries it.
func snapshotPlan(stored []byte) string {
	if len(stored) > 0 && stored[0] == packedPlan {
		return string(packedPlan) + base64.StdEncoding.EncodeToString(stored[1:])
	}
	return string(stored)
}

// restoredPlan is a snapshot's body as state.db keeps it: packed.
func restoredPlan(b string) ([]byte, error) {
	if rest, ok := strings.CutPrefix(b, string(packedPlan)); ok {
		raw, err := base64.StdEncoding.DecodeString(rest)
		if err != nil {
			return nil, fmt.Errorf("a packed body that is not base64: %w", err)
		}
		return append([]byte{packedPlan}, raw...), nil
	}
	if !strings.HasPrefix(b, "{") {
		return nil, fmt.Errorf("a body that is neither JSON nor packed (%.20q)", b)
	}
	return packPlan(b), nil
}
