#!/usr/bin/env bash
# The overlay's cost (private by default), every peer in the same run, between two
# network namespaces on one bridge of this machine:
#
#   underlay        iperf3 host to host over the veths, no encryption
#   bare            a bare wireguard-go device of the version mesh links
#                   (bench/wgbare: CreateTUN, NewDevice, IpcSet, nothing else)
#   debian          Debian's wireguard-go 0.0.20220316 with wg(8)
#   mesh host       mesh's overlay, iperf3 between the two nodes' overlay addresses
#   mesh container  mesh's overlay, iperf3 between a container on each node,
#                   the client reaching the server by its mesh name
#
# For each: throughput of one 10 s stream, and the machine's CPU seconds per
# GB moved (all cores, from /proc/stat). Then the round trip of a 64-byte
# TCP request (bench/rtt, p50 and p99) on the underlay and on the overlay,
# and the agent's idle RSS with its overlay up. Run as root by hand (not in
# CI): bash bench/overlay.sh [SECONDS [ROUNDS]]
set -euo pipefail
cd "$(dirname "$0")/.."
. contrib/lib.sh
need_root
ensure_go
apt_install podman runc iperf3 wireguard-go wireguard-tools busybox-static iproute2 python3
secs=${1:-10}
rounds=${2:-3}
tmp=/var/tmp/mesh-obench
br=obench0
cleanup() {
	pkill -f "$tmp" 2>/dev/null || true
	for n in A B; do
		if [ -d "$tmp/$n/root" ]; then
			CONTAINERS_CONF=$tmp/$n/containers.conf podman --root "$tmp/$n/root" --runroot "$tmp/$n/runroot" rm -af -t 0 >/dev/null 2>&1 || true
			umount -l "$tmp/$n/root/overlay" 2>/dev/null || true
		fi
		ip netns del "ob$n" 2>/dev/null || true
		ip link del "ob$n-h" 2>/dev/null || true
	done
	pkill -f "wireguard-go wgd" 2>/dev/null || true
	rm -f /var/run/wireguard/wgdA.sock /var/run/wireguard/wgdB.sock
	ip link del $br 2>/dev/null || true
	rm -rf "$tmp"
}
trap cleanup EXIT
cleanup
mkdir -p "$tmp/bin"
say "building mesh, wgbare, rtt"
go build -o "$tmp/bin/mesh" . && go build -o "$tmp/bin/wgbare" ./bench/wgbare && go build -o "$tmp/bin/rtt" ./bench/rtt

ip link add $br type bridge && ip link set $br up
i=1
for n in A B; do
	ip netns add "ob$n"
	ip link add "ob$n-h" type veth peer name "ob$n-n"
	ip link set "ob$n-h" master $br up
	ip link set "ob$n-n" netns "ob$n"
	ip netns exec "ob$n" sh -c "ip link set lo up && ip link set ob$n-n name eth0 && ip addr add 10.77.0.$i/24 dev eth0 && ip link set eth0 up"
	i=$((i + 1))
done
inA() { nsenter --net=/run/netns/obA "$@"; }
inB() { nsenter --net=/run/netns/obB "$@"; }

busy() { awk '/^cpu /{print $2+$3+$4+$7+$8}' /proc/stat; }
hz=$(getconf CLK_TCK)
results=()
# run NAME SERVER_IP [CLIENT...]: one stream of $secs s from A (or the
# client command given) to an iperf3 server already listening at SERVER_IP.
measure() {
	local name=$1 json
	shift
	local b0 b1
	b0=$(busy)
	json=$("$@")
	b1=$(busy)
	python3 - "$name" "$json" "$b0" "$b1" "$hz" <<'PY'
import json, sys
name, raw, b0, b1, hz = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
r = json.loads(raw)["end"]["sum_received"]
gbit = r["bits_per_second"] / 1e9
gb = r["bytes"] / 1e9
cpu = (b1 - b0) / hz
print(f"{name:16s} {gbit:6.2f} Gbit/s   {cpu / gb:6.2f} CPU s per GB   ({gb:.2f} GB in {r['seconds']:.1f} s)")
PY
}

say "bare wireguard-go device (the version mesh links)"
hexkey() { base64 -d | od -An -tx1 | tr -d ' \n'; }
ka=$(wg genkey); kb=$(wg genkey)
pa=$(echo "$ka" | wg pubkey); pb=$(echo "$kb" | wg pubkey)
inA "$tmp/bin/wgbare" wgbA "$(echo "$ka" | hexkey)" 51821 "$(echo "$pb" | hexkey)" 10.77.0.2:51821 100.91.0.2/32 >/dev/null &
inB "$tmp/bin/wgbare" wgbB "$(echo "$kb" | hexkey)" 51821 "$(echo "$pa" | hexkey)" 10.77.0.1:51821 100.91.0.1/32 >/dev/null &
for n in A B; do
	for _ in $(seq 50); do ip netns exec "ob$n" ip link show "wgb$n" >/dev/null 2>&1 && break; sleep 0.1; done
done
inA sh -c 'ip addr add 100.91.0.1/24 dev wgbA && ip link set wgbA up'
inB sh -c 'ip addr add 100.91.0.2/24 dev wgbB && ip link set wgbB up'
inA ping -c 1 -W 3 100.91.0.2 >/dev/null

say "Debian's wireguard-go $(dpkg-query -W -f '${Version}' wireguard-go)"
inA env WG_PROCESS_FOREGROUND=1 wireguard-go wgdA >/dev/null 2>&1 &
inB env WG_PROCESS_FOREGROUND=1 wireguard-go wgdB >/dev/null 2>&1 &
for n in A B; do
	for _ in $(seq 50); do [ -S /var/run/wireguard/wgd$n.sock ] && break; sleep 0.1; done
done
inA bash -c "wg set wgdA private-key <(echo $ka) listen-port 51822 peer $pb endpoint 10.77.0.2:51822 allowed-ips 100.92.0.2/32 && ip addr add 100.92.0.1/24 dev wgdA && ip link set wgdA up mtu 1420"
inB bash -c "wg set wgdB private-key <(echo $kb) listen-port 51822 peer $pa endpoint 10.77.0.1:51822 allowed-ips 100.92.0.1/32 && ip addr add 100.92.0.2/24 dev wgdB && ip link set wgdB up mtu 1420"
inA ping -c 1 -W 3 100.92.0.2 >/dev/null

say "mesh: two nodes, Podman, the overlay"
# An image with iperf3 and rtt: the host's iperf3 with the libraries it
# links, and busybox for the shell.
root=$tmp/img
mkdir -p "$root/bin" "$root/etc" "$root/tmp"
cp /bin/busybox "$root/bin/"
for a in sh sleep cat; do ln -sf busybox "$root/bin/$a"; done
cp "$(command -v iperf3)" "$root/bin/iperf3"
cp "$tmp/bin/rtt" "$root/bin/rtt"
for lib in $(ldd "$(command -v iperf3)" | awk '/=>/{print $3} /ld-linux/{print $1}'); do
	mkdir -p "$root$(dirname "$lib")" && cp -L "$lib" "$root$lib"
done
echo 'root:x:0:0:root:/root:/bin/sh' >"$root/etc/passwd"
tar -C "$root" -cf "$tmp/img.tar" .
for n in A B; do
	d=$tmp/$n
	mkdir -p "$d/srv"
	printf '[containers]\ndefault_ulimits = []\n\n[engine]\nruntime = "runc"\ncgroup_manager = "cgroupfs"\nevents_logger = "file"\n\n[network]\nnetwork_config_dir = "%s/networks"\n' "$d" >"$d/containers.conf"
	CONTAINERS_CONF=$d/containers.conf podman --root "$d/root" --runroot "$d/runroot" import -q "$tmp/img.tar" localhost/mesh-obench:1 >/dev/null
	CONTAINERS_CONF=$d/containers.conf nsenter --net=/run/netns/ob$n podman --root "$d/root" --runroot "$d/runroot" system service --time 0 "unix://$d/podman.sock" >"$d/podman.log" 2>&1 &
done
for n in A B; do for _ in $(seq 100); do [ -S "$tmp/$n/podman.sock" ] && break; sleep 0.1; done; done
M=$tmp/bin/mesh
inA "$M" init --name oba --address 10.77.0.1 --data-dir "$tmp/A/data" >/dev/null
agent() { # NODE
	CONTAINERS_CONF=$tmp/$1/containers.conf nsenter --net=/run/netns/ob$1 "$M" agent --data-dir "$tmp/$1/data" --podman-socket "$tmp/$1/podman.sock" >"$tmp/$1/agent.log" 2>&1 &
	for _ in $(seq 300); do grep -q 'msg="agent ready"' "$tmp/$1/agent.log" 2>/dev/null && return; sleep 0.1; done
	echo "agent $1 not ready:"; tail -20 "$tmp/$1/agent.log"; exit 1
}
agent A
tok=$("$M" token --data-dir "$tmp/A/data")
MESH_TOKEN=$tok inB "$M" join 10.77.0.1 --name obb --address 10.77.0.2 --data-dir "$tmp/B/data" >/dev/null
agent B
for _ in $(seq 100); do inA ping -c 1 -W 1 100.90.0.2 >/dev/null 2>&1 && break; sleep 0.1; done
rss() { awk '/VmRSS/{print $2, $3}' "/proc/$(pgrep -f "$M agent --data-dir $tmp/$1/data" | head -1)/status"; }
sleep 10
idle_rss="node oba, idle with its overlay up (10 s after start): $(rss A)"

cat >"$tmp/ibench.yaml" <<EOF
module: ibench
resources:
  - container: ibench.server
    image: localhost/mesh-obench:1
    command: ["sh", "-c", "rtt -listen :7000 & exec iperf3 -s"]
    ports: ["5201:5201", "7000:7000"]
EOF
cat >"$tmp/iclient.yaml" <<EOF
module: iclient
resources:
  - container: iclient.app
    image: localhost/mesh-obench:1
    command: ["sleep", "1000000"]
EOF
"$M" module add "$tmp/ibench.yaml" "$tmp/iclient.yaml" --data-dir "$tmp/A/data" >/dev/null
"$M" assign obb ibench --wait --data-dir "$tmp/A/data" >/dev/null
"$M" assign oba iclient --wait --data-dir "$tmp/A/data" >/dev/null
pmA() { CONTAINERS_CONF=$tmp/A/containers.conf podman --root "$tmp/A/root" --runroot "$tmp/A/runroot" "$@"; }
for _ in $(seq 100); do pmA exec iclient.app iperf3 -c ibench.internal -t 1 >/dev/null 2>&1 && break; sleep 0.2; done

# Every path is up (the bare and Debian devices beside mesh's, each on its
# own port and prefix): the runs take turns, $rounds rounds, so that what
# else the machine does weighs on each alike; the summary takes medians.
say "throughput: $rounds rounds of one $secs s stream each"
for r in $(seq "$rounds"); do
	for path in underlay bare debian "mesh host" "mesh container"; do
		case $path in
		underlay) inB iperf3 -s -p 5301 -D -1 >/dev/null; sleep 0.3; out=$(measure "$path" inA iperf3 -J -p 5301 -t "$secs" -c 10.77.0.2) ;;
		bare) inB iperf3 -s -p 5301 -D -1 >/dev/null; sleep 0.3; out=$(measure "$path" inA iperf3 -J -p 5301 -t "$secs" -c 100.91.0.2) ;;
		debian) inB iperf3 -s -p 5301 -D -1 >/dev/null; sleep 0.3; out=$(measure "$path" inA iperf3 -J -p 5301 -t "$secs" -c 100.92.0.2) ;;
		"mesh host") inB iperf3 -s -p 5301 -D -1 >/dev/null; sleep 0.3; out=$(measure "$path" inA iperf3 -J -p 5301 -t "$secs" -c 100.90.0.2) ;;
		"mesh container") out=$(measure "$path" pmA exec iclient.app iperf3 -J -t "$secs" -c ibench.internal) ;;
		esac
		echo "round $r: $out"
		results+=("$out")
	done
done

say "round trips of a 64-byte request (p50, p99)"
inB "$tmp/bin/rtt" -listen 10.77.0.2:7001 &
inB "$tmp/bin/rtt" -listen 100.90.0.2:7002 &
sleep 0.5
echo "underlay        $(inA "$tmp/bin/rtt" -to 10.77.0.2:7001)"
echo "mesh host       $(inA "$tmp/bin/rtt" -to 100.90.0.2:7002)"
echo "mesh container  $(pmA exec iclient.app rtt -to ibench.internal:7000)"

say "the agent's RSS with its overlay up"
echo "$idle_rss"
echo "node oba, just after the runs above: $(rss A)"
sleep 30
echo "node oba, 30 s after them (the agent gives a burst's buffers back once it is over): $(rss A)"

say "summary (medians of $rounds rounds)"
python3 - "${results[@]}" <<'PY'
import re, statistics, sys
runs = {}
for line in sys.argv[1:]:
    name = line[:16].strip()
    gbit = float(re.search(r"([\d.]+) Gbit/s", line).group(1))
    cpu = float(re.search(r"([\d.]+) CPU s per GB", line).group(1))
    runs.setdefault(name, []).append((gbit, cpu))
g = {}
for name, rs in runs.items():
    g[name] = statistics.median(r[0] for r in rs)
    print(f"{name:16s} {g[name]:6.2f} Gbit/s   {statistics.median(r[1] for r in rs):6.2f} CPU s per GB   (runs: {', '.join(f'{r[0]:.2f}' for r in rs)})")
print(f"mesh container / bare host: {g['mesh container'] / g['bare']:.2f} (goal >= 0.9)")
print(f"mesh host / bare host:      {g['mesh host'] / g['bare']:.2f}")
print(f"bare / underlay:            {g['bare'] / g['underlay']:.2f}")
print(f"mesh container / debian:    {g['mesh container'] / g['debian']:.2f}")
PY
