package integration

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"
)

// nsConn opens a UDP socket to the resolver of a node, inside its network
// namespace. The socket stays in that namespace; the thread that entered it
// exits with its goroutine, so no other goroutine runs there.
func nsConn(tb testing.TB, ns string) *dns.Conn {
	var c net.Conn
	var err error
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		f, ferr := os.Open("/run/netns/" + ns)
		if ferr != nil {
			err = ferr
			return
		}
		defer f.Close()
		if err = unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
			return
		}
		c, err = net.Dial("udp", "169.254.53.53:53")
	}()
	<-done
	if err != nil {
		tb.Fatalf("resolver socket in %s: %v", ns, err)
	}
	return &dns.Conn{Conn: c}
}

// allAnswer waits until every resolver's answer for name holds addr (or,
// with want false, answers without it), at most 20 s after since.
func allAnswer(b *testing.B, conns []*dns.Conn, name, addr string, want bool, since time.Time) {
	for _, co := range conns {
		for {
			if has, ok := answerHas(co, name, addr); ok && has == want {
				break
			}
			if time.Since(since) > 20*time.Second {
				b.Fatalf("%s: the answer with %s=%v did not reach a resolver within 20 s", name, addr, want)
			}
			time.Sleep(time.Millisecond)
		}
	}
}

// answerHas says whether the answer for name holds addr; ok is false when
// no answer came (a lost packet is not an answer without addr).
func answerHas(co *dns.Conn, name, addr string) (has, ok bool) {
	addrs, ok := answerAddrs(co, name)
	return slices.Contains(addrs, addr), ok
}

func percentile(d []time.Duration, p float64) float64 {
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := int(float64(len(s)-1) * p)
	return float64(s[i].Microseconds()) / 1000
}

// BenchmarkMultiNode assigns modules, one per iteration, through the leader's
// local API and measures (1) the commit: from the request to its answer, with
// three voters; (2) from the answer to the module's name being answered by all
// three nodes' resolvers. Run it with -benchtime 100x (bench/multi.sh).
func BenchmarkMultiNode(b *testing.B) {
	n, _ := startThree(b)
	var files []string
	for i := 0; i < b.N; i++ {
		name := fmt.Sprintf("bedb%04d", i)
		files = append(files, n[1].manifest(name, "module: {{name}}\n", map[string]string{"name": name}))
	}
	n[1].mesh(append([]string{"module", "add"}, files...)...)
	var conns []*dns.Conn
	for i := 1; i <= 3; i++ {
		conns = append(conns, nsConn(b, n[i].h.netns))
	}
	// The local API of the leader (n1 bootstrapped the mesh and leads it).
	sock := filepath.Join(n[1].n.dir, "mesh.sock")
	client := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}}
	var commit, answered []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		module := fmt.Sprintf("bedb%04d", i)
		t0 := time.Now()
		resp, err := client.Post("http://mesh/v1/assign", "application/json", bytes.NewReader([]byte(`{"node":"n2","module":"`+module+`"}`)))
		if err != nil || resp.StatusCode != 200 {
			b.Fatalf("assign %s: %v %v", module, err, resp)
		}
		resp.Body.Close()
		t1 := time.Now()
		commit = append(commit, t1.Sub(t0))
		allAnswer(b, conns, module+".internal", n[2].oaddr(), true, t1)
		answered = append(answered, time.Since(t1))
	}
	b.StopTimer()
	b.ReportMetric(percentile(commit, 0.5), "commit-p50-ms")
	b.ReportMetric(percentile(commit, 0.99), "commit-p99-ms")
	b.ReportMetric(percentile(answered, 0.5), "answered-p50-ms")
	b.ReportMetric(percentile(answered, 0.99), "answered-p99-ms")
}

var healthChangedRE = regexp.MustCompile(`^time=(\S+) .*msg="container health changed".* to=(\w+)`)

// BenchmarkHealthChange measures, as BenchmarkMultiNode does for an assign,
// how soon a change of a container's health reaches every resolver. A
// module runs on n1 and n2; n2's check is turned failing and passing again
// from inside its container, b.N changes in all. Two figures: from the
// answer to the write that carries it (n2's report, as BenchmarkMultiNode
// measures from the assign's answer), and from the moment n2's agent logs
// the change (the whole way: the report's proposal, its forwarding to the
// leader and the commit included).
func BenchmarkHealthChange(b *testing.B) {
	n, _ := startThree(b)
	hc := n[1].manifest("bedhb", bedHealthy, map[string]string{"name": "bedhb", "check": `"test", "-e", "/tmp/ok"`})
	os.WriteFile(hc, []byte(strings.Replace(mustRead(b, hc), "retries: 2\n      start-period: 2s", "retries: 1\n      start-period: 0s", 1)), 0o644)
	n[1].mesh("module", "add", hc)
	n[1].mesh("assign", "n1", "bedhb", "--wait")
	n[1].mesh("assign", "n2", "bedhb", "--wait")
	var conns []*dns.Conn
	for i := 1; i <= 3; i++ {
		conns = append(conns, nsConn(b, n[i].h.netns))
	}
	logged := func(from int, re *regexp.Regexp, want string) time.Time {
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(time.Millisecond) {
			n[2].mu.Lock()
			for _, l := range n[2].lines[min(from, len(n[2].lines)):] {
				if m := re.FindStringSubmatch(l); m != nil && (want == "" || m[2] == want) {
					n[2].mu.Unlock()
					at, _ := time.Parse(time.RFC3339Nano, m[1])
					return at
				}
			}
			n[2].mu.Unlock()
			if time.Now().After(deadline) {
				b.Fatalf("n2 did not log %s %s within 20 s", re, want)
			}
		}
	}
	var fromAnswer, fromChange []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		from := n[2].logLen()
		want := "unhealthy"
		if i%2 == 0 {
			n[2].h.podman("exec", "bedhb.server", "rm", "/tmp/ok")
		} else {
			n[2].h.podman("exec", "bedhb.server", "touch", "/tmp/ok")
			want = "healthy"
		}
		changed := logged(from, healthChangedRE, want)
		answered := logged(from, healthSentRE, "")
		allAnswer(b, conns, "bedhb.internal", n[2].oaddr(), want == "healthy", changed)
		fromAnswer = append(fromAnswer, max(0, time.Since(answered)))
		fromChange = append(fromChange, time.Since(changed))
		// Past the agent's spacing of health reports (one a second), so
		// that it never holds the next change back.
		time.Sleep(time.Second)
	}
	b.StopTimer()
	b.ReportMetric(percentile(fromAnswer, 0.5), "answered-p50-ms")
	b.ReportMetric(percentile(fromAnswer, 0.99), "answered-p99-ms")
	b.ReportMetric(percentile(fromChange, 0.5), "from-change-p50-ms")
	b.ReportMetric(percentile(fromChange, 0.99), "from-change-p99-ms")
}

var healthSentRE = regexp.MustCompile(`^time=(\S+) .*msg="report applied"()`)

func mustRead(tb testing.TB, p string) string {
	b, err := os.ReadFile(p)
	if err != nil {
		tb.Fatal(err)
	}
	return string(b)
}
