package manifest

import (
	"strings"
	"testing"
	"time"
)

const caddyRoutes = `{{range .Routes}}http://{{.Name}} {
	reverse_proxy {{$.Address}}:{{.Port}}
}
{{end}}`

func TestRoutesTemplateRenders(t *testing.T) {
	tp, err := ParseTemplate(caddyRoutes)
	if err != nil {
		t.Fatal(err)
	}
	out, err := ExecTemplate(tp, RoutesData{Address: "10.0.0.2", Routes: []RouteData{{Name: "git.example.org", Module: "gitea", Port: 3000}, {Name: "www.example.org", Module: "web", Port: 8080}}})
	if err != nil {
		t.Fatal(err)
	}
	want := "http://git.example.org {\n\treverse_proxy 10.0.0.2:3000\n}\nhttp://www.example.org {\n\treverse_proxy 10.0.0.2:8080\n}\n"
	if out != want {
		t.Fatalf("got\n%s\nwant\n%s", out, want)
	}
	// Comparisons and len are there for a proxy's needs.
	if _, err := ParseTemplate(`{{if eq (len .Routes) 0}}none{{else}}{{range $i, $r := .Routes}}{{if ne $r.Port 443}}{{$r.Name}}{{end}}{{end}}{{end}}`); err != nil {
		t.Fatal(err)
	}
}

// A hostile manifest's template cannot make a node's state machine loop,
// recurse or allocate without bound: each of these is refused when the
// manifest is parsed, with a sentence saying what is allowed, and within
// a second (nothing here is executed unchecked).
func TestRoutesTemplateRefusesWhatCouldRunLong(t *testing.T) {
	for name, tc := range map[string]struct{ src, want string }{
		"range over a number":   {`{{range 1000000000}}{{end}}`, "range over"},
		"range over a variable": {`{{$n := 1000000000}}{{range $n}}{{end}}`, "range over"},
		"range over dot":        {`{{with 1000000000}}{{range .}}{{end}}{{end}}`, "range over"},
		"nested range":          {`{{range .Routes}}{{range $.Routes}}x{{end}}{{end}}`, "range inside a range"},
		"printf":                {`{{printf "%0999999999d" 1}}`, `function "printf"`},
		"printf in a pipeline":  {`{{if (printf "%0999999999d" 1)}}{{end}}`, `function "printf"`},
		"define":                {`{{define "a"}}{{template "a"}}{{end}}{{template "a"}}`, "not supported"},
		"misspelt field":        {`{{.Rootes}}`, "Rootes"},
		"bad syntax":            {`{{range .Routes}}`, "template"},
		"too large":             {strings.Repeat("x", MaxTemplateSize+1), "limit"},
		"call":                  {`{{call .Node}}`, `function "call"`},
	} {
		t.Run(name, func(t *testing.T) {
			start := time.Now()
			_, err := ParseTemplate(tc.src)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error with %q", err, tc.want)
			}
			if d := time.Since(start); d > 5*time.Second {
				t.Fatalf("refusing took %s", d)
			}
		})
	}
}

func TestRoutesTemplateOutputIsCapped(t *testing.T) {
	tp, err := ParseTemplate(`{{range .Routes}}` + strings.Repeat("{{.Name}}", 1000) + `{{end}}`)
	if err != nil {
		t.Fatal(err)
	}
	var d RoutesData
	for i := 0; i < 200; i++ {
		d.Routes = append(d.Routes, RouteData{Name: strings.Repeat("a", 60) + ".example.org"})
	}
	if _, err := ExecTemplate(tp, d); err == nil || !strings.Contains(err.Error(), "more than") {
		t.Fatalf("12 MB of output: %v", err)
	}
}

func TestRoutesTemplateInAManifest(t *testing.T) {
	src := "module: proxy\nresources:\n  - directory: /srv/proxy\n  - routes-file: /srv/proxy/Caddyfile\n    template: |\n      {{printf \"%d\" 1}}\n"
	_, err := Parse("proxy.yaml", []byte(src))
	if err == nil || !strings.Contains(err.Error(), "proxy.yaml:5:") || !strings.Contains(err.Error(), "printf") {
		t.Fatalf("want proxy.yaml:5: naming printf, got %v", err)
	}
	src = "module: web\nresources:\n  - directory: /srv/web\n  - file: /srv/web/x\n    template: \"{{.Node}}\"\n"
	if _, err := Parse("web.yaml", []byte(src)); err == nil || !strings.Contains(err.Error(), "does not take `template`") {
		t.Fatalf("template on a file: %v", err)
	}
	src = "module: proxy\nresources:\n  - directory: /srv/proxy\n  - routes-file: /srv/proxy/Caddyfile\n    template: |\n" + indent(caddyRoutes, "      ")
	if _, err := Parse("proxy.yaml", []byte(src)); err != nil {
		t.Fatal(err)
	}
}

func indent(s, by string) string {
	var b strings.Builder
	for _, l := range strings.SplitAfter(s, "\n") {
		if l != "" {
			b.WriteString(by + l)
		}
	}
	return b.String()
}
