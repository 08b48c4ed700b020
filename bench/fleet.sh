#!/usr/bin/env bash
# Fifty real agents (issue "scale", item 3): BenchmarkFleetAgents in
# integration/fleet_bench_test.go starts 10, 25 and 50 `mesh agent`
# processes (3 voters, the rest non-voters), each in a network namespace of
# its own, with modules that declare only names, and measures over ASSIGNS
# assigns (default 50): the commit, the time until every resolver answers
# (p50/p99), the leader's CPU and bytes per command, the CPU the fleet takes
# idle, each agent's RSS, and a kill -9 of the leader (time until a write
# is accepted again and until every other resolver answers it). One line
# per size, then how each figure grows from the smallest fleet to the
# largest. Every agent runs on this one machine: on 2 cores the figures
# are the machine's contention as much as the mesh's.
# Usage: sudo bash bench/fleet.sh [ASSIGNS]    (MESH_FLEET_SIZES=10,25,50)
set -euo pipefail
cd "$(dirname "$0")/.."
. contrib/lib.sh
need_root
ensure_go
apt_install podman runc iproute2
out=$(cd integration && go test -run '^$' -bench '^BenchmarkFleetAgents$' -benchtime "${1:-50}x" -timeout 60m . 2>&1) || { echo "$out" | grep -v '^ *time=' | tail -40; exit 1; }
echo "$out" | grep -E '^(BenchmarkFleetAgents/|    fleet_bench_test)' | grep -v '^ *time=' | grep -v '^BenchmarkFleetAgents/' || true
echo "$out" | awk '
/^BenchmarkFleetAgents\/agents=/ {
	split($1, kv, "="); split(kv[2], nn, "-"); a = nn[1] + 0
	for (i = 3; i < NF; i += 2) v[a, $(i + 1)] = $i
	as[++n] = a
}
END {
	split("commit-p50-ms commit-p99-ms all-answer-p50-ms all-answer-p99-ms one-answer-p50-ms leader-cpu-ms/op leader-kB/op leader-idle-kB/s leader-idle-cores fleet-idle-cores rss-p50-MB rss-max-MB failover-write-ms failover-caught-up-ms elections-forming elections-measured", keys, " ")
	for (i = 1; i <= n; i++) { a = as[i]; line = sprintf("fleet agents=%d", a)
		for (k = 1; k in keys; k++) line = line sprintf(" %s=%s", keys[k], v[a, keys[k]])
		print line }
	lo = as[1]; hi = as[n]; line = sprintf("growth from %d to %d agents (x%.1f):", lo, hi, hi / lo)
	for (k = 1; k in keys; k++) if (v[lo, keys[k]] + 0 > 0) line = line sprintf(" %s x%.1f", keys[k], v[hi, keys[k]] / v[lo, keys[k]])
	print line
}'
