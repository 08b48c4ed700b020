#!/usr/bin/env bash
# Runs a one-node mesh on this machine (Debian 12, as root): installs Podman and
# Go if missing, builds mesh into /usr/local/bin, initialises /var/lib/mesh once
# and starts the agent (under systemd when PID 1 is systemd, else in the
# background with its log in /var/log/mesh-agent.log).
# Usage, as root: bash contrib/quickstart.sh   (MESH_NAME / MESH_ADDRESS override)
set -euo pipefail
cd "$(dirname "$0")/.."
. contrib/lib.sh
need_root

apt_install podman runc uidmap slirp4netns iproute2 ca-certificates git busybox-static restic
# Podman 4.3 on hosts with hybrid cgroups needs runc (crun refuses them; see
# ../shared/ENVIRONMENT.md). A drop-in, never the main file. The agent sets
# each container's rlimits itself, to what the Podman service may grant.
conf=/etc/containers/containers.conf.d/50-mesh.conf
if [ ! -e "$conf" ]; then
	mkdir -p "$(dirname "$conf")"
	printf '# Written by mesh contrib/quickstart.sh.\n[engine]\nruntime = "runc"\n' > "$conf"
	say "wrote $conf"
fi

ensure_go
say "building mesh"
go build -ldflags "-s -w -X main.version=$(git describe --always --dirty 2>/dev/null || echo dev)" -o /usr/local/bin/mesh .

# Every image examples/ names, made here from Debian packages and the mesh
# binary, so the tour works without a registry.
bash contrib/example-images.sh /usr/local/bin/mesh

export MESH_DATA_DIR=/var/lib/mesh
if [ ! -e "$MESH_DATA_DIR/node.json" ]; then
	name=${MESH_NAME:-$(hostname -s | tr 'A-Z_' 'a-z-' | sed 's/[^a-z0-9-]//g')}
	addr=${MESH_ADDRESS:-$(ip -4 route get 192.0.2.1 2>/dev/null | sed -n 's/.* src \([0-9.]*\).*/\1/p')}
	[ -n "$addr" ] || addr=$(hostname -I 2>/dev/null | awk '{print $1}')
	[ -n "$addr" ] || addr=127.0.0.1
	say "mesh init --name $name --address $addr"
	mesh init --name "$name" --address "$addr"
fi

if mesh status >/dev/null 2>&1; then
	say "an agent is already running"
elif [ "$(cat /proc/1/comm 2>/dev/null)" = systemd ]; then
	install -m 0644 contrib/mesh.service /etc/systemd/system/mesh.service
	systemctl daemon-reload
	systemctl enable --now mesh.service
else
	say "starting mesh agent (log: /var/log/mesh-agent.log)"
	nohup /usr/local/bin/mesh agent >>/var/log/mesh-agent.log 2>&1 &
fi
# Wait (30 s at most) until the agent answers and its node leads.
for _ in $(seq 1 150); do
	mesh status 2>/dev/null | grep -q 'leader: [a-z0-9]' && break
	sleep 0.2
done
mesh status || die "the agent did not come up; see /var/log/mesh-agent.log (or journalctl -u mesh)"
cat <<TXT

A one-node mesh is running. Next:
  mesh module add examples/whoami.yaml
  mesh assign $(mesh node list | awk 'NR==2{print $1}') whoami --wait
  mesh resolve whoami.internal
  mesh plan $(mesh node list | awk 'NR==2{print $1}') --diff
TXT
