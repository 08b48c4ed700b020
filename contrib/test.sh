#!/usr/bin/env bash
# Runs every check CI runs: format, vet, unit tests, integration beds, short
# fuzz runs. Installs what they need first. Usage: bash contrib/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."
. contrib/lib.sh
ensure_go
go version

say "preparing the integration beds"
need_root
# Real Podman (runc: crun refuses this kind of host's hybrid cgroups), the
# rootless tools, busybox for the beds' image.
apt_install podman runc uidmap slirp4netns iproute2 busybox-static procps
# The rootless bed's user, with subordinate ids (useradd adds them on Debian 12).
id meshbed >/dev/null 2>&1 || useradd -m -s /bin/bash meshbed
grep -q '^meshbed:' /etc/subuid || usermod --add-subuids 200000-265535 --add-subgids 200000-265535 meshbed

say "gofmt"
bad=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))
[ -z "$bad" ] || die "gofmt would change: $bad"

say "go vet"
go vet ./...

say "go test (unit tests and integration beds)"
go test -count=1 -timeout 20m ./...

say "fuzz: manifest parser"
go test -run '^$' -fuzz '^FuzzParse$' -fuzztime "${MESH_FUZZTIME:-30s}" ./state/manifest
say "fuzz: resolver query handler"
go test -run '^$' -fuzz '^FuzzAnswer$' -fuzztime "${MESH_FUZZTIME:-30s}" ./dnsd

say "all checks passed"
