package web

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"mesh/cluster/api"
	"mesh/state"
)

// BenchmarkFleetPage renders the fleet page, the page every operator
// opens first, of 100 nodes and 1,000 modules (ten to a node) on a real
// one-node member, through the handler and the local API as the agent
// serves it (a CPU profile of it: -cpuprofile). The nodes other than the
// member run no agent: the page shows them unreachable, the largest page
// the fleet makes. bench/web.sh measures the same page from a browser on
// a real mesh; this one is for finding where the time goes.
func BenchmarkFleetPage(b *testing.B) {
	bed := startBed(b)
	bed.t = b
	ctx := context.Background()
	names := []string{"ace"}
	for i := 1; i < 100; i++ {
		name := fmt.Sprintf("d%03d", i)
		if _, err := bed.member.Node.Propose(ctx, &state.NodeAddRequest{Node: state.Node{Name: name, Address: fmt.Sprintf("10.1.%d.%d", i/250, i%250+1)}}); err != nil {
			b.Fatal(err)
		}
		names = append(names, name)
	}
	var texts []state.ModuleText
	for j := range 1000 {
		texts = append(texts, state.ModuleText{File: fmt.Sprintf("w%04d.yaml", j), Text: strings.ReplaceAll(appManifest, "app", fmt.Sprintf("w%04d", j))})
	}
	if _, err := bed.client.AddModules(ctx, api.AddRequest{Modules: texts}); err != nil {
		b.Fatal(err)
	}
	for j := range 1000 {
		if _, err := bed.client.Assign(ctx, state.OpAssign, names[1+j%99], fmt.Sprintf("w%04d", j)); err != nil {
			b.Fatal(err)
		}
	}
	br := bed.browser()
	br.login()
	code, body := br.get("/")
	if code != 200 || strings.Count(body, `class="module-row"`) != modulesPerPage || !strings.Contains(body, "of 1000") || strings.Count(body, `class="node-row"`) != 100 {
		b.Fatalf("fleet page: %d, %d modules, %d nodes", code, strings.Count(body, `class="module-row"`), strings.Count(body, `class="node-row"`))
	}
	b.ReportMetric(float64(len(body))/1024, "page-KB")
	if f := os.Getenv("MESH_WEB_DUMP"); f != "" {
		os.WriteFile(f, []byte(body), 0o644) // the page, to study in a browser
	}
	b.ResetTimer()
	start := time.Now()
	for b.Loop() {
		if code, _ := br.get("/"); code != http.StatusOK {
			b.Fatal(code)
		}
	}
	b.ReportMetric(float64(time.Since(start).Microseconds())/1000/float64(b.N), "ms/page")
}
