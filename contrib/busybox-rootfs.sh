#!/usr/bin/env bash
# Writes OUT.tar: a minimal root filesystem made from the host's static busybox
# (Debian's busybox-static), for `podman import` where no registry is reachable.
# The examples, the integration beds and bench/host.sh all use it.
# Usage: bash contrib/busybox-rootfs.sh OUT.tar
set -euo pipefail
out=${1:?usage: busybox-rootfs.sh OUT.tar}
bb=$(command -v busybox) || { echo "busybox is missing: apt-get install busybox-static" >&2; exit 1; }
r=$(mktemp -d)
trap 'rm -rf "$r"' EXIT
mkdir -p "$r/bin" "$r/etc" "$r/tmp" "$r/www" "$r/data"
cp "$bb" "$r/bin/busybox"
for a in $("$r/bin/busybox" --list); do [ "$a" = busybox ] || ln -s busybox "$r/bin/$a"; done
echo 'root:x:0:0:root:/root:/bin/sh' > "$r/etc/passwd"
echo 'root:x:0:' > "$r/etc/group"
tar -C "$r" -cf "$out" .
chmod 0644 "$out"
