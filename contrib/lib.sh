# Shared by contrib/quickstart.sh and contrib/test.sh; source it from the repo root.
set -a
. contrib/build.env
set +a

say() { printf '\033[1m== %s\033[0m\n' "$*"; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

need_root() {
	[ "$(id -u)" = 0 ] || die "run this as root (su -, or sudo bash $0): it installs packages"
}

apt_updated=
apt_install() {
	missing=
	for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
	[ -z "$missing" ] && return 0
	if [ -z "$apt_updated" ]; then
		say "apt-get update"
		apt-get update -qq || die "apt-get update failed"
		apt_updated=1
	fi
	say "installing$missing"
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null || die "apt-get install$missing failed"
}

go_ok() {
	command -v go >/dev/null 2>&1 || return 1
	v=$(go env GOVERSION 2>/dev/null) || return 1
	[ "$v" = "go$MESH_GO_VERSION" ] || [ "$(printf '%s\n%s\n' "go$MESH_GO_VERSION" "$v" | sort -V | head -1)" = "go$MESH_GO_VERSION" ]
}

# ensure_go puts Go $MESH_GO_VERSION (or newer) on PATH. Debian 12 ships only
# Go 1.19, so that one is used once to fetch the release as a module (the
# golang.org/toolchain module the go command itself uses) from the module proxy.
ensure_go() {
	export PATH="/usr/local/go/bin:/opt/mesh-go/bin:$HOME/go/bin:$PATH"
	go_ok && return 0
	need_root
	apt_install golang-go ca-certificates git
	say "fetching Go $MESH_GO_VERSION through the Go module proxy"
	tmp=$(mktemp -d)
	dir=$(cd "$tmp" && GOFLAGS= GOMODCACHE="$tmp/cache" /usr/lib/go/bin/go mod download -json "golang.org/toolchain@v0.0.1-go$MESH_GO_VERSION.linux-$(dpkg --print-architecture)" | sed -n 's/.*"Dir": "\(.*\)",/\1/p')
	[ -d "$dir" ] || die "could not fetch Go $MESH_GO_VERSION"
	rm -rf /opt/mesh-go && cp -r "$dir" /opt/mesh-go && chmod -R u+w /opt/mesh-go
	chmod +x /opt/mesh-go/bin/* /opt/mesh-go/pkg/tool/*/*
	chmod -R u+w "$tmp" && rm -rf "$tmp"
	go_ok || die "Go $MESH_GO_VERSION is not usable at /opt/mesh-go"
}

# mesh_bridges_del PODMAN-ARGS...: deletes the bridges of the mesh's module
# networks that the Podman of those arguments (and of CONTAINERS_CONF) knows:
# its CNI backend leaves a network's bridge behind when the network goes.
mesh_bridges_del() {
	local i
	for i in $(podman "$@" network ls --filter label=mesh.managed=1 --format '{{.NetworkInterface}}' 2>/dev/null); do
		ip link del "$i" 2>/dev/null || true
	done
}
