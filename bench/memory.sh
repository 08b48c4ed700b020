#!/usr/bin/env bash
# Memory and abuse (issue 13, items 4 and 5): the resident memory of
#  1. an agent (one node, no Podman service: the reconciler's calls fail and
#     are retried, the rest runs), idle, after a million queries for mesh
#     names, and during and after a flood of 50,000 queries for names that
#     go upstream to a resolver that never answers, with its open file
#     descriptors and its local API checked after the flood, and with
#     floods of TCP connections held open, to the resolver and to the node
#     port; what its idle
#     RSS is made of (bench/residency: the binary's pages, anonymous memory);
#  2. the resolver as the agent runs it (bench/dnsserve, dnsd.Server) with
#     100 and with 10,000 names, before and after a million queries.
# Usage: sudo bash bench/memory.sh     (prints figures; cleans up after itself)
set -euo pipefail
cd "$(dirname "$0")/.."
. contrib/lib.sh
need_root
ensure_go
apt_install dnsperf

B=/var/tmp/mesh-membench
DNS=127.0.0.54
cleanup() { pkill -f "$B/" 2>/dev/null || true; rm -rf "$B"; }
cleanup
trap cleanup EXIT
mkdir -p "$B"
go build -o "$B/mesh" .
go build -o "$B/dnsserve" ./bench/dnsserve
go build -o "$B/residency" ./bench/residency
go build -o "$B/podlink" ./bench/podlink
go build -o "$B/tcpflood" ./bench/tcpflood

rss() { awk '/^VmRSS/ { printf "%.1f", $2 / 1024 }' "/proc/$1/status"; }
hwm() { awk '/^VmHWM/ { printf "%.1f", $2 / 1024 }' "/proc/$1/status"; }
fds() { ls "/proc/$1/fd" | wc -l; }
# until CMD succeeds, within SECONDS
within() {
	local deadline=$((SECONDS + $1)); shift
	until "$@" >/dev/null 2>&1; do
		[ $SECONDS -lt $deadline ] || die "not within the deadline: $*"
		sleep 0.1
	done
}
answers() { dnsperf -s "${1%:*}" -p "${1#*:}" -d <(echo "$2 A") -n 1 2>/dev/null | grep -q "Queries completed:.*1 (100"; }
# RSS settled: the largest of ten samples a tenth of a second apart (Go
# returns freed memory to the system lazily; this is what the node pays).
settled() { local m=0 r; for _ in $(seq 1 10); do r=$(rss "$1"); m=$(awk -v a="$m" -v b="$r" 'BEGIN { print (b > a ? b : a) }'); sleep 0.1; done; echo "$m"; }

# Queries: a million for mesh names (the node's own name, the zone's NS
# target, and unknown names of the zone), and 50,000 distinct names outside
# the mesh for the flood.
awk 'BEGIN { for (i = 0; i < 3000; i++) { k = i % 3
	if (k == 0) print "mem1.internal A"; else if (k == 1) print "ns.internal A"; else printf "nope%04d.internal A\n", i } }' > "$B/mesh-queries"
awk 'BEGIN { srand(3); for (i = 0; i < 50000; i++) printf "r%d-%d.flood.example A\n", i, int(rand() * 1e9) }' > "$B/flood-queries"

"$B/dnsserve" -sink -addr 127.0.0.1:5399 >"$B/sink.log" 2>&1 &
"$B/mesh" init --name mem1 --address 127.0.0.1 --port 17990 --data-dir "$B/data" --overlay off >/dev/null # with the overlay: bench/overlay.sh
"$B/mesh" agent --data-dir "$B/data" --dns-address "$DNS" --upstream 127.0.0.1:5399 \
	--podman-socket "unix://$B/no-podman.sock" --log-level info >"$B/agent.log" 2>&1 &
within 30 answers "$DNS:53" mem1.internal
within 30 "$B/mesh" status --data-dir "$B/data"
AGENT=$(pgrep -f "$B/mesh agent")

echo "agent (one node, resolver on $DNS):"
idle=$(settled "$AGENT")
idlefd=$(fds "$AGENT")
printf "  idle                               RSS %6s MB   fds %s\n" "$idle" "$idlefd"
# What the idle RSS is made of: the binary's own pages (clean, shared with
# the page cache) and anonymous memory (what the agent allocated).
"$B/residency" "$AGENT" | sed 's/^/  /'
# For comparison, a program that links only mesh's Podman client (Podman's
# Go bindings) and does nothing: what those packages alone cost at start.
"$B/podlink" >"$B/podlink.out" &
POD=$!
within 10 grep -q ready "$B/podlink.out"
printf "  a program that only links mesh/podman and sleeps: RSS %6s MB\n" "$(settled "$POD")"
"$B/residency" "$POD" | sed -n 's/^/  /; /pages/p'
kill "$POD"
out=$(dnsperf -s "$DNS" -d "$B/mesh-queries" -n 334 -c 4 -T 1 2>&1) # 334 x 3000 = 1,002,000 queries
printf "  after %s mesh-name queries  RSS %6s MB   (%s qps)\n" "$(echo "$out" | sed -n 's/.*Queries completed: *\([0-9]*\).*/\1/p')" "$(settled "$AGENT")" \
	"$(echo "$out" | sed -n 's/.*Queries per second: *\([0-9.]*\).*/\1/p' | cut -d. -f1)"
# The flood: all 50,000 at once (dnsperf keeps up to 10,000 outstanding),
# upstream silent. Peak descriptors are sampled while it runs.
peakfd=0
dnsperf -s "$DNS" -d "$B/flood-queries" -n 1 -q 10000 -t 6 -c 8 -T 1 >"$B/flood.out" 2>&1 &
FLOOD=$!
while kill -0 $FLOOD 2>/dev/null; do
	f=$(fds "$AGENT"); [ "$f" -gt "$peakfd" ] && peakfd=$f
	sleep 0.05
done
codes=$(sed -n 's/.*Response codes: *\(.*\)/\1/p' "$B/flood.out")
printf "  during a 50,000-name flood         RSS peak %6s MB   fds peak %s   (answers: %s)\n" "$(hwm "$AGENT")" "$peakfd" "${codes:-none}"
# Queries still in flight upstream end within the forwarding budget (4 s).
fds_back() { [ "$(fds "$AGENT")" -le $((idlefd + 8)) ]; }
within 10 fds_back
# The agent gives back what the flood took once it is over (3 s after the
# last query turned away; it logs so).
within 15 grep -q "flood of queries to forward is over" "$B/agent.log"
after=$(settled "$AGENT")
printf "  after the flood                    RSS %6s MB   fds %s\n" "$after" "$(fds "$AGENT")"
"$B/mesh" status --data-dir "$B/data" >/dev/null && echo "  the local API answers after the flood"
answers "$DNS:53" mem1.internal && echo "  mesh names are answered after the flood"
# TCP floods, as a container could send them: 3,000 connections from 20
# source addresses, each answered one held open, while the agent's
# descriptors are sampled; then its API and resolver are asked.
# held_flood LABEL TCPFLOOD-ARGS...
held_flood() {
	local label=$1 out="$B/flood-$1.out" peak=0 f tf; shift
	"$B/tcpflood" -n 3000 -sources 20 -hold 5s "$@" >"$out" 2>&1 &
	tf=$!
	until [ -s "$out" ] || ! kill -0 $tf 2>/dev/null; do
		f=$(fds "$AGENT"); [ "$f" -gt "$peak" ] && peak=$f
		sleep 0.05
	done
	f=$(fds "$AGENT"); [ "$f" -gt "$peak" ] && peak=$f
	printf "  %s flood: %s\n" "$label" "$(cat "$out")"
	printf "  during the %-23s fds peak %s\n" "$label flood" "$peak"
	"$B/mesh" status --data-dir "$B/data" >/dev/null && echo "  the local API answers with the flood's connections open"
	answers "$DNS:53" mem1.internal && echo "  mesh names are answered with the flood's connections open"
	wait $tf
}
# The resolver keeps at most 32 from a source and 256 in all open
# (dnsd.DefaultMaxTCP...) and closes the others at once.
held_flood TCP -addr "$DNS:53"
# The node port, without a node's certificate, each asking for the CA: at
# most 16 from a source and 128 in all are kept (cluster: guestsPerSource,
# guestsInAll).
held_flood node-port -node -addr 127.0.0.1:17990
# Connections that never begin their TLS handshake: the agent keeps at
# most 32 from a source and 512 in all in their handshake (cluster:
# handshakesPerSource, handshakesInAll), closing the oldest for a new one;
# the others it would hold for the handshake's 10 s.
held_flood handshake -stall -node -addr 127.0.0.1:17990
pkill -f "$B/mesh agent" || true

echo "resolver (dnsd.Server as the agent runs it, bench/dnsserve):"
for n in 100 10000; do
	"$B/dnsserve" -addr 127.0.0.1:5398 -names $n >"$B/dnsserve.log" 2>&1 &
	within 10 answers 127.0.0.1:5398 n000001.internal
	P=$(pgrep -f "$B/dnsserve -addr 127.0.0.1:5398")
	before=$(settled "$P")
	awk -v n=$n 'BEGIN { srand(4); for (i = 0; i < 3000; i++) printf "n%06d.internal A\n", int(rand() * n) }' > "$B/names-queries"
	dnsperf -s 127.0.0.1 -p 5398 -d "$B/names-queries" -n 334 -c 4 -T 1 >/dev/null 2>&1
	printf "  %5d names: RSS %6s MB at start, %6s MB after 1,002,000 queries\n" $n "$before" "$(settled "$P")"
	kill "$P"; while kill -0 "$P" 2>/dev/null; do sleep 0.1; done
done

# An agent with Podman under a step that prints 100 MB and a container that
# logs as fast as it can: its RSS and data dir stay bounded.
bash bench/bounds.sh 60
