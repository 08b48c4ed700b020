package manifest

import (
	"fmt"
	"sort"
	"strings"

	"github.com/goccy/go-yaml/ast"
)

// The shape check walks the YAML tree against the manifest's shape before
// it is decoded, so that every unknown key and every value of the wrong kind
// in the file is reported at once, by key and line, in words (not the
// decoder's "int was used where sequence is expected"), with the nearest
// known key for a misspelt one.

type shape struct {
	kind    string // text, number (whole), decimal, bool, list, map (of text), object
	example string
	elem    *shape
	fields  map[string]*shape
}

var (
	text   = &shape{kind: "text"}
	number = &shape{kind: "number"}
	flag   = &shape{kind: "bool", example: "true"}
	texts  = func(ex string) *shape { return &shape{kind: "list", elem: text, example: ex} }

	healthShape = &shape{kind: "object", fields: map[string]*shape{
		"command": texts(`["curl", "-fsS", "http://localhost:3000/"]`), "interval": text, "timeout": text,
		"retries": {kind: "number", example: "3"}, "start-period": text,
	}}
	resourceShape = &shape{kind: "object", fields: map[string]*shape{
		"directory": text, "file": text, "routes-file": text, "binding": text, "credential": text, "secret": text, "name": text, "step": text, "container": text,
		"owner": text, "mode": text, "content": text, "provider": text, "template": text, "image": text,
		"command":      texts(`["httpd", "-f"]`),
		"env":          {kind: "map", example: `{KEY: "value"}`},
		"env-secrets":  {kind: "map", example: `{SMTP_PASSWORD: smtp}`},
		"mounts":       texts(`["/srv/web/data:/data"]`),
		"ports":        texts(`["8080:8080"]`),
		"public-ports": texts(`["443:443"]`),
		"restart":      text,
		"restart-on":   texts(`[/srv/web/app.ini]`),
		"take-over":    flag,
		"data":         flag,
		"schedule":     text, "before-backup": flag,
		"pull":         text,
		"health":       healthShape,
		"user":         text,
		"entrypoint":   texts(`["/bin/sh", "-c"]`),
		"working-dir":  text,
		"cap-add":      texts(`[NET_ADMIN]`),
		"cap-drop":     texts(`[ALL]`),
		"devices":      texts(`["/dev/fuse"]`),
		"read-only":    flag,
		"tmpfs":        texts(`["/run:size=64m"]`),
		"memory":       text,
		"log-max-size": text,
		"cpus":         {kind: "decimal", example: "1.5"},
		"stop-signal":  text,
		"stop-timeout": text,
		"labels":       {kind: "map", example: `{com.example.team: "web"}`},
		"tty":          flag,
		"init":         flag,
		"pids-limit":   {kind: "number", example: "512"},
		"group-add":    texts(`["1000", video]`),
		"healthy":      flag,
	}}
	manifestShape = &shape{kind: "object", fields: map[string]*shape{
		"module":              text,
		"accepts-credentials": text,
		"routes": {kind: "list", example: "[{name: git, port: 3000}]", elem: &shape{kind: "object", fields: map[string]*shape{
			"name": text, "port": {kind: "number", example: "3000"}, "hosts": texts("[code.example.com]"),
		}}},
		"resources": {kind: "list", example: "[{directory: /srv/web}]", elem: resourceShape},
		"update": {kind: "object", example: "{max-parallel: 1, healthy-for: 10s, auto-revert: true}", fields: map[string]*shape{
			"max-parallel": {kind: "number", example: "1"}, "healthy-for": text, "auto-revert": flag,
		}},
		"backup": {kind: "object", example: "{schedule: daily, keep: {daily: 7, weekly: 4}}", fields: map[string]*shape{
			"schedule": text, "pause": flag,
			"keep": {kind: "object", example: "{daily: 7, weekly: 4}", fields: map[string]*shape{
				"last": {kind: "number", example: "10"}, "hourly": {kind: "number", example: "24"}, "daily": {kind: "number", example: "7"},
				"weekly": {kind: "number", example: "4"}, "monthly": {kind: "number", example: "12"}, "yearly": {kind: "number", example: "3"},
			}},
		}},
	}}
)

// checkShape reports every shape error in the document body.
func checkShape(file string, body ast.Node) Errors {
	var errs Errors
	walkShape(file, body, manifestShape, "", &errs)
	sort.SliceStable(errs, func(i, j int) bool { return errs[i].Line < errs[j].Line })
	return errs
}

func walkShape(file string, n ast.Node, s *shape, key string, errs *Errors) {
	if n == nil {
		return
	}
	if _, ok := n.(*ast.NullNode); ok {
		return // absent; the checks after decoding say what is missing
	}
	if c, ok := n.(*ast.CommentGroupNode); ok && c != nil {
		return
	}
	add := func(format string, a ...any) {
		*errs = append(*errs, &Error{File: file, Line: line(n), Msg: fmt.Sprintf(format, a...)})
	}
	what := describeNode(n)
	switch s.kind {
	case "text":
		if !isScalar(n) {
			add("`%s` must be a single value (text), not %s", key, what)
		}
	case "number":
		if _, ok := n.(*ast.IntegerNode); !ok {
			add("`%s` must be a whole number, e.g. %s: %s; got %s", key, key, s.example, what)
		}
	case "decimal":
		_, isInt := n.(*ast.IntegerNode)
		if _, isFloat := n.(*ast.FloatNode); !isInt && !isFloat {
			add("`%s` must be a number, e.g. %s: %s; got %s", key, key, s.example, what)
		}
	case "bool":
		if _, ok := n.(*ast.BoolNode); !ok {
			add("`%s` must be true or false; got %s", key, what)
		}
	case "list":
		seq, ok := n.(*ast.SequenceNode)
		if !ok {
			add("`%s` must be a list, e.g. %s: %s; got %s", key, key, s.example, what)
			return
		}
		for _, v := range seq.Values {
			walkShape(file, v, s.elem, key+" entry", errs)
		}
	case "map":
		values, ok := pairs(n)
		if !ok {
			add("`%s` must be a mapping, e.g. %s: %s; got %s", key, key, s.example, what)
			return
		}
		for _, kv := range values {
			if !isScalar(kv.Value) {
				*errs = append(*errs, &Error{File: file, Line: line(kv.Value), Msg: fmt.Sprintf("`%s` value of %s must be a single value (text), not %s", key, keyOf(kv), describeNode(kv.Value))})
			}
		}
	case "object":
		values, ok := pairs(n)
		if !ok {
			if key == "" {
				add("a manifest is a mapping with `module:` and `resources:`; see `mesh schema`")
			} else {
				add("`%s` must be a mapping of keys; got %s", key, what)
			}
			return
		}
		for _, kv := range values {
			k := keyOf(kv)
			fs, ok := s.fields[k]
			if !ok {
				msg := fmt.Sprintf("unknown key %q", k)
				if near := nearest(k, s.fields); near != "" {
					msg += fmt.Sprintf("; did you mean %q?", near)
				} else {
					msg += "; `mesh schema` lists the keys a manifest may hold"
				}
				ln := line(kv.Key)
				if ln == 0 {
					ln = line(kv)
				}
				*errs = append(*errs, &Error{File: file, Line: ln, Msg: msg})
				continue
			}
			walkShape(file, kv.Value, fs, k, errs)
		}
	}
}

func pairs(n ast.Node) ([]*ast.MappingValueNode, bool) {
	switch m := n.(type) {
	case *ast.MappingNode:
		return m.Values, true
	case *ast.MappingValueNode:
		return []*ast.MappingValueNode{m}, true
	}
	return nil, false
}

func keyOf(kv *ast.MappingValueNode) string {
	if kv.Key == nil || kv.Key.GetToken() == nil {
		return ""
	}
	return kv.Key.GetToken().Value
}

func isScalar(n ast.Node) bool {
	switch n.(type) {
	case *ast.StringNode, *ast.IntegerNode, *ast.FloatNode, *ast.BoolNode, *ast.LiteralNode, *ast.NullNode, *ast.InfinityNode, *ast.NanNode:
		return true
	}
	return false
}

// describeNode says what a value is, in the user's words.
func describeNode(n ast.Node) string {
	switch v := n.(type) {
	case *ast.SequenceNode:
		return "a list"
	case *ast.MappingNode, *ast.MappingValueNode:
		return "a mapping"
	case *ast.IntegerNode, *ast.FloatNode:
		return "the number " + v.GetToken().Value
	case *ast.BoolNode:
		return v.GetToken().Value
	case *ast.StringNode, *ast.LiteralNode:
		s := v.GetToken().Value
		if len(s) > 40 {
			s = s[:40] + "..."
		}
		return fmt.Sprintf("the text %q", s)
	}
	return "a " + strings.ToLower(n.Type().String())
}

// nearest is the known key closest to k, when it is close enough to be a
// misspelling (an edit distance of at most a third of its length, or 2).
func nearest(k string, known map[string]*shape) string {
	best, bestD := "", 1<<30
	for cand := range known {
		if d := editDistance(k, cand); d < bestD || (d == bestD && cand < best) {
			best, bestD = cand, d
		}
	}
	if bestD <= max(2, len(k)/3) {
		return best
	}
	return ""
}

// editDistance counts the insertions, deletions, substitutions and adjacent
// swaps that make a into b (optimal string alignment).
func editDistance(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	if len(ra) > 64 || len(rb) > 64 {
		return 1 << 20
	}
	d := make([][]int, len(ra)+1)
	for i := range d {
		d[i] = make([]int, len(rb)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(ra); i++ {
		for j := 1; j <= len(rb); j++ {
			cost := 1
			if ra[i-1] == rb[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && ra[i-1] == rb[j-2] && ra[i-2] == rb[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(ra)][len(rb)]
}
