package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"golang.org/x/term"

	"mesh/cluster/api"
	"mesh/state"
)

// Run prints the status, once or (--watch) as it changes.
func (c *StatusCmd) Run(g *Globals) error {
	if c.Watch {
		return c.watch(g)
	}
	ctx, cancel := timeout()
	defer cancel()
	st, err := g.client().Status(ctx)
	if err != nil {
		return err
	}
	if c.JSON {
		return printJSON(g.out, st)
	}
	return renderStatus(g.out, st)
}

// watch redraws the status when what it shows changes (not for a mere
// "last seen" tick).
func (c *StatusCmd) watch(g *Globals) error {
	if c.Interval < 100*time.Millisecond {
		return usageError{fmt.Errorf("--interval %s is too short; 100ms at least", c.Interval)}
	}
	ctx, stop := signalContext()
	defer stop()
	f, _ := g.out.(*os.File)
	tty := f != nil && term.IsTerminal(int(f.Fd()))
	last := ""
	for {
		qctx, cancel := timeout()
		st, err := g.client().Status(qctx)
		cancel()
		var key string
		var b strings.Builder
		if err != nil {
			key = err.Error()
			fmt.Fprintf(&b, "mesh: %v (retrying every %s)\n", err, c.Interval)
		} else {
			key = statusKey(st)
			if c.JSON {
				json.NewEncoder(&b).Encode(st)
			} else {
				renderStatus(&b, st)
			}
		}
		if key != last || (tty && !c.JSON) {
			switch {
			case tty && !c.JSON:
				fmt.Fprint(g.out, "\033[H\033[2J")
			case last != "" && !c.JSON:
				fmt.Fprintf(g.out, "\n--- %s ---\n", time.Now().Format(time.TimeOnly))
			}
			fmt.Fprint(g.out, b.String())
			last = key
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(c.Interval):
		}
	}
}

// statusKey is what --watch compares: everything status shows but the
// clock (last seen, applied index moved by reports alone).
func statusKey(st api.Status) string {
	type nodeKey struct {
		Name, Address, Domain, Version, Compose, ApplyError string
		Plan, Applied                                       uint64
		Reachable, Draining                                 bool
		Failures, Health, Exits, Kept, Certs, Scheduled     string
	}
	keys := []nodeKey{}
	for _, n := range st.Nodes {
		k := nodeKey{Name: n.Name, Draining: n.Draining, Address: n.Address, Domain: n.PublicDomain, Version: n.Version, Compose: n.ComposeError, ApplyError: n.ApplyError, Plan: n.PlanVersion, Applied: n.AppliedVersion, Reachable: n.Reachable}
		if r := n.Report; r != nil {
			k.Failures = fmt.Sprint(r.Failures)
			for _, h := range r.Health {
				k.Health += h.Container + "=" + h.Status + " "
			}
			for _, e := range r.Exits {
				k.Exits += fmt.Sprintf("%s=%d/%d ", e.Container, e.ExitCode, e.Restarts)
			}
			for _, rr := range r.Resources {
				if rr.Outcome == state.Kept {
					k.Kept += rr.Name + " "
				}
			}
			for _, c := range r.Certificates {
				k.Certs += c.Name + "=" + c.Issuer + c.NotAfter.String() + c.Error + " "
			}
			for _, c := range r.Backups {
				k.Scheduled += fmt.Sprintf("backup %s %v %s %s %s ", c.Module, c.OK, c.Last, c.Next, c.Snapshot)
			}
			for _, c := range r.Scheduled {
				k.Scheduled += fmt.Sprintf("%s %v %s %s ", c.Step, c.OK, c.Last, c.Next)
			}
		}
		keys = append(keys, k)
	}
	overlay := ""
	if o := st.Overlay; o != nil {
		overlay = o.State
		for _, n := range st.Nodes {
			if n.Overlay != nil && n.Overlay.Stale {
				overlay += " stale:" + n.Name
			}
		}
	}
	ca := ""
	if st.CA != nil {
		ca = st.CA.Digest + " " + st.CA.Next + " " + strings.Join(st.CA.Renewed, ",")
	}
	b, _ := json.Marshal(struct {
		Leader, State, Overlay, CA string
		Nodes                      []nodeKey
		Moves                      []state.MoveInfo
	}{st.Leader, st.RaftState, overlay, ca, keys, st.Moves})
	return string(b)
}

// renderStatus writes the status as mesh status prints it.
func renderStatus(w io.Writer, st api.Status) error {
	fmt.Fprintf(w, "mesh %s, domain %s; this node: %s (%s), leader: %s, applied index %d\n", st.MeshID, st.Domain, st.Node, strings.ToLower(st.RaftState), dash(st.Leader), st.AppliedIndex)
	if st.CA != nil {
		fmt.Fprintln(w, st.CA)
	}
	if st.Behind > 0 && st.BehindSince != nil {
		fmt.Fprintf(w, "this node's replica is %d entries behind what it knows committed (index %d), for %s: what it shows may be that old\n", st.Behind, st.CommitIndex, time.Since(*st.BehindSince).Round(time.Second))
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tADDRESS\tPUBLIC DOMAIN\tVERSION\tCERT EXPIRES\tPLAN\tAPPLIED\tSTATE")
	for _, n := range st.Nodes {
		plan, applied := "-", "-"
		if n.PlanVersion > 0 {
			plan = fmt.Sprintf("v%d (%d resources)", n.PlanVersion, n.Resources)
		}
		if n.AppliedVersion > 0 {
			applied = fmt.Sprintf("v%d", n.AppliedVersion)
		}
		stateText := "ok"
		switch {
		case !n.Reachable && n.LastSeen == nil:
			stateText = "unreachable (not heard from since this node started)"
		case !n.Reachable:
			stateText = fmt.Sprintf("unreachable (last seen %s ago)", time.Since(*n.LastSeen).Round(time.Second))
		case n.ComposeError != "":
			stateText = "plan does not compose: " + n.ComposeError
		case n.ApplyError != "" && n.Report != nil && n.Report.OnlyGates():
			stateText = "waiting: " + printable(n.ApplyError)
		case n.ApplyError != "":
			stateText = "apply failed: " + printable(n.ApplyError)
		case n.PlanVersion > n.AppliedVersion:
			stateText = "not applied yet"
		case n.Report != nil && len(n.Report.Unhealthy()) > 0:
			stateText = "unhealthy containers (below)"
		case n.Report != nil && len(n.Report.Exits) > 0:
			stateText = "containers exited (below)"
		}
		if n.Draining {
			stateText = "draining; " + stateText
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", n.Name, n.Address, dash(n.PublicDomain), dash(n.Version), certText(n.CertExpires), plan, applied, stateText)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, n := range st.Nodes {
		if n.DiskLow {
			fmt.Fprintf(w, "%s: its data dir has %s left: writes through it stop below %s; free some space there (a leader that runs out hands its leadership over)\n", n.Name, bytesText(*n.DiskFree), bytesText(st.DiskFloor))
		}
	}
	renderOverlay(w, st)
	// What failed, what waits behind it, and what the host keeps, per node.
	for _, n := range st.Nodes {
		if n.Report == nil {
			continue
		}
		for _, f := range n.Report.Failures {
			fmt.Fprintf(w, "\n%s: module %s failed at %s: %s\n", n.Name, dash(f.Module), f.Resource, printableLines(f.Reason, "\n    "))
			if len(f.Waiting) > 0 {
				fmt.Fprintf(w, "  waiting on it: %s\n", strings.Join(f.Waiting, ", "))
			}
		}
		for _, rr := range n.Report.Resources {
			if rr.Outcome == state.Kept {
				fmt.Fprintf(w, "%s: kept %s (%s): %s\n", n.Name, printable(rr.Name), rr.Module, printable(rr.Reason))
			}
		}
		for _, h := range n.Report.Health {
			if h.Status == state.HealthHealthy {
				continue
			}
			line := fmt.Sprintf("%s: container %s (%s) is %s since %s", n.Name, h.Container, h.Module, h.Status, h.Since.Local().Format(time.TimeOnly))
			if h.Status == state.HealthUnhealthy {
				line += fmt.Sprintf(", %d failed check(s) in a row; last output: %q", h.FailingStreak, h.Output)
			}
			fmt.Fprintln(w, line)
		}
		renderCerts(w, n.Name, n.Report.Certificates)
		for _, c := range n.Report.Scheduled {
			switch {
			case !c.OK:
				fmt.Fprintf(w, "%s: error: scheduled step %s (%s) failed at %s; tried again at %s: %s\n", n.Name, c.Step, c.Module, c.Last.Local().Format(time.DateTime), c.Next.Local().Format(time.DateTime), printable(c.Reason))
			case c.Last.IsZero():
				fmt.Fprintf(w, "%s: scheduled step %s (%s): first slot %s\n", n.Name, c.Step, c.Module, c.Next.Local().Format(time.DateTime))
			default:
				fmt.Fprintf(w, "%s: scheduled step %s (%s) ran at %s; next %s\n", n.Name, c.Step, c.Module, c.Last.Local().Format(time.DateTime), c.Next.Local().Format(time.DateTime))
			}
		}
		renderBackups(w, n.Name, n.Report.Backups, time.Now())
		for _, e := range n.Report.Exits {
			fmt.Fprintf(w, "%s: container %s (%s) exited with code %d at %s; Podman restarted it %d time(s)\n", n.Name, e.Container, e.Module, e.ExitCode, e.At.Local().Format(time.TimeOnly), e.Restarts)
			if e.Logs != "" {
				fmt.Fprintf(w, "  last lines:\n    %s\n", printableLines(e.Logs, "\n    "))
			}
		}
	}
	var b strings.Builder
	renderRollouts(&b, st.Rollouts)
	fmt.Fprint(w, b.String())
	renderMoves(w, st.Moves)
	return nil
}

// renderMoves says how far each move is, what FROM still keeps after one,
// and as an error why one was aborted.
func renderMoves(w io.Writer, moves []state.MoveInfo) {
	for _, mv := range moves {
		at := mv.Since.Local().Format(time.DateTime)
		data := strings.Join(mv.Data, ", ")
		switch mv.Phase {
		case state.MoveCopy:
			fmt.Fprintf(w, "move of %s from %s to %s: %s stopped it and copies %s (since %s)\n", mv.Module, mv.From, mv.To, mv.From, data, at)
		case state.MoveStart:
			fmt.Fprintf(w, "move of %s from %s to %s: copied; starting on %s, waiting for its health checks (since %s)\n", mv.Module, mv.From, mv.To, mv.To, at)
		case state.MoveDone:
			fmt.Fprintf(w, "move of %s to %s done at %s; %s keeps its copy of %s until mesh move --finish %s\n", mv.Module, mv.To, at, mv.From, data, mv.Module)
		case state.MoveAborted:
			fmt.Fprintf(w, "error: the move of %s from %s to %s was aborted at %s; it runs on %s: %s (mesh move --finish %s clears this)\n", mv.Module, mv.From, mv.To, at, mv.From, printable(mv.Reason), mv.Module)
		}
	}
}

// renderCerts says, for a node's route proxy, each name it serves no valid
// certificate for, and why (the ACME error it logged), then how many it
// serves and which expires first.
func renderCerts(w io.Writer, node string, cs []state.CertStatus) {
	ok, first := 0, -1
	for i, c := range cs {
		if c.Error != "" {
			fmt.Fprintf(w, "%s: certificate for %s (%s): %s\n", node, c.Name, c.Module, printableLines(c.Error, "\n    "))
			continue
		}
		ok++
		if first < 0 || c.NotAfter.Before(cs[first].NotAfter) {
			first = i
		}
	}
	if ok > 0 {
		c := cs[first]
		fmt.Fprintf(w, "%s: certificates served for %d name(s); the first to expire: %s (from %s) at %s\n", node, ok, c.Name, c.Issuer, c.NotAfter.Local().Format("2006-01-02 15:04:05"))
	}
}

// certText is when a node's certificate expires, as status shows it (it is
// renewed a third of its life before; an expired one is refused by peers).
func certText(exp *time.Time) string {
	switch {
	case exp == nil:
		return "-"
	case time.Until(*exp) <= 0:
		return "EXPIRED " + exp.Local().Format("2006-01-02 15:04")
	}
	return exp.Local().Format("2006-01-02 15:04")
}

// StatusCmd shows the mesh.
type StatusCmd struct {
	JSON     bool          `name:"json" help:"Print JSON."`
	Watch    bool          `help:"Redraw as plans are applied, nodes come and go and health changes (a terminal is redrawn in place; otherwise each change is printed after a rule). Stop with Ctrl-C."`
	Interval time.Duration `default:"1s" help:"How often --watch asks the agent."`
}

// renderOverlay says how this node's overlay is and, per peer, when it last
// completed a handshake and what crossed; a handshake older than three
// minutes is called out.
func renderOverlay(w io.Writer, st api.Status) {
	o := st.Overlay
	if o == nil {
		return
	}
	fmt.Fprintf(w, "\noverlay on %s: %s\n", st.Node, o.State)
	for _, n := range st.Nodes {
		p := n.Overlay
		if p == nil {
			continue
		}
		line := "never completed a handshake"
		if p.LastHandshake != nil {
			line = fmt.Sprintf("last handshake %s ago", time.Since(*p.LastHandshake).Round(time.Second))
		}
		line += fmt.Sprintf(", received %s, sent %s", bytesText(p.RxBytes), bytesText(p.TxBytes))
		if p.Stale {
			line += fmt.Sprintf("; OLDER THAN 3 MINUTES: is %s's agent running, and does UDP reach %s?", n.Name, dash(p.Endpoint))
		}
		fmt.Fprintf(w, "  %s (%s): %s\n", n.Name, dash(n.OverlayAddress), line)
	}
}

func bytesText(b uint64) string {
	switch {
	case b >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(b)/(1<<30))
	case b >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20))
	case b >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(b)/(1<<10))
	}
	return fmt.Sprintf("%d B", b)
}

// overdueAfter is how long past its slot a scheduled backup that has not
// run is an error in status.
const overdueAfter = 15 * time.Minute

// renderBackups says of each module's backups on node: the last one and
// its age, and as an error one that failed or a scheduled one overdue.
func renderBackups(w io.Writer, node string, runs []state.BackupRun, now time.Time) {
	for _, b := range runs {
		next := ""
		if !b.Next.IsZero() {
			next = "; next " + b.Next.Local().Format(time.DateTime)
		}
		switch {
		case !b.Last.IsZero() && !b.OK:
			last := "never"
			if !b.LastOK.IsZero() {
				last = fmt.Sprintf("%s ago", now.Sub(b.LastOK).Round(time.Second))
			}
			fmt.Fprintf(w, "%s: error: backup of %s failed at %s (last good one: %s)%s: %s\n", node, b.Module, b.Last.Local().Format(time.DateTime), last, next, printable(b.Reason))
		case !b.Next.IsZero() && now.Sub(b.Next) > overdueAfter:
			fmt.Fprintf(w, "%s: error: backup of %s is overdue: its slot was %s ago (is the agent's schedule stuck? its log says)\n", node, b.Module, now.Sub(b.Next).Round(time.Second))
		case b.Last.IsZero():
			fmt.Fprintf(w, "%s: backup of %s: none yet%s\n", node, b.Module, next)
		default:
			warning := ""
			if b.Reason != "" { // a backup that succeeded, with a warning
				warning = "; warning: " + printable(b.Reason)
			}
			fmt.Fprintf(w, "%s: backup of %s: snapshot %s, %s ago%s%s\n", node, b.Module, b.Snapshot, now.Sub(b.LastOK).Round(time.Second), next, warning)
		}
	}
}

// printable is text a node reports (restic's errors name files a
// container made) with its control characters shown, never sent to the
// terminal: a newline as " | ", others as \xNN.
func printable(s string) string {
	var b strings.Builder
	for _, r := range s {
		switch {
		case r == '\n':
			b.WriteString(" | ")
		case isControl(r):
			fmt.Fprintf(&b, "\\x%02x", r)
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// printableLines is printable for text of several lines (a container's
// last lines), kept apart by sep.
func printableLines(s, sep string) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		lines[i] = printable(l)
	}
	return strings.Join(lines, sep)
}

// isControl: C0, DEL and C1, what a terminal acts on rather than shows.
func isControl(r rune) bool {
	return r < 0x20 || r == 0x7f || r >= 0x80 && r < 0xa0
}

// terminalText is a line a container wrote as mesh logs shows it on a
// terminal: printable's rule (a container's text is never sent to the
// terminal raw, or it could retitle the window, clear the screen, print
// over other lines, write the clipboard with OSC 52), but a tab is kept,
// and so is a colour (SGR: ESC [ digits and ; ... m), which only colours
// text: many programs log in colour. A line that set one ends with a
// reset, so that what a container set (hidden text: ESC [ 8 m, or black on
// black) does not reach the lines after it: another container's, or mesh's
// own.
func terminalText(s string) string {
	var b strings.Builder
	coloured := false
	for i := 0; i < len(s); {
		if n := sgrLen(s[i:]); n > 0 {
			b.WriteString(s[i : i+n])
			i += n
			coloured = true
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r != '\t' && isControl(r) {
			fmt.Fprintf(&b, "\\x%02x", r)
		} else {
			b.WriteRune(r) // a byte that is not UTF-8 shows as U+FFFD
		}
		i += size
	}
	if coloured {
		b.WriteString("\x1b[0m")
	}
	return b.String()
}

// sgrLen is the length of the SGR sequence s starts with (0: none).
func sgrLen(s string) int {
	if !strings.HasPrefix(s, "\x1b[") {
		return 0
	}
	for i := 2; i < len(s); i++ {
		switch c := s[i]; {
		case c == 'm':
			return i + 1
		case c != ';' && (c < '0' || c > '9'):
			return 0
		}
	}
	return 0
}
