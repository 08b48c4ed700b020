#!/usr/bin/env bash
# The robustness suite (issue 34 item 3) for a long budget: concurrent
# clients on every node assign, unassign, add modules and read while faults
# are injected (kill -9 and SIGSTOP of the leader and of a follower,
# partitions of each, 30 % packet loss, a full disk on a follower, a restart
# from an older copy of a data dir), one at a time and two at once; the
# history is checked with porcupine. Prints operations, faults, violations,
# lost writes and the longest unavailability per fault kind.
# Usage: sudo bash bench/robustness.sh [BUDGET, default 30m] [NODES, 3 or 5, default 3]
set -euo pipefail
cd "$(dirname "$0")/.."
. contrib/lib.sh
need_root
ensure_go
apt_install podman runc iproute2 iptables busybox-static
MESH_ROBUSTNESS_BUDGET="${1:-30m}" MESH_ROBUSTNESS_NODES="${2:-3}" \
	go test -count=1 -run '^TestRobustnessBed$' -timeout 3h -v ./integration |
	grep -E 'robustness |operations:|fault:|seed|netem|exited|FAIL|ok|PASS|not linearizable|went back|never'
