#!/usr/bin/env bash
# Install the peer brokers the benchmark matrix compares meshmq with.
# Idempotent: installs only what is missing; `apt-get update` runs at most once
# per invocation (and only when something is missing). Safe to re-run.
#
#   bash bench/setup-peers.sh            # everything
#   VENV=/path/to/venv bash bench/setup-peers.sh
#
# Debian packages: activemq (5.17), rabbitmq-server, mosquitto, openjdk-17-jre-headless,
# libmqtt-client-java + libhawtdispatch-java (ActiveMQ's MQTT transport needs them).
# PyPI (into the venv): coilmq, amqtt, matplotlib.
# The packaged services are NOT left running: the harness starts each broker
# itself, on free loopback ports, in a temp directory.
set -u
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENV="${VENV:-$HERE/../.venv}"
PIP="$VENV/bin/pip"
status=0

need_apt=()
dpkg -s activemq >/dev/null 2>&1 || need_apt+=(activemq)
dpkg -s rabbitmq-server >/dev/null 2>&1 || need_apt+=(rabbitmq-server)
dpkg -s mosquitto >/dev/null 2>&1 || need_apt+=(mosquitto)
# ActiveMQ's MQTT transport needs the fusesource MQTT codec, which Debian packages apart.
dpkg -s libmqtt-client-java >/dev/null 2>&1 || need_apt+=(libmqtt-client-java)
dpkg -s libhawtdispatch-java >/dev/null 2>&1 || need_apt+=(libhawtdispatch-java)
command -v java >/dev/null 2>&1 || need_apt+=(openjdk-17-jre-headless)

if [ ${#need_apt[@]} -gt 0 ]; then
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    echo "setup-peers: apt-get install ${need_apt[*]}"
    $SUDO apt-get update -qq || status=1
    # Do not start the packaged services (policy-rc.d 101 = action forbidden).
    pol=/usr/sbin/policy-rc.d
    had_pol=0; [ -e "$pol" ] && had_pol=1
    if [ $had_pol -eq 0 ]; then printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$pol" >/dev/null; $SUDO chmod +x "$pol"; fi
    for pkg in "${need_apt[@]}"; do
        DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "$pkg" \
            >>"${SETUP_LOG:-/tmp/meshmq-setup-peers.log}" 2>&1 \
            || { echo "setup-peers: could not install $pkg" >&2; status=1; }
    done
    [ $had_pol -eq 1 ] || $SUDO rm -f "$pol"
fi
# The packages may have started their services anyway (no systemd here, but be sure).
for svc in activemq rabbitmq-server mosquitto; do
    command -v service >/dev/null 2>&1 && service "$svc" stop >/dev/null 2>&1 || true
done

pip_need=()
for mod in coilmq amqtt matplotlib; do
    "$VENV/bin/python" -c "import $mod" >/dev/null 2>&1 || pip_need+=("$mod")
done
if [ ${#pip_need[@]} -gt 0 ]; then
    echo "setup-peers: pip install ${pip_need[*]}"
    for pkg in "${pip_need[@]}"; do
        "$PIP" install -q "$pkg" || { echo "setup-peers: could not pip install $pkg" >&2; status=1; }
    done
fi
# meshmq itself as operators install it: the wheel with the mypyc-compiled hot path.
if [ ! -d "$HERE/../build/compiled-lib/meshmq" ]; then
    echo "setup-peers: building meshmq's compiled hot path (dev/build-compiled)"
    "$HERE/../dev/build-compiled" || { echo "setup-peers: compiled build failed" >&2; status=1; }
fi
exit $status
