package web

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"mesh/cluster/api"
	"mesh/state"
)

// partHeader asks for the page's main part alone: the page's script sends
// it when an event says the state changed, and swaps the part in.
const partHeader = "X-Mesh-Part"

// ago says how long ago t was ("never" for none).
func ago(t any) string {
	var at time.Time
	switch v := t.(type) {
	case time.Time:
		at = v
	case *time.Time:
		if v == nil {
			return "never"
		}
		at = *v
	}
	if at.IsZero() {
		return "never"
	}
	d := time.Since(at).Round(time.Second)
	if d < 0 {
		return "in " + (-d).String()
	}
	return d.String() + " ago"
}

var funcs = template.FuncMap{
	"ago":   ago,
	"asset": assetURL,
	"inc":   func(n int) int { return n + 1 },
	"dec":   func(n int) int { return n - 1 },
	"when": func(t time.Time) string {
		if t.IsZero() {
			return "-"
		}
		return t.UTC().Format("2006-01-02 15:04:05Z")
	},
	"short": func(s string) string {
		if len(s) > 12 {
			return s[:12]
		}
		return s
	},
	"join": strings.Join,
}

func (s *Server) parse() error {
	base, err := template.New("base.html").Funcs(funcs).ParseFS(assets, "templates/base.html")
	if err != nil {
		return err
	}
	s.pages = map[string]*template.Template{}
	for _, p := range []string{"login", "fleet", "node", "module", "roster", "preview"} {
		t, err := template.Must(base.Clone()).ParseFS(assets, "templates/"+p+".html")
		if err != nil {
			return fmt.Errorf("page %s: %w", p, err)
		}
		s.pages[p] = t
	}
	return nil
}

// page is what every page's template gets.
type page struct {
	Title string
	CSRF  string
	// Live: the page's main part follows the state's events.
	Live bool
	// Index is the replica's applied index the page's reads started at.
	Index uint64
	Data  any
}

// render writes a page whole, or only its main part when the page's
// script asks for it. The page is rendered into a buffer first: a template
// that fails shows an error, not half a page.
func (s *Server) render(w http.ResponseWriter, r *http.Request, code int, name string, sess *session, data any) {
	p := page{Title: name, Data: data, Live: sess != nil && name != "preview", Index: renderedAt(r)}
	if sess != nil {
		p.CSRF = sess.csrf
	}
	if t, ok := data.(interface{ title() string }); ok {
		p.Title = t.title()
	}
	tpl := "base.html"
	if r.Header.Get(partHeader) != "" && sess != nil {
		tpl = "main"
	}
	var b bytes.Buffer
	if err := s.pages[name].ExecuteTemplate(&b, tpl, p); err != nil {
		s.log.Error("web page did not render", "page", name, "err", err)
		http.Error(w, "the page did not render: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(code)
	w.Write(b.Bytes())
}

// Problem is one failing thing of the fleet, shown first.
type Problem struct {
	Module, Node, What, Reason string
	// Badge is failing, waiting (for a secret or a provider's health) or
	// unknown (a node not heard from).
	Badge string
}

type fleetView struct {
	Status   api.Status
	Error    string
	Problems []Problem
	// MoreProblems is how many problems are not listed (AllProblems lists
	// them all).
	MoreProblems int
	AllProblems  bool
	Modules      []moduleRow
	// Total modules, those with nothing to care for, those the filter Q
	// keeps; the page shows Modules, From to To of Shown.
	Total, Healthy, Shown int
	Q                     string
	Page, Pages           int
	From, To              int
	// The nodes' summary; the table shows open up to NodesOpen nodes.
	Reachable, Unreachable, Pending int
	NodesOpen                       int
}

// The fleet page lists at most problemsShown problems and modulesPerPage
// modules (problems first): a fleet of thousands of modules renders in a
// browser as fast as one of a hundred, and the rest is a click or a
// search away.
const (
	problemsShown  = 50
	modulesPerPage = 100
	// nodesOpen: a larger fleet's node table is folded under its summary
	// (a browser lays out nothing of a closed details, and its unreachable
	// nodes are among the problems above it).
	nodesOpen = 20
)

// PageLink is the fleet page's link to page n, keeping the filter.
func (v fleetView) PageLink(n int) string {
	q := url.Values{}
	if v.Q != "" {
		q.Set("q", v.Q)
	}
	if v.AllProblems {
		q.Set("problems", "all")
	}
	if n > 1 {
		q.Set("page", strconv.Itoa(n))
	}
	if len(q) == 0 {
		return "/"
	}
	return "/?" + q.Encode()
}

func (fleetView) title() string { return "fleet" }

type moduleRow struct {
	Name      string
	Instances []instance
	Failing   bool
}

type instance struct {
	Node   string
	Health string // healthy, unhealthy, starting, failing, applied, pending
	Reason string
}

// fleet is the fleet page: problems first, then the nodes, then every
// module with where it runs and how it is.
func (s *Server) fleet(w http.ResponseWriter, r *http.Request, sess *session) {
	ctx, cancel := pageContext(r)
	defer cancel()
	v := fleetView{}
	st, err := s.cfg.Client.Status(ctx)
	if err != nil {
		v.Error = apiError(err)
		s.render(w, r, http.StatusOK, "fleet", sess, v)
		return
	}
	v.Status = st
	v.NodesOpen = nodesOpen
	for _, n := range st.Nodes {
		switch {
		case !n.Reachable:
			v.Unreachable++
		default:
			v.Reachable++
		}
		if n.AppliedVersion < n.PlanVersion {
			v.Pending++
		}
	}
	mods, err := s.cfg.Client.Modules(ctx)
	if err != nil {
		v.Error = apiError(err)
	}
	v.Problems = problems(st)
	failing := map[string]bool{}
	for _, p := range v.Problems {
		failing[p.Module] = true
	}
	for _, m := range mods {
		row := moduleRow{Name: m.Name, Failing: failing[m.Name]}
		for _, n := range m.Nodes {
			in := instanceOf(st, m.Name, n)
			row.Failing = row.Failing || needsCare(in.Health)
			row.Instances = append(row.Instances, in)
		}
		if !row.Failing {
			v.Healthy++
		}
		v.Modules = append(v.Modules, row)
	}
	// Failing modules first, then by name.
	sort.SliceStable(v.Modules, func(i, j int) bool {
		if v.Modules[i].Failing != v.Modules[j].Failing {
			return v.Modules[i].Failing
		}
		return v.Modules[i].Name < v.Modules[j].Name
	})
	q := r.URL.Query()
	v.Total, v.Q, v.AllProblems = len(v.Modules), strings.TrimSpace(q.Get("q")), q.Get("problems") == "all"
	if !v.AllProblems && len(v.Problems) > problemsShown {
		v.MoreProblems = len(v.Problems) - problemsShown
		v.Problems = v.Problems[:problemsShown]
	}
	if v.Q != "" {
		v.Modules = slices.DeleteFunc(v.Modules, func(m moduleRow) bool { return !strings.Contains(m.Name, v.Q) })
	}
	v.Shown = len(v.Modules)
	v.Pages = max(1, (v.Shown+modulesPerPage-1)/modulesPerPage)
	v.Page, _ = strconv.Atoi(q.Get("page"))
	v.Page = min(max(v.Page, 1), v.Pages)
	v.From, v.To = (v.Page-1)*modulesPerPage, min(v.Page*modulesPerPage, v.Shown)
	v.Modules = v.Modules[v.From:v.To]
	v.From++
	s.render(w, r, http.StatusOK, "fleet", sess, v)
}

// problems lists what fails: each node's compose and apply errors, each
// module's failures, unhealthy containers and exits, and stopped rollouts.
func problems(st api.Status) []Problem {
	var out []Problem
	for _, n := range st.Nodes {
		if n.ComposeError != "" {
			out = append(out, Problem{Node: n.Name, What: "plan does not compose", Reason: n.ComposeError, Badge: "failing"})
		}
		if !n.Reachable {
			out = append(out, Problem{Node: n.Name, What: "unreachable", Reason: "last heard from " + ago(n.LastSeen), Badge: "unknown"})
		}
		rep := n.Report
		if rep == nil {
			continue
		}
		for _, f := range rep.Failures {
			what, badge := f.Resource, "failing"
			if f.HealthGate {
				what, badge = "waits for "+f.Provider+" to be healthy", "waiting"
			} else if f.Secret != "" {
				what, badge = "waits for secret "+f.Secret, "waiting"
			} else if f.Backup != "" {
				what, badge = "waits for the backup of "+f.Backup, "waiting"
			}
			out = append(out, Problem{Module: f.Module, Node: n.Name, What: what, Reason: f.Reason, Badge: badge})
		}
		if len(rep.Failures) == 0 && rep.Error != "" {
			out = append(out, Problem{Node: n.Name, What: "apply failed", Reason: rep.Error, Badge: "failing"})
		}
		for _, h := range rep.Health {
			if h.Status == "unhealthy" {
				out = append(out, Problem{Module: h.Module, Node: n.Name, What: "container " + h.Container + " unhealthy", Reason: h.Output, Badge: "failing"})
			}
		}
		for _, e := range rep.Exits {
			out = append(out, Problem{Module: e.Module, Node: n.Name, What: fmt.Sprintf("container %s exited %d (restarts %d)", e.Container, e.ExitCode, e.Restarts), Reason: lastLine(e.Logs), Badge: "failing"})
		}
	}
	for _, ro := range st.Rollouts {
		if ro.State == "stopped" {
			out = append(out, Problem{Module: ro.Module, What: "rollout stopped", Reason: ro.Reason, Badge: "failing"})
		}
	}
	return out
}

func lastLine(s string) string {
	s = strings.TrimRight(s, "\n")
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}

// instanceOf says how module runs on node, from the node's last report:
// unknown when the node is not heard from (its last report is old news),
// failing when the node's plan does not compose or its last apply failed,
// waiting when the module waits for a secret or a provider's health.
func instanceOf(st api.Status, module, node string) instance {
	in := instance{Node: node, Health: "pending", Reason: "not applied yet"}
	for _, n := range st.Nodes {
		if n.Name != node {
			continue
		}
		if !n.Reachable {
			return instance{Node: node, Health: "unknown", Reason: "node unreachable, last heard from " + ago(n.LastSeen)}
		}
		if n.ComposeError != "" {
			return instance{Node: node, Health: "failing", Reason: "the node's plan does not compose: " + n.ComposeError}
		}
		rep := n.Report
		if rep == nil {
			continue
		}
		in.Health, in.Reason = "applied", ""
		if n.AppliedVersion < n.PlanVersion {
			in.Health, in.Reason = "pending", fmt.Sprintf("applied v%d of v%d", n.AppliedVersion, n.PlanVersion)
		}
		for _, h := range rep.Health {
			if h.Module != module {
				continue
			}
			switch {
			case h.Status == "unhealthy":
				in.Health, in.Reason = "unhealthy", h.Container+": "+h.Output
			case h.Status == "starting" && in.Health != "unhealthy":
				in.Health, in.Reason = "starting", h.Container
			case h.Status == "healthy" && in.Health == "applied":
				in.Health = "healthy"
			}
		}
		for _, f := range rep.Failures {
			if f.Module != module {
				continue
			}
			switch {
			case f.Secret != "":
				in.Health, in.Reason = "waiting", "waits for secret "+f.Secret+": "+f.Reason
			case f.HealthGate:
				in.Health, in.Reason = "waiting", "waits for "+f.Provider+" to be healthy: "+f.Reason
			case f.Backup != "":
				in.Health, in.Reason = "waiting", f.Resource+" waits: "+f.Reason
			default:
				in.Health, in.Reason = "failing", f.Resource+": "+f.Reason
			}
		}
		for _, e := range rep.Exits {
			if e.Module == module {
				in.Health, in.Reason = "failing", fmt.Sprintf("%s exited %d", e.Container, e.ExitCode)
			}
		}
		if len(rep.Failures) == 0 && rep.Error != "" {
			in.Health, in.Reason = "failing", "the node's last apply failed: "+rep.Error
		}
	}
	return in
}

// needsCare says whether an instance's health is a problem to show first.
func needsCare(health string) bool {
	switch health {
	case "failing", "unhealthy", "unknown", "waiting":
		return true
	}
	return false
}

type nodeView struct {
	Name     string
	Error    string
	Node     *api.NodeStatus
	Plan     *state.PlanVersion
	Versions []state.PlanVersion
	Kept     []state.ResourceReport
	From, To uint64
	Diff     []state.Change
	DiffErr  string
	Modules  []string
}

func (v nodeView) title() string { return "node " + v.Name }

// node is a node's page: its plan, its history with the command that made
// each version, a diff between two versions, and what its host keeps.
func (s *Server) node(w http.ResponseWriter, r *http.Request, sess *session) {
	ctx, cancel := pageContext(r)
	defer cancel()
	v := nodeView{Name: r.PathValue("name")}
	st, err := s.cfg.Client.Status(ctx)
	if err != nil {
		v.Error = apiError(err)
		s.render(w, r, http.StatusOK, "node", sess, v)
		return
	}
	for i := range st.Nodes {
		if st.Nodes[i].Name == v.Name {
			v.Node = &st.Nodes[i]
		}
	}
	if v.Node == nil {
		v.Error = "no node " + v.Name + " in the mesh"
		s.render(w, r, http.StatusNotFound, "node", sess, v)
		return
	}
	if rep := v.Node.Report; rep != nil {
		for _, res := range rep.Resources {
			if res.Outcome == state.Kept {
				v.Kept = append(v.Kept, res)
			}
		}
	}
	p, err := s.cfg.Client.Plans(ctx, v.Name, 0)
	if err != nil {
		v.Error = apiError(err)
		s.render(w, r, http.StatusOK, "node", sess, v)
		return
	}
	v.Versions = p.Versions
	if len(p.Versions) > 0 {
		v.Plan = &p.Versions[0]
		seen := map[string]bool{}
		if v.Plan.Plan != nil {
			for _, res := range v.Plan.Plan.Resources {
				if !seen[res.Module] {
					seen[res.Module] = true
					v.Modules = append(v.Modules, res.Module)
				}
			}
		}
	}
	v.From, _ = strconv.ParseUint(r.URL.Query().Get("from"), 10, 64)
	v.To, _ = strconv.ParseUint(r.URL.Query().Get("to"), 10, 64)
	if v.From != 0 || v.To != 0 {
		old, nw := findVersion(p.Versions, v.From), findVersion(p.Versions, v.To)
		switch {
		case old == nil:
			v.DiffErr = fmt.Sprintf("no plan v%d of %s is kept", v.From, v.Name)
		case nw == nil:
			v.DiffErr = fmt.Sprintf("no plan v%d of %s is kept", v.To, v.Name)
		default:
			v.Diff = state.Diff(old.Plan, nw.Plan)
		}
	}
	s.render(w, r, http.StatusOK, "node", sess, v)
}

func findVersion(vs []state.PlanVersion, n uint64) *state.PlanVersion {
	for i := range vs {
		if vs[i].Version == n {
			return &vs[i]
		}
	}
	return nil
}

type moduleView struct {
	Name      string
	Error     string
	Info      state.ModuleInfo
	Instances []instance
	Routes    []state.Route
	Names     []state.Name
	Changes   []*change
	Rollouts  []api.RolloutStatus
	Logs      []api.Record
	LogsError string
}

func (v moduleView) title() string { return "module " + v.Name }

// change is one of a module's last changes on one node, with why's chain.
type change struct {
	*state.Explanation
	// Moved is the index in Chain of the input whose digest moved: the
	// step the "replaced" line links to (-1: none).
	Moved int
}

// Anchor is the change's id in the page.
func (c *change) Anchor() string { return fmt.Sprintf("c-%s-%d", c.Node, c.Version) }

// maxChanges bounds the changes a module's page lists.
const maxChanges = 12

// module is a module's page: manifest, instances and health, routes and
// names, last changes with why's chain, last log lines.
func (s *Server) module(w http.ResponseWriter, r *http.Request, sess *session) {
	ctx, cancel := pageContext(r)
	defer cancel()
	v := moduleView{Name: r.PathValue("name")}
	mi, err := s.cfg.Client.Module(ctx, v.Name)
	if err != nil {
		v.Error = apiError(err)
		s.render(w, r, http.StatusNotFound, "module", sess, v)
		return
	}
	v.Info = mi
	st, err := s.cfg.Client.Status(ctx)
	if err != nil {
		v.Error = apiError(err)
		s.render(w, r, http.StatusOK, "module", sess, v)
		return
	}
	for _, ro := range st.Rollouts {
		if ro.Module == v.Name {
			v.Rollouts = append(v.Rollouts, ro)
		}
	}
	roster, _ := s.cfg.Client.Roster(ctx)
	for _, n := range mi.Nodes {
		v.Instances = append(v.Instances, instanceOf(st, v.Name, n))
		p, err := s.cfg.Client.Plans(ctx, n, 0)
		if err != nil || len(p.Versions) == 0 || p.Versions[0].Plan == nil {
			continue
		}
		plan := p.Versions[0].Plan
		for _, rt := range plan.Routes {
			if rt.Module == v.Name {
				v.Routes = append(v.Routes, rt)
			}
		}
		seen := map[string]bool{}
		for _, res := range plan.Resources {
			if res.Module != v.Name || seen[res.Name] {
				continue
			}
			seen[res.Name] = true
			e, err := state.Explain(n, p.Versions, res.Name)
			if err != nil {
				continue
			}
			v.Changes = append(v.Changes, newChange(e))
		}
	}
	v.Names = moduleNames(roster, v.Name, st.Domain, v.Routes, mi.Nodes)
	// Newest first; one line per node and version, the one with the
	// longest chain (a replaced container says why, down to the input).
	sort.SliceStable(v.Changes, func(i, j int) bool {
		a, b := v.Changes[i], v.Changes[j]
		if a.Version != b.Version {
			return a.Version > b.Version
		}
		if a.Node != b.Node {
			return a.Node < b.Node
		}
		return len(a.Chain) > len(b.Chain)
	})
	v.Changes = slices.CompactFunc(v.Changes, func(a, b *change) bool { return a.Node == b.Node && a.Version == b.Version })
	if len(v.Changes) > maxChanges {
		v.Changes = v.Changes[:maxChanges]
	}
	v.Logs, v.LogsError = s.lastLines(ctx, v.Name, mi.Nodes, st)
	s.render(w, r, http.StatusOK, "module", sess, v)
}

func newChange(e *state.Explanation) *change {
	c := &change{Explanation: e, Moved: -1}
	deepest := 0
	for i, st := range e.Chain {
		if (st.Before != "" || st.After != "") && st.Depth >= deepest {
			c.Moved, deepest = i, st.Depth
		}
	}
	return c
}

// moduleNames is the roster's names that are the module's on its nodes:
// MODULE.DOMAIN, and the hosts of its routes (no other module's name that
// merely contains the module's).
func moduleNames(roster []state.Name, module, domain string, routes []state.Route, nodes []string) []state.Name {
	own := map[string]bool{module + "." + domain: true}
	for _, rt := range routes {
		if rt.Module == module {
			own[rt.Name] = true
		}
	}
	var out []state.Name
	for _, n := range roster {
		if own[n.Name] && slices.Contains(nodes, n.Node) {
			out = append(out, n)
		}
	}
	return out
}

// logLines and logWait bound the log panel: the last lines of each
// container, read for at most logWait (a node that does not answer
// leaves the panel with what came).
const (
	logLines = 20
	logWait  = 3 * time.Second
)

func (s *Server) lastLines(ctx context.Context, module string, nodes []string, st api.Status) ([]api.Record, string) {
	if len(nodes) == 0 {
		return nil, ""
	}
	ctx, cancel := context.WithTimeout(ctx, logWait)
	defer cancel()
	var out []api.Record
	var errs []string
	// A node not heard from is not asked: it would only hold the page for
	// logWait.
	var ask []string
	for _, n := range nodes {
		if reachable(st, n) {
			ask = append(ask, n)
		} else {
			errs = append(errs, n+" is unreachable")
		}
	}
	if len(ask) == len(nodes) {
		ask = []string{""} // every node at once
	}
	for _, n := range ask {
		err := s.cfg.Client.Logs(ctx, module, n, api.LogQuery{Tail: logLines}, func(r api.Record) error {
			switch {
			case r.Sources != nil, r.Note != "":
			case r.Error != "":
				errs = append(errs, r.Container+" on "+r.Node+": "+r.Error)
			default:
				out = append(out, r)
			}
			return nil
		})
		if err != nil && ctx.Err() == nil {
			errs = append(errs, err.Error())
		}
	}
	if len(out) > 4*logLines {
		out = out[len(out)-4*logLines:]
	}
	return out, strings.Join(errs, "; ")
}

func reachable(st api.Status, node string) bool {
	for _, n := range st.Nodes {
		if n.Name == node {
			return n.Reachable
		}
	}
	return false
}

type rosterView struct {
	Query     string
	Error     string
	Names     []state.Name
	MoreNames int
	History   []state.RosterEvent
	More      int
}

func (rosterView) title() string { return "roster" }

// maxNames and maxEvents bound the names and the history one roster page
// shows: the search narrows them.
const (
	maxNames  = 100
	maxEvents = 50
)

// roster is the roster and its history, newest first, filtered by q.
func (s *Server) roster(w http.ResponseWriter, r *http.Request, sess *session) {
	ctx, cancel := pageContext(r)
	defer cancel()
	v := rosterView{Query: strings.TrimSpace(r.URL.Query().Get("q"))}
	match := func(fields ...string) bool {
		if v.Query == "" {
			return true
		}
		for _, f := range fields {
			if strings.Contains(strings.ToLower(f), strings.ToLower(v.Query)) {
				return true
			}
		}
		return false
	}
	names, err := s.cfg.Client.Roster(ctx)
	if err != nil {
		v.Error = apiError(err)
	}
	for _, n := range names {
		if !match(n.Name, n.Address, n.Node) {
			continue
		}
		if len(v.Names) == maxNames {
			v.MoreNames++
			continue
		}
		v.Names = append(v.Names, n)
	}
	hist, err := s.cfg.Client.RosterHistory(ctx, "")
	if err != nil && v.Error == "" {
		v.Error = apiError(err)
	}
	for i := len(hist) - 1; i >= 0; i-- {
		e := hist[i]
		if !match(e.Name, e.Address, e.Node, e.Cause) {
			continue
		}
		if len(v.History) == maxEvents {
			v.More++
			continue
		}
		v.History = append(v.History, e)
	}
	s.render(w, r, http.StatusOK, "roster", sess, v)
}

// Ops the dry run page offers.
var previewOps = []string{"assign", "unassign", "public-domain add", "public-domain remove"}

type previewView struct {
	Op, Node, Module, Domain string
	Ops                      []string
	Nodes                    []string
	Modules                  []string
	Preview                  *state.Preview
	Error                    string
	Done                     uint64
}

func (previewView) title() string { return "dry run" }

func (v previewView) Asked() bool { return v.Op != "" }

// preview shows what an assign, an unassign or a public-domain change
// would do on each node, with reasons, and a button that does it.
func (s *Server) preview(w http.ResponseWriter, r *http.Request, sess *session) {
	ctx, cancel := pageContext(r)
	defer cancel()
	q := r.URL.Query()
	v := previewView{Op: q.Get("op"), Node: q.Get("node"), Module: q.Get("module"), Domain: q.Get("domain"), Ops: previewOps}
	v.Done, _ = strconv.ParseUint(q.Get("done"), 10, 64)
	s.choices(ctx, &v)
	if v.Op != "" && v.Done == 0 && v.Error == "" {
		res, err := s.write(ctx, s.cfg.Client.DryRun(), v.Op, v.Node, v.Module, v.Domain)
		if err != nil {
			v.Error = apiError(err)
		} else {
			v.Preview = res.Preview
		}
	}
	s.render(w, r, http.StatusOK, "preview", sess, v)
}

// choices fills the form's lists of nodes and modules.
func (s *Server) choices(ctx context.Context, v *previewView) {
	nodes, err := s.cfg.Client.Nodes(ctx)
	if err != nil && v.Error == "" {
		v.Error = apiError(err)
	}
	for _, n := range nodes {
		v.Nodes = append(v.Nodes, n.Name)
	}
	mods, err := s.cfg.Client.Modules(ctx)
	if err != nil && v.Error == "" {
		v.Error = apiError(err)
	}
	for _, m := range mods {
		v.Modules = append(v.Modules, m.Name)
	}
}

// do makes the change the dry run showed (behind CSRF).
func (s *Server) do(w http.ResponseWriter, r *http.Request, sess *session) {
	ctx, cancel := pageContext(r)
	defer cancel()
	op, node, module, domain := r.PostFormValue("op"), r.PostFormValue("node"), r.PostFormValue("module"), r.PostFormValue("domain")
	res, err := s.write(ctx, s.cfg.Client, op, node, module, domain)
	if err != nil {
		msg := apiError(err)
		if errors.Is(err, context.DeadlineExceeded) {
			// The mesh may commit it still: say so rather than "failed".
			msg += "; the change may still be made: look at the fleet page before trying again"
		}
		v := previewView{Op: op, Node: node, Module: module, Domain: domain, Ops: previewOps, Error: msg}
		s.choices(ctx, &v)
		s.render(w, r, http.StatusConflict, "preview", sess, v)
		return
	}
	s.log.Info("web change", "op", op, "node", node, "module", module, "domain", domain, "index", res.Index)
	q := make([]string, 0, 5)
	for k, val := range map[string]string{"op": op, "node": node, "module": module, "domain": domain} {
		if val != "" {
			q = append(q, k+"="+template.URLQueryEscaper(val))
		}
	}
	sort.Strings(q)
	http.Redirect(w, r, "/preview?"+strings.Join(q, "&")+"&done="+strconv.FormatUint(res.Index, 10), http.StatusSeeOther)
}

func (s *Server) write(ctx context.Context, c *api.Client, op, node, module, domain string) (api.WriteResult, error) {
	switch op {
	case "assign":
		return c.Assign(ctx, state.OpAssign, node, module)
	case "unassign":
		return c.Unassign(ctx, node, module, nil)
	case "public-domain add", "public-domain remove":
		// One domain added or removed: the node's other domains stay.
		domain = strings.TrimSpace(domain)
		if domain == "" {
			return api.WriteResult{}, fmt.Errorf("%s: give the public domain", op)
		}
		if op == "public-domain add" {
			return c.PublicDomain(ctx, node, api.DomainRequest{Add: []string{domain}})
		}
		return c.PublicDomain(ctx, node, api.DomainRequest{Remove: []string{domain}})
	}
	return api.WriteResult{}, fmt.Errorf("unknown change %q: one of %s", op, strings.Join(previewOps, ", "))
}
