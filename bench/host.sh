#!/usr/bin/env bash
# Host benchmarks (issue: the host), against real Podman, as root:
#  1. first apply of 20 containers by mesh vs a shell loop of the same 20
#     `podman run -d`, on the same Podman service: wall time and ratio;
#  2. a no-op apply with 50 containers on the node: wall time and Podman calls;
#  3. how much of a start Podman itself does at once (bench/podinit), which
#     bounds a single module, whose containers start in the order written.
# Usage: sudo bash bench/host.sh      (prints figures; cleans up after itself)
set -euo pipefail
cd "$(dirname "$0")/.."
. contrib/lib.sh
need_root
ensure_go
apt_install podman runc iproute2 busybox-static

B=/var/tmp/mesh-bench
DNS=169.254.53.64
LINK=mbenchdns0
cleanup() {
	pkill -f "$B" 2>/dev/null || true
	sleep 0.5
	[ -d "$B/root" ] && podman --root "$B/root" --runroot "$B/runroot" rm -af -t 0 >/dev/null 2>&1 || true
	# Whatever is still mounted under the bench dir (overlays, shm) goes.
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
pm() { podman --root "$B/root" --runroot "$B/runroot" "$@"; }

go build -o "$B/mesh" .
go build -o "$B/podinit" ./bench/podinit
ip link add "$LINK" type bridge && ip addr add "$DNS/32" dev "$LINK" && ip link set "$LINK" up

# The test image, from busybox.
bash contrib/busybox-rootfs.sh "$B/rootfs.tar" && pm import --change 'CMD ["/bin/sh"]' "$B/rootfs.tar" localhost/mesh-bench:1 >/dev/null

pm system service --time 0 "unix://$B/podman.sock" >"$B/podman.log" 2>&1 &
for _ in $(seq 1 100); do [ -S "$B/podman.sock" ] && break; sleep 0.1; done

export MESH_DATA_DIR=$B/data
"$B/mesh" init --name bench --address 127.0.0.1 --port 17499 --overlay off >/dev/null # the host is measured, not the network (bench/overlay.sh)
"$B/mesh" agent --dns-address "$DNS" --podman-socket "$B/podman.sock" --resync 2s --log-level debug >"$B/agent.log" 2>&1 &
for _ in $(seq 1 100); do "$B/mesh" status >/dev/null 2>&1 && break; sleep 0.1; done

module() { # NAME COUNT
	echo "module: $1"; echo "resources:"
	for i in $(seq 1 "$2"); do
		printf '  - container: %s.c%02d\n    image: localhost/mesh-bench:1\n    command: ["sleep", "100000"]\n' "$1" "$i"
	done
}
ms() { date +%s%N | cut -c1-13; }
# CPU time the whole machine was busy since boot, in ms (/proc/stat: all but
# idle and iowait, in USER_HZ ticks of 10 ms).
busy() { awk '/^cpu / { print ($2 + $3 + $4 + $7 + $8) * 10; exit }' /proc/stat; }
cores() { awk -v c="$1" -v w="$2" 'BEGIN { printf "%.1f", c / w }'; }

module bench20 20 > "$B/bench20.yaml"; module bench50 50 > "$B/bench50.yaml"
for m in 1 2 3 4 5; do module "part$m" 4 > "$B/part$m.yaml"; done
"$B/mesh" module add "$B/bench20.yaml" "$B/bench50.yaml" "$B"/part?.yaml >/dev/null

t0=$(ms); c0=$(busy); "$B/mesh" assign bench bench20 --wait --timeout 5m >/dev/null; t1=$(ms)
mesh_ms=$((t1 - t0)) mesh_cpu=$(($(busy) - c0))
t0=$(ms); c0=$(busy)
for i in $(seq 1 20); do
	podman --remote --url "unix://$B/podman.sock" run -d --name "$(printf 'peer.c%02d' "$i")" --dns "$DNS" \
		--ulimit nofile=1024:1024 --ulimit nproc=1024:1024 localhost/mesh-bench:1 sleep 100000 >/dev/null
done
t1=$(ms)
loop_ms=$((t1 - t0)) loop_cpu=$(($(busy) - c0))
pm rm -af -t 0 --filter name=peer >/dev/null
# busybox sleep as PID 1 ignores SIGTERM: each removal waits out Podman's
# 10 s stop timeout, so this measures how removals overlap.
t0=$(ms); "$B/mesh" unassign bench bench20 --wait --timeout 10m >/dev/null; t1=$(ms)
unassign_ms=$((t1 - t0))

echo "first apply of 20 containers:"
echo "  one module of 20 (applied in the order written), mesh assign --wait: ${mesh_ms} ms (machine busy $(cores "$mesh_cpu" "$mesh_ms") of $(nproc) cores)"
echo "  shell loop of podman run:  ${loop_ms} ms (machine busy $(cores "$loop_cpu" "$loop_ms") of $(nproc) cores)"
awk -v a="$mesh_ms" -v b="$loop_ms" 'BEGIN { printf "  ratio mesh / loop:         %.2f\n", a / b }'
# The same 20 containers as five modules of four, assigned together (the
# agent's debounce makes one apply of them): unrelated modules apply at once.
t0=$(ms); c0=$(busy)
for m in 1 2 3 4; do "$B/mesh" assign bench "part$m" >/dev/null; done
"$B/mesh" assign bench part5 --wait --timeout 5m >/dev/null; t1=$(ms)
parts_ms=$((t1 - t0)) parts_cpu=$(($(busy) - c0))
echo "  the same 20 as 5 modules of 4, mesh assign x5: ${parts_ms} ms (machine busy $(cores "$parts_cpu" "$parts_ms") of $(nproc) cores)"
awk -v a="$parts_ms" -v b="$loop_ms" 'BEGIN { printf "  ratio mesh (5 modules) / loop: %.2f\n", a / b }'
grep -o 'msg="applied plan" node=bench component=reconciler version=[0-9]* mutations=[0-9]*' "$B/agent.log" | tail -3 | sed 's/^/  /'
# What bounds a single module, whose containers start one after the other:
# how much of its start work Podman does at once when asked to (podinit).
echo "Podman's own start work, 8 containers on the same service:"
"$B/podinit" "$B/podman.sock" localhost/mesh-bench:1 8
pm rm -af -t 0 --filter name=podinit >/dev/null
for m in 1 2 3 4; do "$B/mesh" unassign bench "part$m" >/dev/null; done
"$B/mesh" unassign bench part5 --wait --timeout 5m >/dev/null
echo "unassign of the 20 (each stop waits out a 10 s timeout):"
echo "  mesh unassign --wait:      ${unassign_ms} ms"

"$B/mesh" assign bench bench50 --wait --timeout 5m >/dev/null
mark=$(wc -l < "$B/agent.log")
for _ in $(seq 1 100); do
	[ "$(tail -n +"$mark" "$B/agent.log" | grep -c 'msg="applied plan".*mutations=0')" -ge 5 ] && break
	sleep 0.5
done
echo "no-op apply with 50 containers (5 periodic passes):"
tail -n +"$mark" "$B/agent.log" | grep 'msg="applied plan".*mutations=0' | head -5 |
	sed -n 's/.*mutations=\([0-9]*\) podman_calls=\([0-9]*\) took=\([^ ]*\).*/  mutations=\1 podman_calls=\2 took=\3/p'
