package state

import (
	"context"
	"errors"
	"strings"
	"testing"
)

func rollMail(update string) string {
	return `module: mail
` + update + `resources:
  - directory: /srv/mail
  - secret: /srv/mail/smtp.password
    name: smtp
  - container: mail.server
    image: docker.io/library/busybox:1.36
    restart-on: [/srv/mail/smtp.password]
    health:
      command: ["true"]
  - container: mail.other
    image: docker.io/library/busybox:1.36
`
}

// A new value of a secret of a module whose changes roll out reaches one
// node at a time, as a new manifest does (issue 29 item 3, "a secret it
// reads"): the nodes not reached keep the value before (its digest in
// their plans, its sealed value readable by its digest), which nothing
// else can take from them mid-rollout; a failed step puts the value
// before back everywhere; done forgets it; a node assigned meanwhile,
// which could not open the value before, takes the new one at once; a
// proposer that does not ask for the format sets it everywhere at once;
// replicas that apply the same log agree.
func TestSecretRollout(t *testing.T) {
	ctx := context.Background()
	s := openStore(t)
	var idx uint64
	var log []Request
	apply := func(r Request) {
		t.Helper()
		log = append(log, r)
		mustApply(t, s, &idx, r)
	}
	refused := func(r Request, want string) {
		t.Helper()
		before := dumpJSON(t, s)
		log = append(log, r)
		err := applyErr(t, s, &idx, r)
		var rule *RuleError
		if !errors.As(err, &rule) || !strings.Contains(err.Error(), want) {
			t.Fatalf("%s: %v; want a refusal saying %q", Describe(r), err, want)
		}
		if !sameState(before, dumpJSON(t, s)) {
			t.Fatalf("the refused %s changed the state", Describe(r))
		}
	}
	set := func(value string, keys ...string) *SecretSetRequest {
		r := setReq("mail", "smtp", value, keys...)
		r.Rollout = true
		return r
	}
	apply(&InitRequest{MeshID: "m-1", Node: Node{Name: "ace", Address: "10.0.0.1", SealKey: "kA"}})
	apply(&NodeAddRequest{Node: Node{Name: "bee", Address: "10.0.0.2", SealKey: "kB"}})
	apply(&NodeAddRequest{Node: Node{Name: "cat", Address: "10.0.0.3", SealKey: "kC"}})
	apply(&NodeAddRequest{Node: Node{Name: "dog", Address: "10.0.0.4", SealKey: "kD"}})
	apply(&ModuleAddRequest{Modules: []ModuleSpec{spec("mail.yaml", rollMail(""))}})
	for _, n := range []string{"cat", "ace", "bee"} { // assignment order: cat first
		apply(&AssignRequest{Assignment: Assignment{Node: n, Module: "mail"}})
	}
	ref := SecretRef{Module: "mail", Name: "smtp"}
	keys := []string{"kA", "kB", "kC"}
	digest := func(node string) string { return secretsIn(t, s, node)["/srv/mail/smtp.password"]["smtp"] }
	digests := func() [3]string { return [3]string{digest("cat"), digest("ace"), digest("bee")} }
	rollout := func() Rollout {
		t.Helper()
		rs, err := s.Rollouts(ctx)
		if err != nil || len(rs) != 1 {
			t.Fatalf("rollouts: %+v %v", rs, err)
		}
		return rs[0]
	}
	held := func() int {
		t.Helper()
		var n int
		if err := s.db.QueryRow(`SELECT COUNT(*) FROM held_secrets`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if c := NewCommand(set("pw1", keys...)); c.V != secretRolloutFormat {
		t.Fatalf("a secret.set that rolls out is written in format %d", c.V)
	}
	if c := NewCommand(setReq("mail", "smtp", "pw1", keys...)); c.V != secretFormat {
		t.Fatalf("a secret.set that does not roll out is written in format %d", c.V)
	}

	// The first value: there is nothing before it to keep, so every node
	// takes it at once (what reads it waited for it).
	apply(set("pw1", keys...))
	d1 := set("pw1").Digest
	if got := digests(); got != [3]string{d1, d1, d1} {
		t.Fatalf("first value: %v", got)
	}
	if rs, _ := s.Rollouts(ctx); len(rs) != 0 || held() != 0 {
		t.Fatalf("a first value started a rollout: %+v, %d held", rs, held())
	}

	// A new value: cat first; ace and bee keep pw1.
	apply(set("pw2", keys...))
	d2, v2 := set("pw2").Digest, idx
	if got := digests(); got != [3]string{d2, d1, d1} {
		t.Fatalf("the first step reaches cat only: %v", got)
	}
	r := rollout()
	if r.Secret != "smtp" || r.To != v2 || r.State != RolloutRunning || strings.Join(r.Reached, " ") != "cat" {
		t.Fatalf("rollout: %+v", r)
	}
	for _, c := range []struct{ digest, sealed string }{{d1, "SEALED:pw1"}, {d2, "SEALED:pw2"}, {"", "SEALED:pw2"}} {
		v, err := s.SecretSealedAt(ctx, ref, c.digest)
		if err != nil || v.Sealed != c.sealed || (c.digest != "" && v.Digest != c.digest) {
			t.Fatalf("the value of digest %q: %+v %v; want %s", c.digest, v, err, c.sealed)
		}
	}
	if _, err := s.SecretSealedAt(ctx, ref, strings.Repeat("9", 64)); err == nil || !strings.Contains(err.Error(), "next plan") {
		t.Fatalf("a digest neither current nor held: %v", err)
	}
	refused(set("pw3", keys...), "rolling out a new value of secret smtp (v"+itoa(v2)+")")
	refused(&SecretRemoveRequest{SecretRef: ref}, "rolling out a new value of secret smtp")
	refused(&ModuleAddRequest{Modules: []ModuleSpec{spec("mail.yaml", rollMail("update: {max-parallel: 2}\n"))}}, "rolling out a new value of secret smtp")
	// The same value again changes nothing and is not refused.
	pv, _ := s.Plan(ctx, "ace")
	apply(set("pw2", keys...))
	if pv2, _ := s.Plan(ctx, "ace"); pv2.Version != pv.Version || rollout().To != v2 {
		t.Fatalf("the same value again changed ace's plan or the rollout")
	}
	if pv, err := s.Plan(ctx, "cat"); err != nil || pv.Cause != "mesh secret set mail smtp" {
		t.Fatalf("cat's plan cause: %q %v", pv.Cause, err)
	}

	// A node assigned mid-rollout could not open pw1: it takes pw2.
	apply(&AssignRequest{Assignment: Assignment{Node: "dog", Module: "mail"}})
	if got := digest("dog"); got != d2 {
		t.Fatalf("dog, assigned mid-rollout, has %q; want the new value", got)
	}
	if got := digests(); got != [3]string{d2, d1, d1} {
		t.Fatalf("an assign mid-rollout moved the others: %v", got)
	}
	apply(&UnassignRequest{Assignment: Assignment{Node: "dog", Module: "mail"}})

	apply(&RolloutStepRequest{Module: "mail", To: v2, Reach: []string{"ace"}, Why: "cat healthy for 10s", Secret: "smtp"})
	if got := digests(); got != [3]string{d2, d2, d1} {
		t.Fatalf("after the step to ace: %v", got)
	}
	pv, _ = s.Plan(ctx, "ace")
	if !strings.Contains(pv.Cause, "rollout of mail's secret smtp (v"+itoa(v2)+") moves on to ace") {
		t.Fatalf("ace's plan cause: %q", pv.Cause)
	}
	// bee fails: every node goes back to pw1, and pw1 is the secret again.
	apply(&RolloutStepRequest{Module: "mail", To: v2, Failed: "ace: container mail.server is unhealthy", Secret: "smtp"})
	if got := digests(); got != [3]string{d1, d1, d1} {
		t.Fatalf("after the auto-revert: %v", got)
	}
	if v, err := s.SecretSealed(ctx, ref); err != nil || v.Sealed != "SEALED:pw1" || v.Digest != d1 {
		t.Fatalf("the secret after the revert: %+v %v", v, err)
	}
	if r := rollout(); r.State != RolloutReverted || held() != 0 {
		t.Fatalf("after the revert: %+v, %d held", r, held())
	}

	// Again, to the end: done forgets pw1.
	apply(set("pw2", keys...))
	v2 = idx
	apply(&RolloutStepRequest{Module: "mail", To: v2, Reach: []string{"ace"}, Why: "w"})
	apply(&RolloutStepRequest{Module: "mail", To: v2, Reach: []string{"bee"}, Why: "w"})
	apply(&RolloutStepRequest{Module: "mail", To: v2, Done: true, Why: "w"})
	if got := digests(); got != [3]string{d2, d2, d2} || held() != 0 || rollout().State != RolloutDone {
		t.Fatalf("after done: %v, %d held, %+v", got, held(), rollout())
	}
	if _, err := s.SecretSealedAt(ctx, ref, d1); err == nil {
		t.Fatal("the value before is still readable after the rollout ended")
	}

	// Without auto-revert: a stop keeps cat on the new value and the others
	// on the one before; a fix rolls out from the start and the others still
	// keep the value from before the stopped rollout; revert puts it back.
	apply(&ModuleAddRequest{Modules: []ModuleSpec{spec("mail.yaml", rollMail("update: {auto-revert: false}\n"))}})
	mv := idx
	apply(&RolloutStepRequest{Module: "mail", To: mv, Reach: []string{"ace"}, Why: "w"})
	apply(&RolloutStepRequest{Module: "mail", To: mv, Reach: []string{"bee"}, Why: "w"})
	apply(&RolloutStepRequest{Module: "mail", To: mv, Done: true, Why: "w"})
	apply(set("pw3", keys...))
	v3, d3 := idx, set("pw3").Digest
	apply(&RolloutStepRequest{Module: "mail", To: v3, Failed: "cat: broken", Secret: "smtp"})
	if got := digests(); got != [3]string{d3, d2, d2} || rollout().State != RolloutFailed {
		t.Fatalf("after a stop without revert: %v %+v", got, rollout())
	}
	apply(set("pw4", keys...))
	d4 := set("pw4").Digest
	if got := digests(); got != [3]string{d4, d2, d2} {
		t.Fatalf("a fix after the stop: %v", got)
	}
	if v, err := s.SecretSealedAt(ctx, ref, d2); err != nil || v.Sealed != "SEALED:pw2" {
		t.Fatalf("the value the others keep after a fix: %+v %v", v, err)
	}
	apply(&ModuleRevertRequest{Module: "mail"})
	if got := digests(); got != [3]string{d2, d2, d2} || rollout().State != RolloutReverted || held() != 0 {
		t.Fatalf("a revert during the fix's rollout: %v %+v", got, rollout())
	}

	// A stopped secret rollout, then a new manifest: refused (its rollout
	// could not keep the value before for the nodes not reached) until the
	// secret is fixed or reverted; a fix that does not roll out (the
	// module on one node) ends the stopped rollout: the value everywhere.
	apply(set("pw5", keys...))
	v5 := idx
	apply(&RolloutStepRequest{Module: "mail", To: v5, Failed: "cat: broken", Secret: "smtp"})
	refused(&ModuleAddRequest{Modules: []ModuleSpec{spec("mail.yaml", rollMail("update: {auto-revert: false, max-parallel: 3}\n"))}}, "rollout of a new value of secret smtp stopped (reached: cat")
	refused(&ModulePullRequest{Module: "mail", Rollout: true}, "rollout of a new value of secret smtp stopped")
	apply(&ModuleRevertRequest{Module: "mail"})
	if got := digests(); got != [3]string{d2, d2, d2} || held() != 0 {
		t.Fatalf("a revert after a stopped secret rollout: %v, %d held", got, held())
	}
	apply(&ModuleAddRequest{Modules: []ModuleSpec{spec("mail.yaml", rollMail("update: {auto-revert: false, max-parallel: 3}\n"))}})
	if got := digests(); got != [3]string{d2, d2, d2} || rollout().Secret != "" {
		t.Fatalf("a manifest after the revert: %v, %+v", got, rollout())
	}

	// A proposer that did not ask for the format: everywhere at once.
	apply(setReq("mail", "smtp", "pw6", keys...))
	d6 := set("pw6").Digest
	if got := digests(); got != [3]string{d6, d6, d6} || held() != 0 {
		t.Fatalf("a secret.set of the older format: %v, %d held", got, held())
	}

	// Unassigned everywhere: the rollout and what it holds go.
	apply(&RolloutStepRequest{Module: "mail", To: rollout().To, Done: true, Why: "w"})
	apply(set("pw7", keys...))
	if held() != 1 {
		t.Fatalf("pw7 rolls out, yet %d values are held", held())
	}
	for _, n := range []string{"cat", "ace", "bee"} {
		apply(&UnassignRequest{Assignment: Assignment{Node: n, Module: "mail"}})
	}
	if rs, _ := s.Rollouts(ctx); len(rs) != 0 || held() != 0 {
		t.Fatalf("after unassigning everywhere: %+v, %d held", rs, held())
	}

	// Another replica applying the same log agrees.
	other := openStore(t)
	var oidx uint64
	for _, r := range log {
		oidx++
		other.Apply(oidx, encodeAt(r, t0))
	}
	if dumpJSON(t, other) != dumpJSON(t, s) {
		t.Fatal("two replicas of the same log differ")
	}
}
