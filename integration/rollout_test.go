package integration

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Issue 29 item 3, rollouts, on three nodes: a good version reaches one node
// at a time, each after the last was healthy for healthy-for, the waits
// shown; a broken one stops at its first node, which goes back to the
// previous version while the other two are never touched; mesh module
// revert goes back through a rollout; a leader killed mid-rollout, the
// next one goes on where it was.

const bedRoll = `module: roll
update: {max-parallel: 1, healthy-for: 3s, auto-revert: true}
resources:
  - container: roll.web
    image: {{image}}
    env: {TAG: "{{tag}}"}
    command: ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1; done"]
    health:
      command: ["sh", "-c", "{{check}}"]
      interval: 1s
      retries: 2
      start-period: 1s
`

// bedRollSecret is roll reading a secret, which its health check judges: a
// value holding "bad" makes it unhealthy (issue 29 item 3: a change to a
// secret the module reads rolls out like a new manifest).
const bedRollSecret = `module: roll
update: {max-parallel: 1, healthy-for: 3s, auto-revert: true}
resources:
  - directory: /srv/bedroll
  - secret: /srv/bedroll/tag
    name: tag
  - container: roll.web
    image: {{image}}
    env: {TAG: "v5"}
    mounts: ["/srv/bedroll/tag:/run/tag:ro"]
    restart-on: [/srv/bedroll/tag]
    command: ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1; done"]
    health:
      command: ["sh", "-c", "! grep -q bad /run/tag"]
      interval: 1s
      retries: 2
      start-period: 1s
`

type rolloutView struct {
	Leader   string `json:"leader"`
	Rollouts []struct {
		Module  string   `json:"module"`
		Secret  string   `json:"secret"`
		From    uint64   `json:"from_version"`
		To      uint64   `json:"to_version"`
		State   string   `json:"state"`
		Reached []string `json:"reached"`
		Reason  string   `json:"reason"`
		Waiting string   `json:"waiting"`
	} `json:"rollouts"`
}

func (a *agent) rollouts() rolloutView {
	var v rolloutView
	if err := json.Unmarshal([]byte(a.mesh("status", "--json")), &v); err != nil {
		a.h.t.Fatal(err)
	}
	return v
}

func TestRolloutBed(t *testing.T) {
	n, _ := startThree(t)
	byName := map[string]*agent{"n1": n[1], "n2": n[2], "n3": n[3]}
	image := bedImage
	roll := func(tag, check string) string {
		return n[1].manifest("roll", bedRoll, map[string]string{"tag": tag, "check": check, "image": image})
	}
	// A second image (another ID), which the broken version runs.
	second := strings.TrimSuffix(bedImage, ":1") + ":2"
	for _, a := range n[1:] {
		a.h.podman("import", "--change", `CMD ["/bin/sh"]`, "--message", "the second", filepath.Join(a.h.dir, "rootfs.tar"), second)
	}
	ids := func() []string {
		return []string{n[1].h.containerID("roll.web"), n[2].h.containerID("roll.web"), n[3].h.containerID("roll.web")}
	}
	tags := func() string {
		var out []string
		for _, a := range n[1:] {
			o, e, code := n[1].meshRun(nil, "exec", "roll.web", "--node", a.name, "--", "sh", "-c", "echo $TAG")
			if code != 0 {
				o = "(" + strings.TrimSpace(e) + ")" // being replaced: the callers wait
			}
			out = append(out, strings.TrimSpace(o))
		}
		return strings.Join(out, " ")
	}
	n[1].mesh("module", "add", roll("v1", "true"))
	for _, node := range []string{"n1", "n2", "n3"} {
		n[1].mesh("assign", node, "roll", "--wait")
	}
	before := ids()

	// A good version: one node at a time, in assignment order, each after
	// the one before was healthy for 3 s; --wait shows the waits.
	start := time.Now()
	out := n[1].mesh("module", "add", roll("v2", "true"), "--wait", "--timeout", "3m")
	took := time.Since(start)
	last := -1
	for _, want := range []string{"1/3 nodes, waiting on n1", "2/3 nodes, waiting on n2", "3/3 nodes, waiting on n3", "done: n1, n2, n3 healthy for 3s"} {
		i := strings.Index(out, want)
		if i < last {
			t.Fatalf("--wait output lacks %q after the previous step:\n%s", want, out)
		}
		last = i
	}
	good := ids()
	img := func(a *agent) string {
		return strings.TrimSpace(a.h.podman("inspect", "--format", "{{.Image}}", "roll.web"))
	}
	goodImage := img(n[1])
	for i := range good {
		if good[i] == before[i] || good[i] == "" {
			t.Fatalf("node n%d's container was not replaced by the rollout: %v -> %v", i+1, before, good)
		}
	}
	if got := tags(); got != "v2 v2 v2" {
		t.Fatalf("after the good rollout (--wait returned): %s", got)
	}
	if w := n[2].mesh("why", "n2", "roll.web"); !strings.Contains(w, "moves on to n2 (n1 healthy for 3s)") {
		t.Fatalf("mesh why does not say the rollout moved on to n2:\n%s", w)
	}
	t.Logf("a rollout of 3 nodes at healthy-for 3s took %s (at least 9 s of healthy-for)", took.Round(100*time.Millisecond))
	// From the moment a node has been healthy for healthy-for to the
	// command that changes the next node's plan.
	for _, step := range [][2]*agent{{n[1], n[2]}, {n[2], n[3]}} {
		prev, next := step[0], step[1]
		var since time.Time
		var st struct {
			Nodes []struct {
				Name   string `json:"name"`
				Report *struct {
					Health []struct {
						Container string    `json:"container"`
						Since     time.Time `json:"since"`
					} `json:"health"`
				} `json:"report"`
			} `json:"nodes"`
		}
		json.Unmarshal([]byte(n[1].mesh("status", "--json")), &st)
		for _, nd := range st.Nodes {
			if nd.Name == prev.name && nd.Report != nil {
				for _, h := range nd.Report.Health {
					if h.Container == "roll.web" {
						since = h.Since
					}
				}
			}
		}
		var plans struct {
			Versions []struct {
				Cause     string    `json:"cause"`
				CreatedAt time.Time `json:"created_at"`
			} `json:"versions"`
		}
		json.Unmarshal([]byte(n[1].mesh("plan", next.name, "--history", "--json")), &plans)
		for _, p := range plans.Versions {
			if strings.Contains(p.Cause, "moves on to "+next.name) {
				t.Logf("%s healthy for 3s -> %s's plan changed: %s", prev.name, next.name, p.CreatedAt.Sub(since.Add(3*time.Second)).Round(time.Millisecond))
				break
			}
		}
	}

	// A broken version: its check fails on n1; the rollout stops there, n1
	// goes back to v2, n2 and n3 are never touched.
	image = second
	cmd := n[1].command("module", "add", roll("v3", "false"), "--wait", "--timeout", "3m", "--data-dir", n[1].n.dir)
	image = bedImage
	b, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(b), "stopped and reverted to v") || !strings.Contains(string(b), "n1: container roll.web is unhealthy") {
		t.Fatalf("a broken version: %v\n%s", err, b)
	}
	eventually(t, 60*time.Second, "n1 back on v2", func() (bool, string) {
		got := tags()
		return got == "v2 v2 v2", got
	})
	after := ids()
	if after[1] != good[1] || after[2] != good[2] {
		t.Fatalf("n2 or n3 was touched by a rollout that stopped at n1: %v -> %v", good, after)
	}
	secondID := strings.TrimSpace(n[1].h.podman("image", "inspect", "--format", "{{.Id}}", second))
	if got := img(n[1]); got != goodImage || got == secondID {
		t.Fatalf("n1 reverted to image %s; it ran %s at v2, and %s at v3", got, goodImage, secondID)
	}
	if !strings.Contains(string(b), "container roll.web (roll): replaced; env changed; health changed; image changed") {
		t.Fatalf("the broken version did not reach n1 with its image:\n%s", b)
	}
	st := n[3].mesh("status")
	if !strings.Contains(st, "failed and was reverted to v") || !strings.Contains(st, "n1: container roll.web is unhealthy") {
		t.Fatalf("status does not say the rollout failed and why:\n%s", st)
	}
	h := n[3].mesh("module", "history", "roll")
	if strings.Count(h, "mesh module add") < 2 || !strings.Contains(h, "(current)") {
		t.Fatalf("module history:\n%s", h)
	}

	// mesh module revert after a good rollout: v1 everywhere, through a rollout.
	out = n[2].mesh("module", "revert", "roll", "--wait", "--timeout", "3m")
	if !strings.Contains(out, "done") {
		t.Fatalf("revert --wait:\n%s", out)
	}
	if got := tags(); got != "v1 v1 v1" {
		t.Fatalf("after the revert: %s", got)
	}

	// The leader killed mid-rollout: the next leader goes on.
	n[1].mesh("module", "add", roll("v4", "true"))
	eventually(t, 60*time.Second, "the rollout of v4 has reached its second node", func() (bool, string) {
		v := n[2].rollouts()
		for _, r := range v.Rollouts {
			if r.Module == "roll" && r.State == "running" && len(r.Reached) >= 2 {
				return true, ""
			}
		}
		return false, fmt.Sprintf("%+v", v)
	})
	leader := byName[n[2].rollouts().Leader]
	if leader == nil {
		t.Fatal("no leader")
	}
	leader.cmd.Process.Kill()
	leader.cmd.Wait()
	leader.cmd = nil
	leader.start()
	var other *agent
	for _, a := range n[1:] {
		if a != leader {
			other = a
		}
	}
	eventually(t, 2*time.Minute, "the rollout of v4 ends after the leader was killed", func() (bool, string) {
		v := other.rollouts()
		for _, r := range v.Rollouts {
			if r.Module == "roll" {
				return r.State == "done", fmt.Sprintf("%+v", r)
			}
		}
		return false, fmt.Sprintf("%+v", v)
	})
	if got := tags(); got != "v4 v4 v4" {
		t.Fatalf("after the rollout across a leader kill: %s", got)
	}

	checkSecretRollout(t, n, image)
}

// checkSecretRollout: a new value of a secret roll reads reaches one node
// at a time, each after the one before was healthy for 3 s; a bad value
// stops at n1, which goes back to the value before while n2 and n3 are
// never touched.
func checkSecretRollout(t *testing.T, n []*agent, image string) {
	mustSet := func(value string, args ...string) string {
		t.Helper()
		out, err := setSecret(t, n[2], []byte(value), append([]string{"roll", "tag"}, args...)...)
		if err != nil {
			t.Fatalf("mesh secret set roll tag (%q): %v\n%s", value, err, out)
		}
		return out
	}
	// Set before the manifest reads it: nothing reads it yet, nothing moves.
	mustSet("good1")
	n[1].mesh("module", "add", n[1].manifest("roll", bedRollSecret, map[string]string{"image": image}), "--wait", "--timeout", "3m")
	values := func() string {
		var out []string
		for _, a := range n[1:] {
			o, e, code := n[1].meshRun(nil, "exec", "roll.web", "--node", a.name, "--", "cat", "/run/tag")
			if code != 0 {
				o = "(" + strings.TrimSpace(e) + ")"
			}
			out = append(out, strings.TrimSpace(o))
		}
		return strings.Join(out, " ")
	}
	ids := func() []string {
		return []string{n[1].h.containerID("roll.web"), n[2].h.containerID("roll.web"), n[3].h.containerID("roll.web")}
	}
	if got := values(); got != "good1 good1 good1" {
		t.Fatalf("before the secret's rollout: %s", got)
	}
	before := ids()

	// A good value: n1, then n2, then n3, with the waits.
	start := time.Now()
	out := mustSet("good2", "--wait", "--timeout", "3m")
	took := time.Since(start)
	last := -1
	for _, want := range []string{"rollout of roll's secret tag (v", "1/3 nodes, waiting on n1", "2/3 nodes, waiting on n2", "3/3 nodes, waiting on n3", "done: n1, n2, n3 healthy for 3s"} {
		i := strings.Index(out, want)
		if i < last {
			t.Fatalf("secret set --wait output lacks %q after the previous step:\n%s", want, out)
		}
		last = i
	}
	good := ids()
	for i := range good {
		if good[i] == before[i] || good[i] == "" {
			t.Fatalf("n%d's container was not replaced by the secret's rollout: %v -> %v", i+1, before, good)
		}
	}
	if got := values(); got != "good2 good2 good2" {
		t.Fatalf("after the secret's rollout: %s", got)
	}
	if w := n[3].mesh("why", "n3", "roll.web"); !strings.Contains(w, "rollout of roll's secret tag (v") || !strings.Contains(w, "moves on to n3 (n1, n2 healthy for 3s)") {
		t.Fatalf("mesh why does not say the secret's rollout moved on to n3:\n%s", w)
	}
	t.Logf("a secret's rollout over 3 nodes at healthy-for 3s took %s", took.Round(100*time.Millisecond))

	// A bad value: n1 fails its check, goes back to good2; n2 and n3 are
	// never touched; the secret's value is good2 again.
	cmd := n[2].command("secret", "set", "roll", "tag", "--wait", "--timeout", "3m", "--data-dir", n[2].n.dir)
	cmd.Stdin = strings.NewReader("bad")
	b, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(b), "stopped and reverted to the value before") || !strings.Contains(string(b), "n1: container roll.web is unhealthy") {
		t.Fatalf("a bad value: %v\n%s", err, b)
	}
	eventually(t, 60*time.Second, "n1 back on good2", func() (bool, string) {
		got := values()
		return got == "good2 good2 good2", got
	})
	after := ids()
	if after[1] != good[1] || after[2] != good[2] || after[0] == good[0] {
		t.Fatalf("a secret's rollout that stopped at n1 (replaced there, then back): %v -> %v", good, after)
	}
	st := n[3].mesh("status")
	if !strings.Contains(st, "rollout of roll's secret tag (v") || !strings.Contains(st, "failed and was reverted to the value before") {
		t.Fatalf("status does not say the secret's rollout failed and was reverted:\n%s", st)
	}
	var list []struct {
		Name, State string
	}
	if err := json.Unmarshal([]byte(n[3].mesh("secret", "list", "--json")), &list); err != nil || len(list) != 1 || list[0].State != "sealed" {
		t.Fatalf("secret list after the revert: %+v %v", list, err)
	}
	// The value is good2 again: setting good2 changes nothing.
	if out := mustSet("good2"); !strings.Contains(out, "already this value") {
		t.Fatalf("after the revert, good2 is not the secret's value:\n%s", out)
	}
}
