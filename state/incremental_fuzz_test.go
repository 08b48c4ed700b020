package state

import (
	"context"
	"errors"
	"fmt"
	"testing"
)

// The modules FuzzIncrementalComposition plays with, two versions each:
// providers that accept credentials or stop accepting them, consumers that
// bind to or take a credential from another module or stop, a route and a
// routes file, a data directory (a move), a health check (a change rolls
// out one node at a time, the others holding the version before).
var incModules = map[string][2]string{
	"db": {`module: db
accepts-credentials: /srv/db/creds
resources:
  - directory: /srv/db
    data: true
  - directory: /srv/db/creds
    mode: "0700"
  - container: db.server
    image: localhost/busybox:1
    health: {command: ["true"]}
`, `module: db
resources:
  - directory: /srv/db
    data: true
  - container: db.server
    image: localhost/busybox:2
    health: {command: ["true"]}
`},
	"app": {`module: app
routes:
  - {name: app, port: 8080}
resources:
  - directory: /srv/app
  - binding: /srv/app/db.binding
    provider: db
  - credential: /srv/app/db.password
    provider: db
  - container: app.server
    image: localhost/busybox:1
    health: {command: ["true"]}
`, `module: app
routes:
  - {name: app, port: 8080}
resources:
  - directory: /srv/app
  - binding: /srv/app/web.binding
    provider: web
  - container: app.server
    image: localhost/busybox:2
    health: {command: ["true"]}
`},
	"web": {`module: web
resources:
  - directory: /srv/web
  - binding: /srv/web/app.binding
    provider: app
`, `module: web
accepts-credentials: /srv/web/creds
resources:
  - directory: /srv/web
  - directory: /srv/web/creds
`},
	"proxy": {`module: proxy
resources:
  - directory: /srv/proxy
  - routes-file: /srv/proxy/routes.json
`, `module: proxy
resources:
  - directory: /srv/proxy
  - binding: /srv/proxy/db.binding
    provider: db
  - credential: /srv/proxy/db.password
    provider: db
  - routes-file: /srv/proxy/routes.json
`},
}

var incNames = []string{"db", "app", "web", "proxy"}

// FuzzIncrementalComposition turns its input into a sequence of commands
// over three nodes and four modules (adds of either version, assigns,
// batch assigns, unassigns, rollout steps, reverts, moves and their steps,
// pulls, restarts, public domains, a module with a secret whose values
// roll out, new sealing keys) and applies them with checkComposition on:
// after every command that composes incrementally, a full composition of
// the same input must give every node the same plan, error and bindings,
// and the same roster. A refused command is fine; a difference panics.
func FuzzIncrementalComposition(f *testing.F) {
	f.Add([]byte{0, 0, 0, 1, 1, 0, 1, 1, 1, 2, 2, 4})
	// TestIncrementalSeesHeldManifests as a sequence: app rolls out from
	// binding db to binding web, then db moves from ace to cat.
	f.Add([]byte{0, 0, 0, 1, 0, 14, 1, 0, 1, 10, 1, 1, 1, 5, 0, 13, 1, 8, 2, 0})
	// TestIncrementalAfterNodeKey as a sequence: mail on ace and bee, two
	// values of its secret, a new key for bee, then an assign elsewhere.
	f.Add([]byte{9, 24, 9, 28, 9, 36, 9, 36, 9, 16, 0, 14, 1, 10})
	f.Add([]byte{0, 0, 0, 1, 0, 2, 0, 3, 1, 0, 1, 5, 1, 9, 2, 5, 0, 5, 4, 1, 2, 1})
	f.Add([]byte{0, 0, 1, 0, 1, 1, 1, 4, 0, 4, 1, 8, 6, 1, 7, 1, 2, 4, 0, 5})
	f.Add([]byte{0, 1, 0, 0, 1, 0, 1, 3, 1, 6, 3, 7, 0, 4, 5, 0, 8, 1, 9, 0, 2, 3})
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > 80 {
			data = data[:80]
		}
		if !checkComposition {
			t.Fatal("checkComposition is off")
		}
		// Rosters cut into runs of 3 to 12 names: from 8 on, a splice
		// that leaves a run of one or two names joins it to the run
		// before (roster.go), which runs of 3 never do.
		defer func(n int) { rosterRun = n }(rosterRun)
		rosterRun = []int{3, 4, 8, 12}[len(data)%4]
		ctx := context.Background()
		s := openStore(t)
		nodes := []string{"ace", "bee", "cat"}
		var idx uint64
		apply := func(r Request) {
			idx++
			if err := s.Apply(idx, encodeAt(r, t0)); err != nil {
				var rule *RuleError
				if !errors.As(err, &rule) {
					t.Fatalf("%s: %v", r.describe(), err)
				}
			}
		}
		apply(&InitRequest{MeshID: "m-1", Domain: "internal", Node: Node{Name: "ace", Address: "10.0.0.1", SealKey: "kA"}})
		apply(&NodeAddRequest{Node: Node{Name: "bee", Address: "10.0.0.2", Voter: true, SealKey: "kB"}})
		apply(&NodeAddRequest{Node: Node{Name: "cat", Address: "10.0.0.3", PublicDomain: "example.org", SealKey: "kC"}})
		secrets := func(m string) []Secret {
			var out []Secret
			for _, c := range incNames {
				for _, p := range incNames {
					if c == m || p == m {
						out = append(out, Secret{Pair: Pair{Consumer: c, Provider: p}, Value: "v-" + c + "-" + p})
					}
				}
			}
			return out
		}
		for i := 0; i+1 < len(data); i += 2 {
			op, arg := data[i]%10, int(data[i+1])
			m := incNames[arg%len(incNames)]
			n := nodes[(arg/len(incNames))%len(nodes)]
			switch op {
			case 0:
				v := (arg / 12) % 2
				apply(&ModuleAddRequest{Modules: []ModuleSpec{spec(m+".yaml", incModules[m][v])}, Secrets: secrets(m)})
			case 1:
				apply(&AssignRequest{Assignment: Assignment{Node: n, Module: m}, Secrets: secrets(m)})
			case 2:
				apply(&UnassignRequest{Assignment: Assignment{Node: n, Module: m}})
			case 3:
				other := incNames[(arg/12+1)%len(incNames)]
				if other == m {
					other = incNames[(arg+1)%len(incNames)]
				}
				apply(&AssignRequest{Assignment: Assignment{Node: n, Module: m}, More: []string{other}, Secrets: append(secrets(m), secrets(other)...)})
			case 4:
				rs, err := s.Rollouts(ctx)
				if err != nil {
					t.Fatal(err)
				}
				for _, r := range rs {
					if r.Module == m {
						switch arg / 12 % 3 {
						case 0:
							apply(&RolloutStepRequest{Module: m, To: r.To, Reach: []string{n}, Why: "fuzz"})
						case 1:
							apply(&RolloutStepRequest{Module: m, To: r.To, Done: true, Why: "fuzz"})
						default:
							apply(&RolloutStepRequest{Module: m, To: r.To, Failed: "fuzz"})
						}
					}
				}
			case 5:
				apply(&ModuleRevertRequest{Module: m})
			case 6:
				apply(&ModuleMoveRequest{Module: m, From: n, To: nodes[(arg/12+1)%len(nodes)]})
			case 7:
				mvs, err := s.Moves(ctx, m)
				if err != nil {
					t.Fatal(err)
				}
				for _, mv := range mvs {
					next := map[string]string{MoveCopy: MoveStart, MoveStart: MoveDone}[mv.Phase]
					if arg/12%2 == 1 && next != "" {
						next = MoveAborted
					}
					apply(&MoveStepRequest{Module: m, ID: mv.ID, From: mv.Phase, To: next, Reason: "fuzz", Finish: next == ""})
				}
			case 8:
				switch arg % 3 {
				case 0:
					apply(&ModulePullRequest{Module: m})
				case 1:
					apply(&ModuleRestartRequest{Module: m, Node: n})
				default:
					// Refused while assigned; else the catalogue kept loses it.
					apply(&ModuleRemoveRequest{Name: m})
				}
			case 9:
				switch arg / 12 % 4 {
				case 0:
					apply(&PublicDomainRequest{Node: n, Domain: fmt.Sprintf("d%d.example.org", arg%3)})
				case 1:
					// A new sealing key: node.key composes nothing, yet a
					// secret's rollout holds back by key.
					apply(&NodeKeyRequest{Node: n, SealKey: fmt.Sprint("k", n, idx)})
				case 2:
					apply(&ModuleAddRequest{Modules: []ModuleSpec{spec("mail.yaml", rollMail(""))}})
					apply(&AssignRequest{Assignment: Assignment{Node: n, Module: "mail"}})
				default:
					// A new value of mail's secret, sealed to its nodes' keys,
					// rolling out one node at a time.
					var keys []string
					rows, err := s.db.Query(`SELECT n.seal_key FROM assignments a JOIN nodes n ON n.name = a.node WHERE a.module = 'mail' ORDER BY n.seal_key`)
					if err != nil {
						t.Fatal(err)
					}
					for rows.Next() {
						var k string
						rows.Scan(&k)
						keys = append(keys, k)
					}
					rows.Close()
					r := setReq("mail", "smtp", fmt.Sprint("pw", idx), keys...)
					r.Rollout = true
					apply(r)
				}
			}
		}
	})
}
