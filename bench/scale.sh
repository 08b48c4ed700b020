#!/usr/bin/env bash
# Scale of the replicated state (issue "scale"): a fleet of 1,000 to 10,000
# modules over 100 nodes (BenchmarkFleet in state/scale_test.go). One line
# per size:
#   scale modules=N nodes=100 assign_ms=X full_assign_ms=Y add_ms=Z ...
# assign_ms: one assign once the fleet is full, composing the nodes it can
# change (the mean of 200, two on each node; assign_p50_ms their median,
# assign_max_ms the slowest); full_assign_ms: the same, composing every
# node (as before incremental composition; the mean of 50), in the same
# run; add_ms: `module add` of one module more (the mean of 20, each its
# own module); add_all_ms: one `module add` carrying all N; restart_ms:
# `mesh restart` of one module (the mean of 20); plans_mb and
# snapshot_mb: sizes. Then how each grows from the smallest fleet to the
# largest (1.0 is flat; the issue's goal is within 1.5).
# Then the resolver (BenchmarkAssignAnswered in agent/): one line per size,
#   answer modules=N nodes=100 answer_p50_ms=X answer_p99_ms=Y whole_p50_ms=...
# answer_*: from the start of an assign's apply until this node's own
# resolver (real store, feed and dnsd server, asked over UDP on loopback)
# answers the module's name, the index patched with the names that moved;
# whole_*: the same with the index built whole after every change, in the
# same run; apply_*: the apply alone. A tenth of the modules (at most 300)
# are assigned in each kind, the patched ones first, once the resolver
# answers the fleet; the name is asked every 0.25 ms until it is answered.
# Usage: bash bench/scale.sh        (about three minutes; no root needed)
set -euo pipefail
cd "$(dirname "$0")/.."
. contrib/lib.sh
ensure_go
# sizes reads benchmark bench's lines (`BENCH/modules=N-2 iters v1 unit1 v2
# unit2 ...`) into v[N, unit] and the sizes, in order, into ms[1..n].
sizes='
$1 ~ "^" bench "/modules=" {
	split($1, kv, "="); m = kv[2] + 0
	for (i = 3; i < NF; i += 2) v[m, $(i + 1)] = $i
	ms[++n] = m
}'
out=$(go test -run '^$' -bench '^BenchmarkFleet$' -benchtime 1x -timeout 30m ./state/)
echo "$out" | awk -v bench=BenchmarkFleet "$sizes"'
END {
	for (i = 1; i <= n; i++) { m = ms[i]
		printf "scale modules=%d nodes=100 assign_ms=%.2f full_assign_ms=%.1f add_ms=%.2f add_all_ms=%.0f plans_mb=%.1f snapshot_mb=%.1f assign_full_to_incremental=%.1f assign_p50_ms=%.2f assign_max_ms=%.1f restart_ms=%.2f\n", m,
			v[m, "assign-ms"], v[m, "full-assign-ms"], v[m, "add-one-ms"], v[m, "module-add-ms"], v[m, "plans-MB"], v[m, "snapshot-MB"], v[m, "full-assign-ms"] / v[m, "assign-ms"], v[m, "assign-p50-ms"], v[m, "assign-max-ms"], v[m, "restart-ms"] }
	lo = ms[1]; hi = ms[n]
	printf "growth from %d to %d modules (x%.0f): assign x%.2f (p50 x%.2f), full assign x%.1f, add one x%.2f, restart x%.2f, plans x%.1f, snapshot x%.1f\n", lo, hi, hi / lo,
		v[hi, "assign-ms"] / v[lo, "assign-ms"], v[hi, "assign-p50-ms"] / v[lo, "assign-p50-ms"], v[hi, "full-assign-ms"] / v[lo, "full-assign-ms"], v[hi, "add-one-ms"] / v[lo, "add-one-ms"], v[hi, "restart-ms"] / v[lo, "restart-ms"], v[hi, "plans-MB"] / v[lo, "plans-MB"], v[hi, "snapshot-MB"] / v[lo, "snapshot-MB"]
}'
# The same assign in a fleet of wired modules (BenchmarkFleetWired): every
# tenth a database that accepts credentials, each other module binding to
# one, taking a credential from it and reading a secret, each with its rows
# in the tables; an assign recomposes the module's node and its database's.
#   wired modules=N nodes=100 assign_ms=X full_assign_ms=Y
out=$(go test -run '^$' -bench '^BenchmarkFleetWired$' -benchtime 1x -timeout 30m ./state/)
echo "$out" | awk -v bench=BenchmarkFleetWired "$sizes"'
END {
	for (i = 1; i <= n; i++) { m = ms[i]
		printf "wired modules=%d nodes=100 assign_ms=%.2f full_assign_ms=%.1f\n", m, v[m, "assign-ms"], v[m, "full-assign-ms"] }
	lo = ms[1]; hi = ms[n]
	printf "growth from %d to %d wired modules: assign x%.2f, full assign x%.1f\n", lo, hi, v[hi, "assign-ms"] / v[lo, "assign-ms"], v[hi, "full-assign-ms"] / v[lo, "full-assign-ms"]
}'
out=$(go test -run '^$' -bench '^BenchmarkAssignAnswered$' -benchtime 1x -timeout 30m ./agent/)
echo "$out" | awk -v bench=BenchmarkAssignAnswered "$sizes"'
END {
	for (i = 1; i <= n; i++) { m = ms[i]
		printf "answer modules=%d nodes=100 answer_p50_ms=%.2f answer_p99_ms=%.2f whole_p50_ms=%.1f whole_p99_ms=%.1f apply_p50_ms=%.1f apply_p99_ms=%.1f whole_to_patched_p50=%.1f\n", m,
			v[m, "answer-p50-ms"], v[m, "answer-p99-ms"], v[m, "whole-p50-ms"], v[m, "whole-p99-ms"], v[m, "apply-p50-ms"], v[m, "apply-p99-ms"], v[m, "whole-p50-ms"] / v[m, "answer-p50-ms"] }
	lo = ms[1]; hi = ms[n]
	printf "growth from %d to %d modules: answer p50 x%.2f, p99 x%.2f; whole p50 x%.1f\n", lo, hi,
		v[hi, "answer-p50-ms"] / v[lo, "answer-p50-ms"], v[hi, "answer-p99-ms"] / v[lo, "answer-p99-ms"], v[hi, "whole-p50-ms"] / v[lo, "whole-p50-ms"]
}'
