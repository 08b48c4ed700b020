#!/usr/bin/env bash
# Scale of the replicated state (issue "scale"): a fleet of 1,000 to 10,000
# modules over 100 nodes (BenchmarkFleet in state/scale_test.go). One line
# per size:
#   scale modules=N nodes=100 assign_ms=X full_assign_ms=Y add_ms=Z ...
# assign_ms: one assign once the fleet is full, composing the nodes it can
# change; full_assign_ms: the same, composing every node (as before
# incremental composition), in the same run; add_ms: `module add` of one
# module more; add_all_ms: one `module add` carrying all N; plans_mb and
# snapshot_mb: sizes. Then how each grows from the smallest fleet to the
# largest (1.0 is flat; the issue's goal is within 1.5).
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
	for (i = 1; i <= n; i++) { m = ms[i]
		printf "scale modules=%d nodes=100 assign_ms=%.1f full_assign_ms=%.1f add_ms=%.1f add_all_ms=%.0f plans_mb=%.1f snapshot_mb=%.1f assign_full_to_incremental=%.1f\n", m,
			v[m, "assign-ms"], v[m, "full-assign-ms"], v[m, "add-one-ms"], v[m, "module-add-ms"], v[m, "plans-MB"], v[m, "snapshot-MB"], v[m, "full-assign-ms"] / v[m, "assign-ms"] }
	lo = ms[1]; hi = ms[n]
	printf "growth from %d to %d modules (x%.0f): assign x%.1f, full assign x%.1f, add one x%.1f, plans x%.1f, snapshot x%.1f\n", lo, hi, hi / lo,
		v[hi, "assign-ms"] / v[lo, "assign-ms"], v[hi, "full-assign-ms"] / v[lo, "full-assign-ms"], v[hi, "add-one-ms"] / v[lo, "add-one-ms"], v[hi, "plans-MB"] / v[lo, "plans-MB"], v[hi, "snapshot-MB"] / v[lo, "snapshot-MB"]
}'
