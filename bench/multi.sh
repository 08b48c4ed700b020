#!/usr/bin/env bash
# Multi-node benchmarks (issue: many nodes), three nodes in network
# namespaces as in the integration bed: the commit latency of one assign with
# three voters, and from the assign's answer to the name being answered by all
# three resolvers; p50 and p99 over 100 assigns. Then the same measurement
# for a change of a container's health (issue 10), over 100 changes: from the
# answer to the write that carries it (the node's report) to all three
# resolvers answering accordingly, and from the agent logging the change.
# Usage: sudo bash bench/multi.sh [ASSIGNS, default 100]
set -euo pipefail
cd "$(dirname "$0")/.."
. contrib/lib.sh
need_root
ensure_go
apt_install podman runc iproute2 busybox-static
go test -run '^$' -bench '^Benchmark(MultiNode|HealthChange)$' -benchtime "${1:-100}x" -timeout 20m ./integration | grep -E 'Benchmark|ok|FAIL'
