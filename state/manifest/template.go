package manifest

import (
	"bytes"
	"errors"
	"fmt"
	"text/template"
	"text/template/parse"
)

// A routes-file may carry a template: the mesh then writes the node's routing
// table in the proxy's own format (a Caddyfile, a Traefik file-provider
// file, an nginx include) instead of as JSON, so a proxy that reloads its
// configuration by itself follows routed assigns without being recreated.
//
// Templates run on every node, inside the state machine's derivation of
// plans, so they are held to a subset that cannot run long or grow large:
// no function calls but comparisons and len, no {{template}}/{{define}}
// (recursion), no range over anything but data (Go's range over an integer
// is a loop a manifest could make a billion long), no range inside a range,
// and output capped at MaxTemplateOutput.

// MaxTemplateOutput caps what one routes-file template may write.
const MaxTemplateOutput = 1 << 20

// MaxTemplateSize caps a template's own text.
const MaxTemplateSize = 64 << 10

// RouteData is one routed name as a template sees it.
type RouteData struct {
	Name   string // the routed name, e.g. git.example.org
	Module string // the module that declares the route
	Port   int    // the module's port on this node
	// Public says the name is a host name the mesh's resolvers answer
	// (under a public domain of the node, or one of the route's hosts):
	// one a proxy may get a certificate for. A route on a node with no
	// public domain is its bare NAME, and not public.
	Public bool
}

// RoutesData is what a routes-file template is executed with.
type RoutesData struct {
	Routes     []RouteData // this node's routed names, by name
	Node       string      // this node's name
	Address    string      // this node's mesh address
	Domain     string      // this node's first public domain ("" when it has none)
	Domains    []string    // every public domain of this node
	MeshDomain string      // the mesh's own domain (internal by default)
	ACME       ACMEData    // how this node's proxy gets certificates (issue 28)
}

// ACMEData is a node's ACME settings as a template sees them (`mesh node
// acme`): Directory is Let's Encrypt's when none was set.
type ACMEData struct {
	Directory string // the ACME directory URL
	Email     string // the account's contact address, "" for none
	CARoot    string // PEM of the root of the directory's own HTTPS, "" for the system's
}

// templateFuncs are the only functions a template may call.
var templateFuncs = map[string]bool{"eq": true, "ne": true, "lt": true, "le": true, "gt": true, "ge": true, "and": true, "or": true, "not": true, "len": true}

// ParseTemplate parses a routes-file template and checks it against the
// subset above. It also executes it once on sample data, so a misspelt
// field is an error at `mesh check`, not on a node.
func ParseTemplate(text string) (*template.Template, error) {
	if len(text) > MaxTemplateSize {
		return nil, fmt.Errorf("template is %d bytes; the limit is %d", len(text), MaxTemplateSize)
	}
	t, err := template.New("routes").Option("missingkey=error").Parse(text)
	if err != nil {
		return nil, fmt.Errorf("template: %w", err)
	}
	if len(t.Templates()) > 1 {
		return nil, errors.New("template: {{define}} and {{block}} are not supported; write the routes-file as one template")
	}
	if t.Tree != nil && t.Tree.Root != nil {
		if err := checkTemplate(t.Tree.Root, 0); err != nil {
			return nil, fmt.Errorf("template: %w", err)
		}
	}
	sample := RoutesData{
		Routes: []RouteData{{Name: "app.example.org", Module: "app", Port: 8080, Public: true}},
		Node:   "node", Address: "192.0.2.1", Domain: "example.org", Domains: []string{"example.org"}, MeshDomain: "internal",
		ACME: ACMEData{Directory: "https://acme.example.org/directory", Email: "ops@example.org", CARoot: "-----BEGIN CERTIFICATE-----\n"},
	}
	if _, err := ExecTemplate(t, sample); err != nil {
		return nil, err
	}
	return t, nil
}

// ExecTemplate renders t, refusing output over MaxTemplateOutput.
func ExecTemplate(t *template.Template, d RoutesData) (string, error) {
	w := &cappedWriter{max: MaxTemplateOutput}
	if err := t.Execute(w, d); err != nil {
		if w.over {
			return "", fmt.Errorf("template writes more than %d bytes; write less per route", MaxTemplateOutput)
		}
		return "", fmt.Errorf("template: %w", err)
	}
	return w.b.String(), nil
}

type cappedWriter struct {
	b    bytes.Buffer
	max  int
	over bool
}

func (w *cappedWriter) Write(p []byte) (int, error) {
	if w.b.Len()+len(p) > w.max {
		w.over = true
		return 0, errors.New("output limit")
	}
	return w.b.Write(p)
}

func checkTemplate(n parse.Node, ranges int) error {
	switch n := n.(type) {
	case nil:
		return nil
	case *parse.ListNode:
		if n == nil {
			return nil
		}
		for _, c := range n.Nodes {
			if err := checkTemplate(c, ranges); err != nil {
				return err
			}
		}
	case *parse.TextNode, *parse.CommentNode, *parse.BreakNode, *parse.ContinueNode:
	case *parse.ActionNode:
		return checkPipe(n.Pipe)
	case *parse.IfNode:
		return checkBranch(&n.BranchNode, ranges)
	case *parse.WithNode:
		return checkBranch(&n.BranchNode, ranges)
	case *parse.RangeNode:
		if ranges > 0 {
			return fmt.Errorf("line %d: a range inside a range is not supported", n.Line)
		}
		for _, c := range n.Pipe.Cmds {
			for _, a := range c.Args {
				// Only a field of the data (.Routes, $.Routes): dot or a
				// variable could hold a number, and ranging over a number
				// is a loop as long as the number.
				switch a := a.(type) {
				case *parse.FieldNode:
				case *parse.VariableNode:
					if len(a.Ident) < 2 || a.Ident[0] != "$" {
						return fmt.Errorf("line %d: range over %s; range over a field of the data, such as .Routes or $.Routes", n.Line, a)
					}
				default:
					return fmt.Errorf("line %d: range over %s; range over a field of the data, such as .Routes or $.Routes", n.Line, a)
				}
			}
		}
		return checkBranch(&n.BranchNode, ranges+1)
	case *parse.TemplateNode:
		return fmt.Errorf("line %d: {{template}} is not supported", n.Line)
	default:
		return fmt.Errorf("%s is not supported in a routes-file template", n)
	}
	return nil
}

func checkBranch(b *parse.BranchNode, ranges int) error {
	if err := checkPipe(b.Pipe); err != nil {
		return err
	}
	if err := checkTemplate(b.List, ranges); err != nil {
		return err
	}
	if b.ElseList != nil {
		return checkTemplate(b.ElseList, ranges)
	}
	return nil
}

func checkPipe(p *parse.PipeNode) error {
	if p == nil {
		return nil
	}
	for _, c := range p.Cmds {
		for _, a := range c.Args {
			switch a := a.(type) {
			case *parse.IdentifierNode:
				if !templateFuncs[a.Ident] {
					return fmt.Errorf("line %d: function %q is not supported; a routes-file template may call only eq, ne, lt, le, gt, ge, and, or, not and len", p.Line, a.Ident)
				}
			case *parse.PipeNode:
				if err := checkPipe(a); err != nil {
					return err
				}
			case *parse.ChainNode:
				if pn, ok := a.Node.(*parse.PipeNode); ok {
					if err := checkPipe(pn); err != nil {
						return err
					}
				}
			}
		}
	}
	return nil
}
