# Every build and test picks up CGO_ENABLED and GOFLAGS from contrib/build.env.
include contrib/build.env
export CGO_ENABLED GOFLAGS

VERSION ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)

.PHONY: build test bench install
build:
	go build -ldflags "-s -w -X main.version=$(VERSION)" -o mesh .

test:
	bash contrib/test.sh

bench:
	go test -run '^$$' -bench . -skip '^BenchmarkFleet$$' -benchtime 3s ./state/ ./cluster/ ./dnsd/   # the fleet: bash bench/scale.sh

install: build
	install -m 0755 mesh /usr/local/bin/mesh
