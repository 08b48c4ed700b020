#!/usr/bin/env bash
# No container fills its node (hardening, items 1 and 2): one agent with a
# Podman service of its own runs a step that prints 100 MB and fails (tried
# again at every pass) and a container that logs as fast as it can (yes,
# its log bounded at 1m); for 60 s this prints, every 10 s, the agent's RSS
# and peak, its data dir's size, the size of mesh status --json, and the
# container's log. bench/memory.sh runs it at its end.
# Usage: sudo bash bench/bounds.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
. contrib/lib.sh
need_root
ensure_go
apt_install podman runc iproute2 busybox-static
secs=${1:-60}
B=/var/tmp/mesh-boundsbench
DNS=169.254.53.65
LINK=mboundsdns0 # the resolver's address, on a link of the bench's own
pm() { CONTAINERS_CONF=$B/containers.conf podman --root "$B/root" --runroot "$B/runroot" "$@"; }
cleanup() {
	pkill -f "$B/" 2>/dev/null || true
	if [ -d "$B/root" ]; then pm rm -af -t 0 >/dev/null 2>&1 || true; umount -l "$B/root/overlay" 2>/dev/null || true; fi
	[ -d "$B/root" ] && CONTAINERS_CONF=$B/containers.conf mesh_bridges_del --root "$B/root" --runroot "$B/runroot"
	ip link del "$LINK" 2>/dev/null || true
	rm -rf "$B"
}
cleanup
trap cleanup EXIT
mkdir -p "$B/srv"
ip link add "$LINK" type bridge && ip addr add "$DNS/32" dev "$LINK" && ip link set "$LINK" up
go build -o "$B/mesh" .
printf '[containers]\ndefault_ulimits = []\n\n[engine]\nruntime = "runc"\ncgroup_manager = "cgroupfs"\nevents_logger = "file"\n\n[network]\nnetwork_config_dir = "%s/networks"\n' "$B" >"$B/containers.conf"
bash contrib/busybox-rootfs.sh "$B/rootfs.tar" >/dev/null
pm import --change 'CMD ["/bin/sh"]' "$B/rootfs.tar" localhost/mesh-bounds:1 >/dev/null
pm system service --time 0 "unix://$B/podman.sock" >"$B/podman.log" 2>&1 &
for _ in $(seq 100); do [ -S "$B/podman.sock" ] && break; sleep 0.1; done
"$B/mesh" init --name bnd --address 127.0.0.1 --port 17991 --data-dir "$B/data" --overlay off >/dev/null
"$B/mesh" agent --data-dir "$B/data" --dns-address "$DNS" --podman-socket "unix://$B/podman.sock" --resync 2s >"$B/agent.log" 2>&1 &
for _ in $(seq 300); do "$B/mesh" status --data-dir "$B/data" >/dev/null 2>&1 && break; sleep 0.1; done
AGENT=$(pgrep -f "$B/mesh agent" | head -1)
cat >"$B/noisy.yaml" <<EOF
module: noisy
resources:
  - directory: $B/srv/noisy
  - step: spill
    image: localhost/mesh-bounds:1
    command: ["sh", "-c", "for i in \$(seq 100); do head -c 1048576 /dev/zero | tr '\\\\0' x; echo; done; exit 1"]
EOF
cat >"$B/chatty.yaml" <<EOF
module: chatty
resources:
  - container: chatty.yes
    image: localhost/mesh-bounds:1
    command: ["yes", "mesh"]
    log-max-size: 1m
EOF
M() { "$B/mesh" "$@" --data-dir "$B/data"; }
M module add "$B/noisy.yaml" "$B/chatty.yaml" >/dev/null
M assign bnd noisy >/dev/null
M assign bnd chatty >/dev/null
mib() { awk -v b="$1" 'BEGIN { printf "%.1f", b / 1048576 }'; }
echo "a step printing 100 MB (retried every pass) and a container logging as fast as it can, for ${secs} s:"
for t in $(seq 10 10 "$secs"); do
	sleep 10
	rss=$(awk '/^VmRSS/ { printf "%.1f", $2 / 1024 }' "/proc/$AGENT/status")
	hwm=$(awk '/^VmHWM/ { printf "%.1f", $2 / 1024 }' "/proc/$AGENT/status")
	data=$(du -sb "$B/data" | cut -f1)
	st=$(M status --json | wc -c)
	log=$(pm container inspect --format '{{.HostConfig.LogConfig.Path}}' chatty.yes 2>/dev/null || true)
	logsz=0
	[ -n "$log" ] && [ -f "$log" ] && logsz=$(stat -c %s "$log")
	printf "  %3ss  agent RSS %6s MB (peak %6s)   data dir %6s MB   status --json %6s KB   chatty.yes's log %5s MB\n" \
		"$t" "$rss" "$hwm" "$(mib "$data")" "$(awk -v b="$st" 'BEGIN { printf "%.1f", b / 1024 }')" "$(mib "$logsz")"
done
echo "the step's failure as the report carries it (bytes): $(M status --json | python3 -c 'import json,sys; s=json.load(sys.stdin); print(max(len(r.get("reason","")) for n in s["nodes"] for r in (n.get("report") or {}).get("resources",[])))')"
