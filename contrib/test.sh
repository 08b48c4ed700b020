#!/usr/bin/env bash
# Runs every check CI runs: format, vet, unit tests, integration beds, short
# fuzz runs. Installs what they need first. Usage: bash contrib/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."
. contrib/lib.sh
ensure_go
go version

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
