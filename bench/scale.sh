#!/usr/bin/env bash
# Scale of the replicated state (issue 13, item 4): a fleet of 1,000 to
# 10,000 modules over 100 nodes (BenchmarkFleet in state/scale_test.go): the
# time of one `module add` carrying all of them, of one assign once the
# fleet is full (every command recomposes every node's plan), the size of
# the plans and of a snapshot; then how each grows from the smallest fleet
# to the largest (1.0 per x1 modules is linear).
# Usage: bash bench/scale.sh        (about two minutes; no root needed)
set -euo pipefail
cd "$(dirname "$0")/.."
. contrib/lib.sh
ensure_go
out=$(go test -run '^$' -bench '^BenchmarkFleet$' -benchtime 1x -timeout 30m ./state/)
echo "$out" | awk '
/^BenchmarkFleet\/modules=/ {
	split($1, kv, "="); m = kv[2] + 0
	for (i = 3; i < NF; i += 2) v[m, $(i + 1)] = $i
	ms[++n] = m
}
END {
	printf "%8s %14s %10s %10s %12s\n", "modules", "module add ms", "assign ms", "plans MB", "snapshot MB"
	for (i = 1; i <= n; i++) { m = ms[i]
		printf "%8d %14.0f %10.1f %10.1f %12.1f\n", m, v[m, "module-add-ms"], v[m, "assign-ms"], v[m, "plans-MB"], v[m, "snapshot-MB"] }
	lo = ms[1]; hi = ms[n]
	printf "growth from %d to %d modules (x%.0f): module add x%.1f, assign x%.1f, plans x%.1f, snapshot x%.1f\n", lo, hi, hi / lo,
		v[hi, "module-add-ms"] / v[lo, "module-add-ms"], v[hi, "assign-ms"] / v[lo, "assign-ms"], v[hi, "plans-MB"] / v[lo, "plans-MB"], v[hi, "snapshot-MB"] / v[lo, "snapshot-MB"]
}'
