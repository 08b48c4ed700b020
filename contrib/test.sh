#!/usr/bin/env bash
# Runs every check CI runs: format, vet, unit tests, integration beds, short
# fuzz runs. Installs what they need first. Usage: bash contrib/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."
. contrib/lib.sh
ensure_go
go version

say "preparing the integration beds"
need_root
# Real Podman (runc: crun refuses this kind of host's hybrid cgroups), the
# rootless tools, busybox for the beds' image; PostgreSQL for the provisioner's tests;
# curl and openssl to ask the route proxy in the examples bed; musl-gcc to
# build a musl program that resolves a short name in a container; systemd for
# systemd-analyze, which checks the units in contrib/.
apt_install podman runc uidmap slirp4netns iproute2 iptables busybox-static procps gcc libc6-dev musl-tools postgresql openssl curl systemd tcpdump iputils-ping pebble restic chromium
# The rootless bed's user, with subordinate ids (useradd adds them on Debian 12).
id meshbed >/dev/null 2>&1 || useradd -m -s /bin/bash meshbed
grep -q '^meshbed:' /etc/subuid || usermod --add-subuids 200000-265535 --add-subgids 200000-265535 meshbed

say "gofmt"
bad=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))
[ -z "$bad" ] || die "gofmt would change: $bad"

say "go vet"
go vet ./...

say "mesh check examples/*.yaml"
# The shipped manifests, through the command a user runs (the examples bed
# then runs them on three nodes).
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
go build -o "$tmp/mesh" . && "$tmp/mesh" check examples/*.yaml

say "go test -race (unit tests; the race detector needs cgo)"
# The packages that do not import the Podman bindings (those need cgo headers
# this host lacks when cgo is on); integration runs below without -race.
CGO_ENABLED=1 go test -race -count=1 -timeout 10m ./state/... ./reconciler/... ./dnsd/... ./cluster/... ./internal/... ./agent/web/...

say "go test (unit tests and integration beds)"
# What the host holds where the README's tour works, before the beds: after
# them it must hold the same (the beds make everything under their own
# directories and namespaces, and take it away).
host_paths() {
	ls -A /srv 2>/dev/null | sed 's|^|/srv/|'
	ls -A /run/mesh 2>/dev/null | sed 's|^|/run/mesh/|'
	pgrep -f 'conmon .*/var/tmp/mesh-(bed|mbed|obench)' >/dev/null && echo "a container process of a bed (conmon under /var/tmp/mesh-*)"
	ls -d /var/tmp/mesh-bed /var/tmp/mesh-mbed /var/tmp/mesh-obench /var/tmp/mesh-fleet /usr/local/lib/mesh/meshbed 2>/dev/null
	ip netns list 2>/dev/null | awk '{print "netns " $1}' | grep -E '^netns (mbn|mbedq|ob|mfn)' || true
	ip -o link show 2>/dev/null | awk -F': ' '{print "link " $2}' | grep -E '^link (mbnbr0|mbeddns0|mbn|mfn|meshwg0|meshdns0)' || true
}
before=$(host_paths)
go test -count=1 -timeout 40m ./...
after=$(host_paths)
# What is there now and was not before (a bed that cleans up what an earlier
# run left is not at fault).
left=$(comm -13 <(echo "$before" | sort) <(echo "$after" | sort) | grep . || true)
if [ -n "$left" ]; then
	die "the beds left things on the host:
$left"
fi

# Fuzz budgets are counts of executions, not durations: Go 1.26's fuzz
# coordinator can report a bare "context deadline exceeded", having found
# nothing, when a -fuzztime duration ends while a worker is busy (minimizing a
# new input takes seconds), which failed a CI run; a count has no deadline to
# race. Each count is about the time named on this 2-core machine. Every
# crasher found is kept in testdata/fuzz (FuzzImport also fails, and so keeps,
# an input that takes more than 10 s). MESH_FUZZ_* take a count (Nx) or a
# duration.
fuzz() { # target package count [minimize budget]
	go test -run '^$' -fuzz "^$1\$" -fuzztime "$3" -fuzzminimizetime "${4:-10s}" "$2"
}
say "fuzz: manifest parser"
# About 100 s: long enough to find again the class of input that once
# panicked the parser in about ten seconds.
fuzz FuzzParse ./state/manifest "${MESH_FUZZ_PARSE:-1200000x}"
say "fuzz: resolver query handler"
fuzz FuzzAnswer ./dnsd "${MESH_FUZZ_ANSWER:-400000x}" # about 30 s
say "fuzz: the resolver's fast path agrees with its general path"
fuzz FuzzFastPathAgrees ./dnsd "${MESH_FUZZ_FAST:-900000x}" # about 60 s
say "fuzz: mesh import compose"
fuzz FuzzImport ./internal/composeimport "${MESH_FUZZ_IMPORT:-20000x}" # about 30 s
say "fuzz: snapshot restore (damaged files, then odd rows)"
fuzz FuzzRestore ./state "${MESH_FUZZ_RESTORE:-100000x}" # about 20 s
# Each input applies a restore and six commands on two replicas (about 30
# inputs a second): minimization gets a count, not seconds per new input.
fuzz FuzzRestoreFields ./state "${MESH_FUZZ_RESTORE_FIELDS:-1200x}" 20x # about 45 s
# Each input applies up to 40 commands to a store that composes every node
# after each incremental composition and compares (about 40 inputs a second).
say "fuzz: incremental composition equals a full one"
fuzz FuzzIncrementalComposition ./state "${MESH_FUZZ_INCREMENTAL:-2000x}" 20x # about 50 s
say "fuzz: the rule on host names about a command's hosts equals the whole rule"
fuzz FuzzHostClashesAmong ./state "${MESH_FUZZ_HOSTS:-150000x}" # about 70 s
say "fuzz: a move's stream from a hostile peer (datacopy.Receive)"
# Each input makes and removes staging directories: on tmpfs, where a
# mkdir costs microseconds rather than ext4's half a millisecond.
TMPDIR=/dev/shm fuzz FuzzReceive ./internal/datacopy "${MESH_FUZZ_RECEIVE:-200000x}" # about 45 s
say "fuzz: a join token from anyone (the binary's download, mesh join)"
fuzz FuzzParseToken ./cluster "${MESH_FUZZ_TOKEN:-150000x}" # about 30 s

say "all checks passed"
