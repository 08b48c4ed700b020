package operate

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"time"

	"mesh/cluster/api"
	"mesh/podman"
)

// perSource is how many lines the merge holds per source: with MaxLogLine
// a bound of a few MiB per stream, whatever the containers write.
const perSource = 16

// quiet is how long a followed merge waits for a source that has nothing
// before it shows the others' lines (lines that arrive later from it may
// then come a little out of order).
const quiet = 250 * time.Millisecond

// repoll is how often a followed container that stopped or went is looked
// for again.
const repoll = 500 * time.Millisecond

// serveLogs is the local API's /v1/logs?target=T[&node=N][&follow=1][&since=][&tail=]:
// the sources first, then their lines merged by time.
func (s *Server) serveLogs(w http.ResponseWriter, r *http.Request) {
	v := r.URL.Query()
	q, err := api.ParseLogQuery(v)
	if err != nil {
		writeError(w, badRequest("%v", err))
		return
	}
	srcs, err := s.sources(r.Context(), v.Get("target"), v.Get("node"), false)
	if err != nil {
		writeError(w, err)
		return
	}
	ctx, cancel := s.streamContext(r.Context())
	defer cancel()
	w.Header().Set("Content-Type", "application/x-ndjson")
	enc := json.NewEncoder(w)
	flush := func() {
		if f, ok := w.(http.Flusher); ok {
			f.Flush()
		}
	}
	if err := enc.Encode(api.Record{Sources: srcs}); err != nil {
		return
	}
	flush()
	chans := make([]<-chan api.Record, len(srcs))
	for i, src := range srcs {
		ch := make(chan api.Record, perSource)
		chans[i] = ch
		go func() {
			defer close(ch)
			emit := func(rec api.Record) error {
				rec.Node, rec.Container = src.Node, src.Container
				select {
				case ch <- rec:
					return nil
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			var err error
			if src.Node == s.Node {
				err = s.nodeLogs(ctx, src, q, emit)
			} else {
				err = s.remoteLogs(ctx, src, q, emit)
			}
			if err != nil && ctx.Err() == nil {
				emit(api.Record{Error: err.Error()})
			}
		}()
	}
	wait := time.Duration(-1)
	if q.Follow {
		wait = quiet
	}
	merge(ctx, chans, wait, func(rec api.Record) error {
		return enc.Encode(rec)
	}, flush)
}

// remoteLogs reads one source from its node's peer API.
func (s *Server) remoteLogs(ctx context.Context, src api.Source, q api.LogQuery, emit func(api.Record) error) error {
	addr := s.Peers.PeerAddr(src.Node)
	if addr == "" {
		return fmt.Errorf("node %s: no address is known for it", src.Node)
	}
	v := url.Values{}
	v.Set("name", src.Container)
	if src.Step {
		v.Set("step", "1")
	}
	q.Values(v)
	// The request is bounded until its answer starts (a node that is down
	// or cut off is named within seconds); the stream after that by ctx.
	hctx, hcancel := context.WithCancel(ctx)
	defer hcancel()
	timer := time.AfterFunc(10*time.Second, hcancel)
	req, err := http.NewRequestWithContext(hctx, http.MethodGet, "https://"+addr+"/v1/op/logs?"+v.Encode(), nil)
	if err != nil {
		return err
	}
	resp, err := s.Peers.StreamClient().Do(req)
	if !timer.Stop() && err == nil {
		resp.Body.Close()
		err = errors.New("no answer within 10s")
	}
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("node %s did not answer (%s): %v", src.Node, addr, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("node %s: %s", src.Node, api.ErrorBody(resp))
	}
	// Without -f the stream ends by itself: a node that sends nothing for
	// idleLimit has stalled (with -f, a quiet container is just quiet).
	var idle *time.Timer
	if !q.Follow {
		idle = time.AfterFunc(idleLimit, hcancel)
		defer idle.Stop()
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), api.MaxRecord)
	for sc.Scan() {
		if idle != nil {
			idle.Reset(idleLimit)
		}
		var rec api.Record
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			return fmt.Errorf("node %s sent a bad record: %v", src.Node, err)
		}
		if err := emit(rec); err != nil {
			return nil
		}
	}
	if ctx.Err() != nil {
		return nil
	}
	if hctx.Err() != nil {
		return fmt.Errorf("node %s sent nothing for %s; its lines after that are not shown", src.Node, idleLimit)
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("node %s: the stream broke: %v", src.Node, err)
	}
	return nil
}

// idleLimit is how long a stream without -f may send nothing.
const idleLimit = 30 * time.Second

// serveNodeLogs is a node's /v1/op/logs?name=N[&step=1]...: one container's
// lines (a step's last run's) as NDJSON.
func (s *Server) serveNodeLogs(w http.ResponseWriter, r *http.Request) {
	v := r.URL.Query()
	q, err := api.ParseLogQuery(v)
	if err != nil {
		writeError(w, badRequest("%v", err))
		return
	}
	src := api.Source{Node: s.Node, Container: v.Get("name"), Step: v.Get("step") == "1"}
	if src.Container == "" {
		writeError(w, badRequest("name a container"))
		return
	}
	if err := s.planHolds(r.Context(), src.Container, src.Step); err != nil {
		writeError(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	f, _ := w.(http.Flusher)
	if f != nil {
		f.Flush() // the caller knows at once that this node answers
	}
	enc := json.NewEncoder(w)
	ctx, cancel := s.streamContext(r.Context())
	defer cancel()
	err = s.nodeLogs(ctx, src, q, func(rec api.Record) error {
		if err := enc.Encode(rec); err != nil {
			return err
		}
		if f != nil && q.Follow {
			f.Flush()
		}
		return nil
	})
	if err != nil && ctx.Err() == nil {
		enc.Encode(api.Record{Error: err.Error()})
	}
}

// keepSeen bounds the lines of one second a resumed log looks for
// (resumed.run); heldAtMost what it holds while it looks.
const (
	keepSeen   = 64
	heldAtMost = 4096
	heldBytes  = 4 << 20 // and by size: a line may be 64 KiB
)

func lineDigest(l podman.LogLine) [32]byte {
	return sha256.Sum256([]byte(l.Stream + "\x00" + l.Text))
}

// resumed passes on the lines of a restarted container's log, read again
// from the second of the last line shown (from), past those shown: the
// lines before that second, then of it either the first skip (when every
// line of it shown was counted), or, when a --tail left out some of its
// earlier lines, all up to the end of run, the last lines of it shown.
// run ends no sooner than the least'th line of that second: the lines
// shown were its last, so as many lines of it came before their end, and
// identical lines (more of them than run keeps) are not found too early.
// Until run is found a line of that second is held; a later line, or the
// end of the read, shows that run is not there (the log was cut), and
// the held lines are shown then rather than lost.
type resumed struct {
	from   time.Time
	skip   int
	run    [][32]byte
	least  int
	read   int // lines of from's second read
	held   []podman.LogLine
	digest [][32]byte // of held
	size   int        // of held's text
	done   bool
	show   func(podman.LogLine) error
}

func (r *resumed) line(l podman.LogLine) error {
	if r.done || r.from.IsZero() || l.Time.IsZero() {
		return r.show(l)
	}
	switch {
	case l.Time.Before(r.from):
		return nil
	case l.Time.After(r.from):
		r.done = true
		if err := r.flush(); err != nil {
			return err
		}
		return r.show(l)
	case r.skip > 0:
		r.skip--
		return nil
	case len(r.run) == 0:
		r.done = true
		return r.show(l)
	}
	r.read++
	r.held, r.digest, r.size = append(r.held, l), append(r.digest, lineDigest(l)), r.size+len(l.Text)
	for len(r.held) > heldAtMost || r.size > heldBytes && len(r.held) > 1 { // an earlier line of that second, shown or not
		r.size -= len(r.held[0].Text)
		r.held, r.digest = slices.Delete(r.held, 0, 1), slices.Delete(r.digest, 0, 1)
	}
	if r.read >= r.least && len(r.digest) >= len(r.run) && slices.Equal(r.digest[len(r.digest)-len(r.run):], r.run) {
		r.held, r.digest, r.size, r.done = nil, nil, 0, true
	}
	return nil
}

// flush shows the lines held, run not found.
func (r *resumed) flush() error {
	held := r.held
	r.held, r.digest, r.size = nil, nil, 0
	for _, l := range held {
		if err := r.show(l); err != nil {
			return err
		}
	}
	return nil
}

// nodeLogs reads a container of this node: with Follow, on across its
// replacement (a new container of the same name: all its lines) and its
// restarts, until ctx ends.
func (s *Server) nodeLogs(ctx context.Context, src api.Source, q api.LogQuery, emit func(api.Record) error) error {
	if src.Step {
		return s.stepLog(src.Container, q, emit)
	}
	line := func(l podman.LogLine) error {
		return emit(api.Record{Time: l.Time, Stream: l.Stream, Text: l.Text, Partial: l.Partial, Cut: l.Cut})
	}
	var lastID string
	// lastStart is when the run last read started (Podman's whole
	// seconds; zero when it does not say): a run that started and ended
	// between two lookups is seen by its start, not by running (unless
	// it started in the same second as the run before).
	var lastStart time.Time
	// last is the time of the last line shown, atLast how many lines of
	// that time were shown and seenAt the last of them (at most keepSeen,
	// by digest): where a restarted container's log resumes. tailFrom is
	// the time of the first line a --tail read showed: the tail may have
	// left out lines of that second before it, so that its count of them
	// is not where they end.
	var last, tailFrom time.Time
	atLast := 0
	var seenAt [][32]byte
	shown := func(l podman.LogLine) error {
		switch {
		case l.Time.IsZero():
		case l.Time.Equal(last):
			atLast++
			if seenAt = append(seenAt, lineDigest(l)); len(seenAt) > keepSeen {
				seenAt = slices.Delete(seenAt, 0, 1)
			}
		default:
			last, atLast, seenAt = l.Time, 1, append(seenAt[:0], lineDigest(l))
		}
		return line(l)
	}
	waiting := false
	for {
		c, ok, err := s.RT.Lookup(ctx, src.Container)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		switch {
		case !ok && !q.Follow:
			return fmt.Errorf("no container %s on %s (the node has not made it yet, or it was removed)", src.Container, s.Node)
		case ok && c.ID != lastID:
			o := podman.LogOptions{Follow: q.Follow, Since: q.Since, Tail: q.Tail}
			if lastID != "" {
				o = podman.LogOptions{Follow: true} // a new container: all of it
				if err := emit(api.Record{Note: fmt.Sprintf("%s was replaced (container %s); following the new one", src.Container, short(c.ID))}); err != nil {
					return nil
				}
			}
			lastID, lastStart, waiting = c.ID, c.StartedAt, false
			last, atLast, seenAt, tailFrom = time.Time{}, 0, nil, time.Time{}
			first := true
			err := s.RT.StreamLogs(ctx, c.ID, o, func(l podman.LogLine) error {
				if first && o.Tail > 0 {
					tailFrom = l.Time
				}
				first = false
				return shown(l)
			})
			switch {
			case err == nil || ctx.Err() != nil:
			case !q.Follow:
				// The lines shown are not the whole log: the caller must
				// know it, not take the cut for the end.
				return fmt.Errorf("the log was cut: reading it from Podman failed (%v); the lines after that are not shown", err)
			default:
				// A container removed under the stream ends it with an error:
				// the next lookup finds what replaced it.
				s.Log.Debug("log stream ended", "container", src.Container, "err", err)
			}
			if !q.Follow {
				return nil
			}
		case ok && (c.Running || !c.StartedAt.Equal(lastStart)):
			// The same container, started again: what it wrote after the
			// last line shown. Podman's since is whole seconds, so the lines
			// are asked from that line's second (a crash-looping container's
			// first lines are within it) and those shown are passed over.
			// A run already ended (shorter than repoll, its last words a
			// crash's) is read too: its start is not the one read before.
			from := last
			if from.IsZero() {
				from = q.Since
			}
			r := &resumed{from: from, skip: atLast, show: shown}
			switch {
			case !last.IsZero() && !c.StartedAt.IsZero() && c.StartedAt.Unix() >= last.Unix()+2:
				// This run started after that second ended, with a second
				// to spare (Podman notes the start once the process runs):
				// every line of that second is an earlier run's, shown or
				// left out by a tail, and none is this run's.
				r.from, r.skip = time.Unix(last.Unix()+1, 0), 0
			case !last.IsZero() && last.Equal(tailFrom):
				// A tail cut into that second: the lines shown of it are
				// found by what they say, not counted. A known limit: when
				// this run started within that second or the next, or
				// Podman did not say when, and the earlier run's lines of
				// that second repeat the lines shown, they may be found too
				// early, and the lines after that place show, those shown
				// again (nothing in the log says which run wrote a line).
				r.skip, r.run, r.least = 0, slices.Clone(seenAt), atLast
			}
			lastStart = c.StartedAt
			s.RT.StreamLogs(ctx, c.ID, podman.LogOptions{Follow: true, Since: r.from}, r.line)
			r.flush()
		case !ok && !waiting:
			waiting = true
			if err := emit(api.Record{Note: fmt.Sprintf("no container %s on %s now; waiting for it", src.Container, s.Node)}); err != nil {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(repoll):
		}
	}
}

func short(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

// stepName is what a step log's file may be called after.
var stepName = regexp.MustCompile(`^[a-z0-9][a-z0-9_.-]{0,200}$`)

// maxStepLog bounds a step's kept lines (the tail of its last run).
const (
	maxStepLines = 2000
	maxStepLog   = 1 << 20
)

func (s *Server) stepLogPath(name string) (string, bool) {
	if s.StepLogs == "" || !stepName.MatchString(name) {
		return "", false
	}
	return filepath.Join(s.StepLogs, name+".log"), true
}

// stepLog reads a step's last run, as SaveStepLog kept it.
func (s *Server) stepLog(name string, q api.LogQuery, emit func(api.Record) error) error {
	path, ok := s.stepLogPath(name)
	if !ok {
		return fmt.Errorf("no kept lines of step %s", name)
	}
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("step %s has not run on %s since this agent keeps its lines", name, s.Node)
	}
	if err != nil {
		return err
	}
	defer f.Close()
	var recs []api.Record
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), api.MaxRecord)
	for sc.Scan() {
		var rec api.Record
		if json.Unmarshal(sc.Bytes(), &rec) != nil {
			continue // a damaged line: the others still show
		}
		if !q.Since.IsZero() && rec.Time.Before(q.Since) {
			continue
		}
		recs = append(recs, rec)
	}
	if q.Tail > 0 && len(recs) > q.Tail {
		recs = recs[len(recs)-q.Tail:]
	}
	for _, rec := range recs {
		if err := emit(rec); err != nil {
			return nil
		}
	}
	return nil
}

// SaveStepLog keeps the last lines of a step's run (its container, about
// to be removed) where `mesh logs MODULE.STEP` reads them: written aside
// and renamed, so a crash leaves the previous run's or this one's.
func (s *Server) SaveStepLog(ctx context.Context, name, id string) {
	path, ok := s.stepLogPath(name)
	if !ok {
		return
	}
	if err := os.MkdirAll(s.StepLogs, 0o700); err != nil {
		s.Log.Warn("could not keep a step's lines", "step", name, "err", err)
		return
	}
	var recs [][]byte
	size := 0
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	err := s.RT.StreamLogs(ctx, id, podman.LogOptions{Tail: maxStepLines}, func(l podman.LogLine) error {
		b, _ := json.Marshal(api.Record{Time: l.Time, Stream: l.Stream, Text: l.Text, Partial: l.Partial, Cut: l.Cut})
		recs, size = append(recs, b), size+len(b)+1
		for size > maxStepLog && len(recs) > 1 {
			size -= len(recs[0]) + 1
			recs = recs[1:]
		}
		return nil
	})
	if err != nil {
		s.Log.Warn("could not read a step's lines to keep them", "step", name, "err", err)
		return
	}
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		s.Log.Warn("could not keep a step's lines", "step", name, "err", err)
		return
	}
	bw := bufio.NewWriter(f)
	for _, b := range recs {
		bw.Write(b)
		bw.WriteByte('\n')
	}
	if err := errors.Join(bw.Flush(), f.Sync(), f.Close()); err != nil {
		os.Remove(tmp)
		s.Log.Warn("could not keep a step's lines", "step", name, "err", err)
		return
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		s.Log.Warn("could not keep a step's lines", "step", name, "err", err)
	}
}
