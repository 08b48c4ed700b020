#!/usr/bin/env bash
# Backup benchmark (issue 30, "A module's data", item 2), as root: 1 GB of a
# module's data (20,000 small files and 7 large ones, random bytes) backed up
# by `mesh backup` on a one-node mesh, beside a bare `restic backup` of the
# same directory into a repository of its own, on the same disk: the first
# backup (the repository initialised by it) and a second of the unchanged
# data, wall time and ratio; then `mesh restore` beside `restic restore`.
# Usage: sudo bash bench/backup.sh      (prints figures; cleans up after itself)
set -euo pipefail
cd "$(dirname "$0")/.."
. contrib/lib.sh
need_root
ensure_go
apt_install podman runc iproute2 restic

B=/var/tmp/mesh-bench-backup
DNS=169.254.53.65
LINK=mbbackdns0
cleanup() {
	pkill -f "$B" 2>/dev/null || true
	sleep 0.5
	# What Podman's storage left mounted under the bench dir goes first.
	awk -v b="$B/" 'index($2, b) == 1 { print $2 }' /proc/mounts | sort -r | xargs -r -n1 umount -l 2>/dev/null || true
	[ -d "$B/root" ] && CONTAINERS_CONF=$B/containers.conf mesh_bridges_del --root "$B/root" --runroot "$B/runroot"
	ip link del "$LINK" 2>/dev/null || true
	rm -rf "$B"
}
cleanup
trap cleanup EXIT
mkdir -p "$B/srv"
export CONTAINERS_CONF=$B/containers.conf
printf '[engine]\nruntime = "runc"\ncgroup_manager = "cgroupfs"\nevents_logger = "file"\n\n[network]\nnetwork_config_dir = "%s/networks"\n' "$B" > "$CONTAINERS_CONF"
go build -o "$B/mesh" .
ip link add "$LINK" type bridge && ip addr add "$DNS/32" dev "$LINK" && ip link set "$LINK" up
podman --root "$B/root" --runroot "$B/runroot" system service --time 0 "unix://$B/podman.sock" >"$B/podman.log" 2>&1 &
for _ in $(seq 1 100); do [ -S "$B/podman.sock" ] && break; sleep 0.1; done

export MESH_DATA_DIR=$B/data
"$B/mesh" init --name bench --address 127.0.0.1 --port 17498 --overlay off >/dev/null
"$B/mesh" agent --dns-address "$DNS" --podman-socket "$B/podman.sock" --resync 2s >"$B/agent.log" 2>&1 &
for _ in $(seq 1 100); do "$B/mesh" status >/dev/null 2>&1 && break; sleep 0.1; done

cat > "$B/bench.yaml" <<YAML
module: bench
resources:
  - directory: $B/srv/bench
    owner: "0:0"
    mode: "0755"
  - directory: $B/srv/bench/data
    owner: "0:0"
    mode: "0700"
    data: true
YAML
"$B/mesh" module add "$B/bench.yaml" >/dev/null
"$B/mesh" assign bench bench --wait --timeout 2m >/dev/null

D=$B/srv/bench/data
say "writing 1 GB of data"
# 20,000 files of 4 to 28 KiB (about 320 MB) in 100 directories, and 7 of 100 MB.
head -c 400M /dev/urandom > "$B/pool"
python3 - "$D" "$B/pool" <<'PY'
import os, sys, random
d, pool = sys.argv[1], open(sys.argv[2], 'rb').read()
random.seed(30)
off = 0
for i in range(20000):
    sub = os.path.join(d, "small", "%03d" % (i % 100))
    os.makedirs(sub, exist_ok=True)
    n = random.randint(4, 28) * 1024
    with open(os.path.join(sub, "f%05d" % i), "wb") as f:
        f.write(pool[off:off + n])
    off = (off + n) % (len(pool) - 40000)
PY
mkdir -p "$D/large"
for i in 1 2 3 4 5 6 7; do head -c 100M /dev/urandom > "$D/large/l$i"; done
rm -f "$B/pool"
sync
total=$(du -sb "$D" | cut -f1)

printf 'bench backups %s\n' "$(head -c 24 /dev/urandom | base64)" > "$B/pw"
"$B/mesh" backup repo set "$B/repo-mesh" --password-file "$B/pw" >/dev/null
export RESTIC_PASSWORD_FILE=$B/pw
ms() { date +%s%N | cut -c1-13; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
mbps() { awk -v n="$total" -v t="$1" 'BEGIN { printf "%.0f", n / 1048576 / (t / 1000) }'; }

drop() { sync; echo 3 > /proc/sys/vm/drop_caches; }
drop; t0=$(ms); "$B/mesh" backup bench >/dev/null 2>&1; t1=$(ms); mesh1=$((t1 - t0))
drop; t0=$(ms); restic -q -r "$B/repo-bare" init >/dev/null && restic -q -r "$B/repo-bare" --cache-dir "$B/bare-cache" backup "$D" >/dev/null; t1=$(ms); bare1=$((t1 - t0))
drop; t0=$(ms); "$B/mesh" backup bench >/dev/null 2>&1; t1=$(ms); mesh2=$((t1 - t0))
drop; t0=$(ms); restic -q -r "$B/repo-bare" --cache-dir "$B/bare-cache" backup "$D" >/dev/null; t1=$(ms); bare2=$((t1 - t0))

# Restores: mesh restore stages beside the directory and swaps it in;
# restic restore writes into an empty target on the same disk.
drop; t0=$(ms); "$B/mesh" restore bench --timeout 30m >/dev/null 2>&1; t1=$(ms); meshr=$((t1 - t0))
snap=$(restic -q -r "$B/repo-bare" --cache-dir "$B/bare-cache" snapshots --json | python3 -c 'import json,sys; print(json.load(sys.stdin)[-1]["short_id"])')
drop; t0=$(ms); restic -q -r "$B/repo-bare" --cache-dir "$B/bare-cache" restore "$snap" --target "$B/bare-restore" >/dev/null; t1=$(ms); barer=$((t1 - t0))
cmp -s "$D/large/l7" "$B/bare-restore$D/large/l7" || die "the restores differ"

printf 'data: %s bytes, %s files, on %s cores\n' "$total" "$(find "$D" -type f | wc -l)" "$(nproc)"
printf 'backup first   mesh_ms=%s restic_ms=%s ratio=%s (mesh %s MiB/s)\n' "$mesh1" "$bare1" "$(ratio "$mesh1" "$bare1")" "$(mbps "$mesh1")"
printf 'backup again   mesh_ms=%s restic_ms=%s ratio=%s\n' "$mesh2" "$bare2" "$(ratio "$mesh2" "$bare2")"
printf 'restore        mesh_ms=%s restic_ms=%s ratio=%s (mesh: staged, swapped in, module back)\n' "$meshr" "$barer" "$(ratio "$meshr" "$barer")"
