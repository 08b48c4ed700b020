#!/usr/bin/env bash
# Resolver benchmark (issue: every node answers mesh names): dnsperf against
# the mesh resolver, dnsmasq and unbound, each serving the same 10,000 names on
# loopback, with the same query mix: a third existing A, a third unknown names
# (NXDOMAIN), a third AAAA of existing names (NODATA). Then the mesh resolver
# with 100 names against 10,000. Then all three again, each with half of a
# CPU and dnsperf on the other (capacity at an equal CPU budget). CoreDNS is
# left out (see the closing note).
# Usage: sudo bash bench/dns.sh [SECONDS per run, default 10]
set -euo pipefail
cd "$(dirname "$0")/.."
. contrib/lib.sh
need_root
ensure_go
apt_install dnsperf dnsmasq unbound
SECS=${1:-10}
N=10000
B=/var/tmp/mesh-dnsbench
CG=""
cleanup() {
	pkill -f "$B" 2>/dev/null || true
	rm -rf "$B"
	if [ -n "$CG" ]; then
		for _ in $(seq 1 50); do [ -s "$CG/cgroup.procs" ] || break; sleep 0.1; done
		rmdir "$CG" 2>/dev/null || true
	fi
}
cleanup; trap cleanup EXIT
mkdir -p "$B"

go build -o "$B/dnsserve" ./bench/dnsserve
# Names, the dnsmasq hosts file, the unbound zone, and the query mix.
awk -v n=$N 'BEGIN {
	for (i = 0; i < n; i++) {
		name = sprintf("n%06d.internal", i); ip = sprintf("10.%d.%d.%d", int(i/65536)%256, int(i/256)%256, i%256)
		print ip, name > "'"$B"'/hosts"
		printf "local-data: \"%s. 5 IN A %s\"\n", name, ip > "'"$B"'/unbound-data"
	}
	srand(1)
	for (q = 0; q < 30000; q++) {
		i = int(rand() * n); k = q % 3
		if (k == 0) printf "n%06d.internal A\n", i
		else if (k == 1) printf "nope%06d.internal A\n", i
		else printf "n%06d.internal AAAA\n", i
	}
}' > "$B/queries"
cat > "$B/unbound.conf" <<CONF
server:
  interface: 127.0.0.3@5355
  do-daemonize: no
  chroot: ""
  username: ""
  pidfile: ""
  use-syslog: no
  logfile: ""
  num-threads: 2
  access-control: 127.0.0.0/8 allow
  local-zone: "internal." static
  include: "$B/unbound-data"
remote-control:
  control-enable: no
CONF

"$B/dnsserve" -addr 127.0.0.1:5353 -names $N >"$B/mesh.log" 2>&1 &
dnsmasq --keep-in-foreground --no-resolv --no-hosts --conf-file=/dev/null --listen-address=127.0.0.2 --bind-interfaces \
	--port=5354 --addn-hosts="$B/hosts" --local=/internal/ --local-ttl=5 --pid-file="$B/dnsmasq.pid" --log-facility="$B/dnsmasq.log" &
unbound -c "$B/unbound.conf" >"$B/unbound.log" 2>&1 &
answers() { dnsperf -s "${1%:*}" -p "${1#*:}" -d <(echo "n000001.internal A") -n 1 2>/dev/null | grep -q "Queries completed:.*1 (100"; }
wait_answers() { # IP:PORT, within 10 s
	local deadline=$((SECONDS + 10))
	until answers "$1"; do
		[ $SECONDS -lt $deadline ] || die "server $1 does not answer"
		sleep 0.1
	done
}
for s in 127.0.0.1:5353 127.0.0.2:5354 127.0.0.3:5355; do wait_answers "$s"; done

PERF="" # what dnsperf runs under (the last section pins it)
pid_of() { pgrep -f "$1" | head -1; }
ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
run() { # LABEL IP PORT PIDPATTERN -> "label qps avg max lost cpu/query"; qps to $B/qps.LABEL
	local pid t0 t1 out
	pid=$(pid_of "$4"); t0=$(ticks "$pid")
	out=$($PERF dnsperf -s "$2" -p "$3" -d "$B/queries" -l "$SECS" -c 4 -T 1 2>&1)
	t1=$(ticks "$pid")
	qps=$(echo "$out" | sed -n 's/.*Queries per second: *\([0-9.]*\).*/\1/p')
	done=$(echo "$out" | sed -n 's/.*Queries completed: *\([0-9]*\).*/\1/p')
	avg=$(echo "$out" | sed -n 's/.*Average Latency (s): *\([0-9.]*\).*max \([0-9.]*\)).*/\1/p')
	max=$(echo "$out" | sed -n 's/.*Average Latency (s): *[0-9.]* (min [0-9.]*, max \([0-9.]*\)).*/\1/p')
	lost=$(echo "$out" | sed -n 's/.*Queries lost: *\([0-9]*\).*/\1/p')
	codes=$(echo "$out" | sed -n 's/.*Response codes: *\(.*\)/\1/p')
	awk -v l="$1" -v q="$qps" -v a="$avg" -v m="$max" -v x="$lost" -v c="$codes" -v t=$((t1 - t0)) -v hz="$(getconf CLK_TCK)" -v d="$done" \
		'BEGIN { printf "%-22s %8.0f qps  avg %6.3f ms  max %7.3f ms  lost %s  server CPU %5.2f us/query  (%s)\n", l, q, a*1000, m*1000, x, t / hz * 1e6 / d, c }'
	echo "$qps" >> "$B/qps.$1"
}
best() { sort -g "$B/qps.$1" | tail -1; }
# Three rounds, the servers taking turns, so a noisy moment on this shared
# machine does not decide; the best run of each server counts. dnsperf and
# the server share the two cores, so the server's CPU per query is printed
# too: it does not depend on what else the machine is doing.
echo "dnsperf, $SECS s per run, 30,000-query mix over $N names (1/3 A, 1/3 NXDOMAIN, 1/3 NODATA), loopback, 3 rounds:"
for round in 1 2 3; do
	run mesh 127.0.0.1 5353 "$B/dnsserve"
	run dnsmasq 127.0.0.2 5354 "dnsmasq --keep-in-foreground"
	run unbound 127.0.0.3 5355 "unbound -c $B"
done
for s in mesh dnsmasq unbound; do printf "best %-8s %8.0f qps\n" "$s" "$(best $s)"; done
peer=$(printf '%s\n' "$(best dnsmasq)" "$(best unbound)" | sort -g | tail -1)
awk -v m="$(best mesh)" -v b="$peer" 'BEGIN { printf "ratio mesh / best peer (qps, best of 3 each): %.2f\n", m / b }'

# Mesh at 100 names against 10,000, alternating; the best of three runs of
# each counts.
awk 'BEGIN { srand(2); for (q = 0; q < 30000; q++) { i = int(rand() * 100); k = q % 3
	if (k == 0) printf "n%06d.internal A\n", i; else if (k == 1) printf "nope%06d.internal A\n", i; else printf "n%06d.internal AAAA\n", i } }' > "$B/queries100"
cp "$B/queries" "$B/queries10000"
serve() {
	pkill -f "$B/dnsserve" || true
	while pgrep -f "$B/dnsserve" >/dev/null; do sleep 0.1; done
	"$B/dnsserve" -addr 127.0.0.1:5353 -names "$1" >>"$B/mesh.log" 2>&1 &
	wait_answers 127.0.0.1:5353
	cp "$B/queries$1" "$B/queries"
}
for round in 1 2 3; do
	for n in 100 10000; do
		serve $n
		run "mesh-$n" 127.0.0.1 5353 "$B/dnsserve"
	done
done
awk -v a="$(best mesh-10000)" -v b="$(best mesh-100)" 'BEGIN { printf "mesh at 10,000 names / at 100 names (best qps of three runs each): %.2f\n", a / b }'

# Capacity at an equal CPU budget. Above, dnsperf shares the two cores with
# the server it drives, and one dnsperf thread tops out near the fastest
# server's rate (pinned to a core of its own it reached about 105k qps here,
# while mesh used 0.86 of the other core), so those ratios are bounded by the
# load generator as much as by the servers. Here dnsperf runs alone on CPU 0
# and each server on CPU 1 with half of it (a CFS quota of 5 ms every 10 ms):
# the server is the bottleneck, and the qps is what it answers with the same
# CPU (the server CPU column says how each spent it).
echo "each server on half of CPU 1 (CFS quota), dnsperf alone on CPU 0, $N names, 3 rounds:"
if [ "$(nproc)" -lt 2 ]; then
	echo "  skipped: needs two CPUs"
	exit 0
fi
if [ -f /sys/fs/cgroup/cpu/cpu.cfs_quota_us ]; then
	CG=/sys/fs/cgroup/cpu/mesh-dnsbench
	mkdir -p "$CG" && echo 10000 >"$CG/cpu.cfs_period_us" && echo 5000 >"$CG/cpu.cfs_quota_us"
elif grep -qw cpu /sys/fs/cgroup/cgroup.controllers 2>/dev/null; then
	echo +cpu >/sys/fs/cgroup/cgroup.subtree_control 2>/dev/null || true
	CG=/sys/fs/cgroup/mesh-dnsbench
	mkdir -p "$CG" && echo "5000 10000" >"$CG/cpu.max"
else
	echo "  skipped: no cgroup cpu controller"
	exit 0
fi
budget() { sh -c 'echo $$ >"$0/cgroup.procs" && exec taskset -c 1 "$@"' "$CG" "$@"; }
pkill -f "$B/dnsserve" || true
pkill -f "dnsmasq --keep-in-foreground" || true
pkill -f "unbound -c $B" || true
while pgrep -f "$B/dnsserve|dnsmasq --keep-in-foreground|unbound -c $B" >/dev/null; do sleep 0.1; done
sed -i 's/num-threads: 2/num-threads: 1/' "$B/unbound.conf" # one CPU: one thread is unbound's best
budget "$B/dnsserve" -addr 127.0.0.1:5353 -names $N >>"$B/mesh.log" 2>&1 &
budget dnsmasq --keep-in-foreground --no-resolv --no-hosts --conf-file=/dev/null --listen-address=127.0.0.2 --bind-interfaces \
	--port=5354 --addn-hosts="$B/hosts" --local=/internal/ --local-ttl=5 --pid-file="$B/dnsmasq.pid" --log-facility="$B/dnsmasq.log" &
budget unbound -c "$B/unbound.conf" >>"$B/unbound.log" 2>&1 &
for s in 127.0.0.1:5353 127.0.0.2:5354 127.0.0.3:5355; do wait_answers "$s"; done
cp "$B/queries10000" "$B/queries"
PERF="taskset -c 0"
for round in 1 2 3; do
	run mesh@half 127.0.0.1 5353 "$B/dnsserve"
	run dnsmasq@half 127.0.0.2 5354 "dnsmasq --keep-in-foreground"
	run unbound@half 127.0.0.3 5355 "unbound -c $B"
done
peer=$(printf '%s\n' "$(best dnsmasq@half)" "$(best unbound@half)" | sort -g | tail -1)
awk -v m="$(best mesh@half)" -v b="$peer" 'BEGIN { printf "ratio mesh / best peer at an equal CPU budget (qps, best of 3 each): %.2f\n", m / b }'
