#!/usr/bin/env bash
# The size of the state after many commands (issue "scale", item 4):
# BenchmarkStateSize in state/size_test.go builds a fleet of MODULES modules
# (10,000) over 100 nodes, then applies COMMANDS commands (100,000) through
# the FSM, pairs of an unassign and the assign back of one module, under
# mesh init's default history bound (100 versions, 90 days). It prints
# state.db (after a WAL checkpoint) and the snapshot at every tenth of the
# way and at the end, so one sees where they level off.
# Usage: bash bench/statesize.sh [MODULES [COMMANDS]]
#   (no root; 10,000 modules and 100,000 commands take about an hour here,
#    1,000 and 20,000 a few minutes)
set -euo pipefail
cd "$(dirname "$0")/.."
. contrib/lib.sh
ensure_go
out=$(MESH_STATE_MODULES="${1:-10000}" MESH_STATE_COMMANDS="${2:-100000}" go test -run '^$' -bench '^BenchmarkStateSize$' -benchtime 1x -timeout 180m ./state/ 2>&1) || { echo "$out" | tail -30; exit 1; }
echo "$out" | grep -o 'modules=.*' | sed 's/^/statesize /'
echo "$out" | grep '^BenchmarkStateSize'
