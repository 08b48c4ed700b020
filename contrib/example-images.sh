#!/usr/bin/env bash
# Makes every image that examples/ names, without a registry: each is built
# from Debian packages and the mesh binary, and tagged with the name the
# examples use. The mesh then finds each image present and never pulls it.
#
#   docker.io/library/busybox:1.35     busybox-static
#   docker.io/library/postgres:15      postgresql-15 (unpacked from its .deb with the
#                                      libraries it needs, not installed), openssl, setpriv,
#                                      and a small entrypoint with the official
#                                      image's contract (PGDATA, POSTGRES_PASSWORD[_FILE],
#                                      any other command is run as is)
#   docker.io/library/caddy:2.6.2      caddy, unpacked from its .deb, not installed,
#                                      so no Caddy service starts on this host
#   quay.io/prometheuscommunity/postgres-exporter:v0.11.1
#                                      prometheus-postgres-exporter (unpacked likewise)
#   localhost/cfssl:1.2.0              golang-cfssl's cfssl and cfssljson (unpacked likewise)
#                                      with busybox (sh, wget, sed), for
#                                      examples/authority.yaml and intranet.yaml
#   localhost/mesh:latest              the mesh binary alone (contrib/Containerfile)
#
# These images are stand-ins for the public ones: same names, same contracts
# as far as the examples use them, smaller. On a host with a registry you may
# pull the real ones instead.
#
# Usage: bash contrib/example-images.sh [MESH_BINARY]   (as root)
#   MESH_BINARY defaults to the mesh on PATH.
#   PODMAN="podman --root DIR --runroot DIR" chooses other image storage.
#   IMAGES_CACHE (default /var/cache/mesh-example-images) keeps the .deb files
#   it fetched (apt-get download: a Debian mirror, not a registry) and what
#   they unpack to, so a second run needs no network at all.
set -euo pipefail
cd "$(dirname "$0")/.."
. contrib/lib.sh
need_root

mesh_bin=${1:-$(command -v mesh || true)}
[ -x "$mesh_bin" ] || die "no mesh binary: give its path, or build it first (make build)"
read -r -a podman <<<"${PODMAN:-podman}"
cache=${IMAGES_CACHE:-/var/cache/mesh-example-images}
mkdir -p "$cache"

apt_install busybox-static openssl util-linux tzdata

# unpack NAME PKG...: downloads PKG and the libraries they depend on (not
# libc, which comes from this host with its loader; not LLVM, see below) into
# the cache and unpacks them, without installing anything, into
# $cache/NAME. Debian's postgresql-15 would start a server on this host
# when installed; unpacked, it only becomes an image.
unpack() {
	local name=$1 sysroot="$cache/$1"
	shift
	[ -e "$sysroot/.done" ] && { echo "$sysroot"; return; }
	local debs="$cache/debs" deps
	mkdir -p "$debs"
	deps=$(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks --no-replaces --no-enhances "$@" 2>/dev/null |
		grep '^[a-z]' | grep -E '^lib' | grep -vE '^(libc6|libc-bin|libc-l10n|libllvm.*|libz3-.*|lib.*-perl|libperl.*)$' | sort -u)
	say "fetching $* and the libraries they need (unpacked into an image, not installed)" >&2
	(cd "$debs" && apt-get download "$@" $deps >/dev/null 2>&1) ||
		(apt-get update -qq && cd "$debs" && apt-get download "$@" $deps >/dev/null) ||
		die "apt-get download $* failed; is a Debian mirror reachable?"
	rm -rf "$sysroot"
	mkdir -p "$sysroot"
	for p in "$@" $deps; do
		for f in "$debs/${p}"_*.deb; do dpkg-deb -x "$f" "$sysroot"; done
	done
	touch "$sysroot/.done"
	echo "$sysroot"
}

# copy ROOT FROM PATH...: copies each PATH of the tree FROM (/ for this
# host), directories whole, symlinks followed, into ROOT.
copy() {
	local root=$1 from=$2 p
	shift 2
	for p in "$@"; do (cd "$from" && cp -a -L --parents ".$p" "$root/"); done
}
# libs ROOT [SYSROOT]: copies into ROOT every shared library that an ELF
# file in ROOT needs: from SYSROOT when it is there, else from this host.
libs() {
	local root=$1 sysroot=${2:-} f l path=
	[ -n "$sysroot" ] && path="$sysroot/usr/lib/x86_64-linux-gnu:$sysroot/lib/x86_64-linux-gnu"
	find "$root" -type f \( -perm -u+x -o -name '*.so*' \) | while read -r f; do
		[ "$(head -c 4 "$f" | od -An -c | tr -d ' ')" = '177ELF' ] || continue
		LD_LIBRARY_PATH=$path ldd "$f" 2>/dev/null | awk '/=> \//{print $3} /^[ \t]*\/lib/{print $1}' || true # static: nothing
	done | sort -u | while read -r l; do
		if [ -n "$sysroot" ] && [ "${l#"$sysroot"}" != "$l" ]; then
			[ -e "$root${l#"$sysroot"}" ] || copy "$root" "$sysroot" "${l#"$sysroot"}"
		else
			[ -e "$root$l" ] || copy "$root" / "$l"
		fi
	done
	if find "$root" -type f \( -perm -u+x -o -name '*.so*' \) -exec sh -c 'LD_LIBRARY_PATH=$1 ldd "$2" 2>/dev/null | grep -q "not found" && echo "$2"' _ "$path" {} \; | grep -q .; then
		die "$root: a library is missing (ldd says not found)"
	fi
}
with_busybox() {
	local root=$1 a
	mkdir -p "$root/bin" "$root/tmp" "$root/etc"
	chmod 1777 "$root/tmp"
	cp "$(command -v busybox)" "$root/bin/busybox"
	for a in $("$root/bin/busybox" --list); do
		[ -e "$root/bin/$a" ] || ln -s busybox "$root/bin/$a"
	done
}
users() {
	local root=$1
	shift
	printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' >"$root/etc/passwd"
	printf 'root:x:0:\nnogroup:x:65534:\n' >"$root/etc/group"
	for u in "$@"; do # NAME:ID:HOME
		IFS=: read -r n id home <<<"$u"
		echo "$n:x:$id:$id:$n:$home:/bin/sh" >>"$root/etc/passwd"
		echo "$n:x:$id:" >>"$root/etc/group"
	done
}
# image NAME ROOT CHANGE...: imports ROOT as NAME, replacing an older NAME.
image() {
	local name=$1 root=$2 tar
	shift 2
	local args=()
	for c in "$@"; do args+=(--change "$c"); done
	tar=$(mktemp --suffix=.tar)
	tar --numeric-owner -C "$root" -cf "$tar" .
	old=$("${podman[@]}" image inspect --format '{{.Id}}' "$name" 2>/dev/null || true)
	"${podman[@]}" import -q "${args[@]}" "$tar" "$name" >/dev/null
	rm -f "$tar"
	# The image this one replaces, unless a container still uses it.
	[ -z "$old" ] || "${podman[@]}" rmi "$old" >/dev/null 2>&1 || true
	say "made $name"
}
fresh() {
	local r="$cache/rootfs-$1"
	rm -rf "$r"
	mkdir -p "$r"
	echo "$r"
}

# busybox
r=$(fresh busybox)
with_busybox "$r"
users "$r"
mkdir -p "$r/www"
image docker.io/library/busybox:1.35 "$r" 'CMD ["sh"]'

# postgres:15. JIT (llvmjit.so, which needs a 100 MB libLLVM) is left out:
# PostgreSQL then runs without JIT, as it does where LLVM is missing.
r=$(fresh postgres)
with_busybox "$r"
users "$r" postgres:999:/var/lib/postgresql
pg=$(unpack postgres postgresql-15 postgresql-client-15 openssl)
copy "$r" "$pg" /usr/lib/postgresql/15 /usr/share/postgresql/15
rm -rf "$r/usr/lib/postgresql/15/lib/llvmjit"* "$r/usr/lib/postgresql/15/lib/bitcode"
copy "$r" "$pg" /usr/bin/openssl /usr/lib/ssl /etc/ssl/openssl.cnf
copy "$r" / /usr/share/zoneinfo /usr/bin/setpriv /usr/lib/locale/C.utf8
libs "$r" "$pg"
mkdir -p "$r/usr/local/bin" "$r/var/lib/postgresql/data" "$r/var/run/postgresql" "$r/docker-entrypoint-initdb.d"
chown -R 999:999 "$r/var/lib/postgresql" "$r/var/run/postgresql"
chmod 3777 "$r/var/run/postgresql"
install -m 0755 contrib/images/postgres-entrypoint.sh "$r/usr/local/bin/docker-entrypoint.sh"
image docker.io/library/postgres:15 "$r" \
	'ENV PATH=/usr/local/bin:/usr/bin:/bin:/usr/lib/postgresql/15/bin' \
	'ENV PGDATA=/var/lib/postgresql/data' 'ENV LANG=C.UTF-8' \
	'ENTRYPOINT ["docker-entrypoint.sh"]' 'CMD ["postgres"]' 'STOPSIGNAL SIGINT' 'EXPOSE 5432'

# caddy:2.6.2
r=$(fresh caddy)
with_busybox "$r"
users "$r"
mkdir -p "$r/etc/caddy" "$r/config" "$r/data" "$r/srv"
cd_root=$(unpack caddy caddy)
copy "$r" "$cd_root" /usr/bin/caddy
printf ':80 {\n\troot * /usr/share/caddy\n\tfile_server\n}\n' >"$r/etc/caddy/Caddyfile"
libs "$r"
image docker.io/library/caddy:2.6.2 "$r" \
	'ENV XDG_CONFIG_HOME=/config' 'ENV XDG_DATA_HOME=/data' 'WORKDIR /srv' 'EXPOSE 80' 'EXPOSE 443' \
	'CMD ["caddy", "run", "--config", "/etc/caddy/Caddyfile", "--adapter", "caddyfile"]'

# postgres-exporter:v0.11.1
r=$(fresh exporter)
with_busybox "$r"
users "$r"
ex_root=$(unpack exporter prometheus-postgres-exporter)
cp "$ex_root/usr/bin/prometheus-postgres-exporter" "$r/bin/postgres_exporter"
libs "$r"
image quay.io/prometheuscommunity/postgres-exporter:v0.11.1 "$r" \
	'USER nobody' 'EXPOSE 9187' 'ENTRYPOINT ["/bin/postgres_exporter"]'

# cfssl:1.2.0 (Debian's golang-cfssl; cfssl links libsqlite3)
r=$(fresh cfssl)
with_busybox "$r"
users "$r"
cf_root=$(unpack cfssl golang-cfssl)
copy "$r" "$cf_root" /usr/bin/cfssl /usr/bin/cfssljson
libs "$r" "$cf_root"
image localhost/cfssl:1.2.0 "$r" 'ENV PATH=/usr/bin:/bin' 'EXPOSE 8888' 'CMD ["cfssl", "version"]'

# mesh
b=$(mktemp -d)
cp "$mesh_bin" "$b/mesh"
"${podman[@]}" build -q -f "$PWD/contrib/Containerfile" -t localhost/mesh:latest "$b" >/dev/null
rm -rf "$b"
say "made localhost/mesh:latest"
