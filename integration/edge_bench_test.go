package integration

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"
)

// BenchmarkRoutedHTTPS is issue 28's figure: from `mesh assign` of a routed
// module to its first HTTPS answer that curl verifies with the ACME CA's
// root, against Debian's pebble validating HTTP-01 through the mesh's
// resolver, with the example route proxy (Caddy) on n2. Run by hand:
//
//	go test -run '^$' -bench RoutedHTTPS -benchtime 10x ./integration/
//
// It prints p50 and the slowest over the iterations (each a new module).
func BenchmarkRoutedHTTPS(b *testing.B) {
	n, _ := startThree(b)
	acme := startPebble(b, n[3])
	mk := exec.Command("bash", "../contrib/example-images.sh", meshBin)
	mk.Env = append(os.Environ(), "CONTAINERS_CONF="+n[2].h.conf,
		"PODMAN=nsenter --mount="+filepath.Join(multiMnt, n[2].h.netns)+" --wd="+cwd()+" podman --root "+n[2].h.dir+"/root --runroot "+n[2].h.dir+"/runroot")
	if out, err := mk.CombinedOutput(); err != nil {
		b.Fatalf("contrib/example-images.sh: %v\n%s", err, out)
	}
	n[1].mesh("module", "add", "../examples/route-proxy.yaml")
	n[1].mesh("node", "public-domain", "n2", "bench.example")
	n[1].mesh("node", "acme", "n2", "--directory", acme.directory, "--ca-root", acme.tlsRoot)
	n[1].mesh("assign", "n2", "route-proxy", "--wait")
	root := acme.root(b)
	var took []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		name := fmt.Sprintf("app%d", i)
		f := filepath.Join(b.TempDir(), name+".yaml")
		os.WriteFile(f, []byte(fmt.Sprintf(`module: %[1]s
routes:
  - {name: %[1]s, port: %[2]d}
resources:
  - container: %[1]s.web
    image: docker.io/library/busybox:1.35
    command: ["sh", "-c", "mkdir -p /www && echo %[1]s > /www/index.html && exec httpd -f -p %[2]d -h /www"]
    ports: ["%[2]d:%[2]d"]
`, name, 9100+i)), 0o644)
		n[1].mesh("module", "add", f)
		start := time.Now()
		n[1].mesh("assign", "n2", name)
		host := name + ".bench.example"
		eventually(b, 2*time.Minute, host+" over verified HTTPS", func() (bool, string) {
			out, err := exec.Command("ip", "netns", "exec", n[3].h.netns, "curl", "-sS", "-m", "5", "--cacert", root,
				"--resolve", host+":443:"+n[2].addr(), "https://"+host+"/").CombinedOutput()
			return err == nil && strings.Contains(string(out), name), string(out)
		})
		took = append(took, time.Since(start))
	}
	b.StopTimer()
	sort.Slice(took, func(i, j int) bool { return took[i] < took[j] })
	b.ReportMetric(took[len(took)/2].Seconds(), "p50-s")
	b.ReportMetric(took[len(took)-1].Seconds(), "max-s")
	b.Logf("assign to first verified HTTPS over %d modules: p50 %s, slowest %s", len(took), took[len(took)/2].Round(10*time.Millisecond), took[len(took)-1].Round(10*time.Millisecond))
}
