#!/usr/bin/env bash
# Move benchmark (issue 30, "A module's data", item 4): 1 GB of a module's
# data moved between two nodes in network namespaces by mesh move, beside
# Debian's rsync in daemon mode between the same namespaces; wall times and
# ratio. Usage: sudo bash bench/move.sh [RUNS, default 2]
set -euo pipefail
cd "$(dirname "$0")/.."
. contrib/lib.sh
need_root
ensure_go
apt_install podman runc iproute2 busybox-static rsync
go test -run '^$' -bench '^BenchmarkMoveCopy$' -benchtime "${1:-2}x" -timeout 30m -v ./integration | grep -E 'Benchmark|move_test|bench_test|ok|FAIL'
