#!/usr/bin/env bash
# Web page benchmark (issue 32, "a web page for the fleet"): a mesh of 100
# nodes and 1,000 modules (three agents, 97 nodes joined that run none), the
# page served over TLS by n1's agent. Prints time to first byte and to the
# whole body from a Go client, first byte and rendered page (load event)
# from Debian's Chromium with the ratio to the issue's 200 ms, for the fleet,
# a node's, a module's and the roster page; and n1's agent RSS with the page
# open in 10 browsers. Usage: bash bench/web.sh (as root; about 5 minutes)
set -euo pipefail
cd "$(dirname "$0")/.."
. contrib/lib.sh
need_root
ensure_go
apt_install podman runc iproute2 busybox-static chromium
go test -run '^$' -bench '^BenchmarkWebPage$' -benchtime 1x -timeout 30m -v ./integration | grep -E '^web |Benchmark|bench_test|ok|FAIL'
