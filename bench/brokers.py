"""Start, stop and measure the brokers the matrix compares: meshmq and its peers.

Every broker runs as a subprocess in its own temporary directory, on free
loopback ports found by binding port 0, with comparable durability settings
(see docs/benchmarks.md). :class:`RssSampler` samples the broker's process
tree (``VmRSS`` summed over the tree) and :func:`tree_cpu` reads its CPU times,
so JVM and Erlang brokers are measured whole. Nothing here talks to anything but 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

HOST = "127.0.0.1"
ACTIVEMQ_HOME = Path("/usr/share/activemq")


def free_ports(n: int) -> list[int]:
    """``n`` distinct free TCP ports on 127.0.0.1 (bound to port 0, then released)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind((HOST, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def port_accepts(port: int, timeout: float = 0.2) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=timeout):
            return True
    except OSError:
        return False


def _rss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def _children(pid: int) -> list[int]:
    """All descendants of ``pid`` (from /proc/<pid>/task/*/children)."""
    out: list[int] = []
    stack = [pid]
    while stack:
        p = stack.pop()
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for t in tasks:
            try:
                with open(f"/proc/{p}/task/{t}/children") as fh:
                    kids = [int(x) for x in fh.read().split()]
            except OSError:
                continue
            out.extend(kids)
            stack.extend(kids)
    return out


def tree_rss_kb(pid: int) -> int:
    return sum(_rss_kb(p) for p in [pid, *_children(pid)])


def tree_cpu(pids: list[int | None], children: bool = True) -> dict[tuple[int, float], float]:
    """User + system CPU seconds so far of each process in ``pids`` (and, with
    ``children``, all their descendants), keyed by (pid, start time) so a reused pid is
    not mistaken for the old process."""
    out: dict[tuple[int, float], float] = {}
    for pid in pids:
        if pid is None:
            continue
        try:
            root = psutil.Process(pid)
            procs = [root, *(root.children(recursive=True) if children else [])]
        except psutil.Error:
            continue
        for p in procs:
            try:
                with p.oneshot():
                    t = p.cpu_times()
                    out[(p.pid, p.create_time())] = t.user + t.system
            except psutil.Error:
                continue
    return out


def cpu_spent(before: dict[tuple[int, float], float],
              after: dict[tuple[int, float], float]) -> float:
    """CPU seconds between two :func:`tree_cpu` readings: processes started in between
    count whole; one that exited in between is lost (its time is not readable any more)."""
    return sum(t - before.get(k, 0.0) for k, t in after.items())


class RssSampler:
    """Peak RSS of a process tree, sampled every ``interval`` seconds in a thread."""

    def __init__(self, pid_fn: callable, interval: float = 0.1) -> None:  # type: ignore[valid-type]
        self._pid_fn = pid_fn
        self.interval = interval
        self.peak_kb = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def sample(self) -> int:
        pid = self._pid_fn()
        kb = tree_rss_kb(pid) if pid else 0
        self.peak_kb = max(self.peak_kb, kb)
        return kb

    def reset(self) -> None:
        self.peak_kb = 0
        self.sample()

    def peak_mb(self) -> float:
        self.sample()
        return round(self.peak_kb / 1024, 1)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(2)


class Broker:
    """A broker under test. Subclasses fill in ``_command`` and the config files."""

    name = "broker"
    protocols: frozenset[str] = frozenset()
    persistent_store = True  # can it keep a backlog on disk across a restart?
    start_timeout = 60.0
    credentials: tuple[str, str] | None = None  # STOMP login/passcode, if it wants one
    vhost = "/"  # STOMP CONNECT host header
    max_inflight_bytes = 0  # >0: cap the confirmation window to this many bytes

    def __init__(self, workdir: Path | None = None) -> None:
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix=f"bench-{self.name}-"))
        self._own_workdir = workdir is None
        self.ports: dict[str, int] = {}
        self.proc: subprocess.Popen[bytes] | None = None
        self._aux: list[subprocess.Popen[bytes]] = []
        self.log_path = self.workdir / "broker.log"

    # -- what subclasses provide -------------------------------------------------
    def missing(self) -> str | None:
        """None if the broker can run here, else why not."""
        return None

    def configure(self) -> None:
        """Pick ports and write config files (once; restarts reuse them)."""

    def command(self) -> tuple[list[str], dict[str, str]]:
        raise NotImplementedError

    def version(self) -> str:
        return ""

    # -- lifecycle -----------------------------------------------------------------
    def start(self) -> float:
        """Start (or restart) the broker; returns seconds until every port accepts."""
        if not self.ports:
            self.configure()
        cmd, env = self.command()
        full_env = {**os.environ, **env}
        t0 = time.perf_counter()
        self.proc = subprocess.Popen(cmd, stdout=self.log_path.open("ab"),
                                     stderr=subprocess.STDOUT, env=full_env,
                                     cwd=self.workdir, start_new_session=True)
        deadline = time.time() + self.start_timeout
        pending = set(self.ports.values())
        while pending:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}: "
                                   + self.log_tail())
            if time.time() > deadline:
                self.stop()
                raise RuntimeError(f"{self.name} did not open its ports in "
                                   f"{self.start_timeout:.0f}s: " + self.log_tail())
            pending = {p for p in pending if not port_accepts(p)}
            if pending:
                time.sleep(0.02)
        return time.perf_counter() - t0

    def log_tail(self, n: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"

    def pid(self) -> int | None:
        return self.proc.pid if self.proc and self.proc.poll() is None else None

    def stop(self, kill: bool = False, timeout: float = 60.0) -> float:
        """Stop the broker (SIGTERM, or SIGKILL if ``kill``); returns seconds taken."""
        t0 = time.perf_counter()
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL if kill else signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        # Anything left in the process group (e.g. erl_child_setup) goes too.
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        return time.perf_counter() - t0

    def close(self) -> None:
        """Stop everything this broker started and remove its directory."""
        self.stop()
        for p in self._aux:
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
        self._aux.clear()
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def wipe_data(self) -> None:
        """Forget stored messages (between scenarios that must start empty)."""


# Which meshmq build the harness runs: "compiled" (the mypyc wheel that `pip install .` gives
# operators, unpacked by dev/build-compiled into build/compiled-lib) or "python" (the
# editable pure-Python install). run_matrix.py --meshmq-build sets it. MESHMQ_COMPILED_LIB
# names another folder (bench/device-run.sh: a build for another machine's Python).
COMPILED_LIB = Path(os.environ.get("MESHMQ_COMPILED_LIB") or
                    Path(__file__).resolve().parent.parent / "build" / "compiled-lib")


def meshmq_build() -> str:
    build = os.environ.get("MESHMQ_BENCH_BUILD", "compiled")
    if build not in ("compiled", "python"):
        raise SystemExit(f"MESHMQ_BENCH_BUILD must be compiled or python, not {build!r}")
    if build == "compiled" and not (COMPILED_LIB / "meshmq").is_dir():
        raise SystemExit(f"no compiled meshmq in {COMPILED_LIB}: run dev/build-compiled "
                         "(bench/setup-peers.sh does), or MESHMQ_BENCH_BUILD=python")
    return build


class Meshmq(Broker):
    name = "meshmq"
    protocols = frozenset({"stomp"})

    def version(self) -> str:
        try:
            from importlib.metadata import version

            return f"meshmq {version('meshmq')} ({meshmq_build()})"
        except Exception:  # pragma: no cover - informational only
            return f"meshmq ({meshmq_build()})"

    def __init__(self, workdir: Path | None = None) -> None:
        super().__init__(workdir)
        # MQTT arrived in meshmq while this harness was being written: use it if present.
        import importlib.util

        if importlib.util.find_spec("meshmq.transport.mqtt_server") is not None:
            self.protocols = frozenset({"stomp", "mqtt"})

    def configure(self) -> None:
        (self.ports["stomp"],) = free_ports(1)
        mqtt = ""
        if "mqtt" in self.protocols:
            (self.ports["mqtt"],) = free_ports(1)
            mqtt = f"""
[[listeners]]
name = "mqtt"
url = "mqtt://{HOST}:{self.ports['mqtt']}"
max_connections = 5000
"""
        data = self.workdir / "data"
        self.config = self.workdir / "meshmq.toml"
        self.config.write_text(f"""[broker]
name = "bench"
data_directory = "{data}"

[[listeners]]
name = "stomp"
url = "stomp://{HOST}:{self.ports['stomp']}"
max_connections = 5000
{mqtt}
[store]
fsync = true

[management]
enabled = false
""")

    def command(self) -> tuple[list[str], dict[str, str]]:
        env = {"PYTHONPATH": str(COMPILED_LIB)} if meshmq_build() == "compiled" else {}
        return ([sys.executable, "-m", "meshmq.cli.main", "--log-level", "WARNING", "broker",
                 "--config", str(self.config)], env)

    def wipe_data(self) -> None:
        shutil.rmtree(self.workdir / "data", ignore_errors=True)


ACTIVEMQ_XML = """<beans
  xmlns="http://www.springframework.org/schema/beans"
  xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance"
  xsi:schemaLocation="http://www.springframework.org/schema/beans http://www.springframework.org/schema/beans/spring-beans.xsd
  http://activemq.apache.org/schema/core http://activemq.apache.org/schema/core/activemq-core.xsd">
  <!-- Written by meshmq's bench/brokers.py: upstream defaults, loopback listeners,
       KahaDB in the temp dir with a disk sync per journal write (as meshmq's fsync). -->
  <broker xmlns="http://activemq.apache.org/schema/core" brokerName="bench"
          dataDirectory="{data}" useJmx="false" persistent="true" schedulerSupport="false">
    <persistenceAdapter>
      <kahaDB directory="{data}/kahadb" journalDiskSyncStrategy="always"/>
    </persistenceAdapter>
    <systemUsage>
      <systemUsage>
        <memoryUsage><memoryUsage percentOfJvmHeap="70"/></memoryUsage>
        <storeUsage><storeUsage limit="20 gb"/></storeUsage>
        <tempUsage><tempUsage limit="10 gb"/></tempUsage>
      </systemUsage>
    </systemUsage>
    <transportConnectors>
      <transportConnector name="stomp"
        uri="stomp://{host}:{stomp}?maximumConnections=5000&amp;wireFormat.maxFrameSize=104857600"/>
      <transportConnector name="mqtt"
        uri="mqtt://{host}:{mqtt}?maximumConnections=5000&amp;wireFormat.maxFrameSize=104857600"/>
    </transportConnectors>
  </broker>
</beans>
"""

LOG4J2 = """rootLogger.level = WARN
rootLogger.appenderRef.console.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d %-5p %c{1} - %m%n
logger.startup.name = org.apache.activemq.broker.BrokerService
logger.startup.level = INFO
"""


MQTT_JARS = ("/usr/share/java/mqtt-client.jar", "/usr/share/java/hawtdispatch.jar",
             "/usr/share/java/hawtdispatch-transport.jar")

# Debian's ActiveMQ logs through log4j 1.2.
LOG4J1 = """log4j.rootLogger=WARN, console
log4j.appender.console=org.apache.log4j.ConsoleAppender
log4j.appender.console.layout=org.apache.log4j.PatternLayout
log4j.appender.console.layout.ConversionPattern=%d %-5p %c{1} - %m%n
log4j.logger.org.apache.activemq.broker.BrokerService=INFO
"""


class ActiveMQ(Broker):
    name = "activemq"
    protocols = frozenset({"stomp", "mqtt"})
    start_timeout = 90.0

    def missing(self) -> str | None:
        if not (ACTIVEMQ_HOME / "bin" / "activemq.jar").exists():
            return "Debian package activemq not installed (bench/setup-peers.sh)"
        if not shutil.which("java"):
            return "no java (openjdk-17-jre-headless)"
        return None

    def mqtt_missing(self) -> str | None:
        if not Path(MQTT_JARS[0]).exists():
            return "Debian package libmqtt-client-java not installed (MQTT codec)"
        return None

    def version(self) -> str:
        try:
            out = subprocess.run(["dpkg-query", "-W", "-f=${Version}", "activemq"],
                                 capture_output=True, text=True, check=False).stdout
            return f"ActiveMQ {out.split('+')[0]}"
        except OSError:
            return "ActiveMQ"

    def configure(self) -> None:
        self.ports["stomp"], self.ports["mqtt"] = free_ports(2)
        conf = self.workdir / "conf"
        conf.mkdir(exist_ok=True)
        (conf / "activemq.xml").write_text(ACTIVEMQ_XML.format(
            data=self.workdir / "data", host=HOST, **self.ports))
        (conf / "log4j2.properties").write_text(LOG4J2)
        (conf / "log4j.properties").write_text(LOG4J1)
        # Debian's activemq package lacks the MQTT codec its MQTT transport needs; the
        # harness adds Debian's own jars to this instance's ${activemq.base}/lib.
        lib = self.workdir / "lib"
        lib.mkdir(exist_ok=True)
        for jar in MQTT_JARS:
            if Path(jar).exists() and not (lib / Path(jar).name).exists():
                (lib / Path(jar).name).symlink_to(jar)

    def command(self) -> tuple[list[str], dict[str, str]]:
        conf = self.workdir / "conf"
        opens = [f"--add-opens={m}=ALL-UNNAMED" for m in (
            "java.base/java.security", "java.base/java.net", "java.base/java.lang",
            "java.base/java.util", "java.naming/javax.naming.spi",
            "java.rmi/sun.rmi.transport.tcp", "java.base/java.util.concurrent",
            "java.base/java.util.concurrent.atomic")]
        return ([
            "java", "-Xms64M", "-Xmx1G",  # bin/activemq's upstream ACTIVEMQ_OPTS_MEMORY
            "-Djava.awt.headless=true", "-Djava.io.tmpdir=" + str(self.workdir / "tmp"),
            "--add-reads=java.xml=java.logging", *opens,
            f"-Dlog4j2.configurationFile={conf / 'log4j2.properties'}",
            f"-Dlog4j.configuration=file:{conf / 'log4j.properties'}",
            f"-Dactivemq.classpath={conf}:{ACTIVEMQ_HOME / 'lib'}/",
            f"-Dactivemq.home={ACTIVEMQ_HOME}", f"-Dactivemq.base={self.workdir}",
            f"-Dactivemq.conf={conf}", f"-Dactivemq.data={self.workdir / 'data'}",
            "-jar", str(ACTIVEMQ_HOME / "bin" / "activemq.jar"),
            "start", f"xbean:file:{conf / 'activemq.xml'}"], {})

    def start(self) -> float:
        (self.workdir / "tmp").mkdir(exist_ok=True)
        return super().start()

    def wipe_data(self) -> None:
        shutil.rmtree(self.workdir / "data", ignore_errors=True)


class RabbitMQ(Broker):
    name = "rabbitmq"
    credentials = ("guest", "guest")
    protocols = frozenset({"stomp", "mqtt"})
    start_timeout = 90.0
    server = Path("/usr/lib/rabbitmq/bin/rabbitmq-server")

    def missing(self) -> str | None:
        if not self.server.exists():
            return "Debian package rabbitmq-server not installed (bench/setup-peers.sh)"
        if not shutil.which("epmd"):
            return "no epmd (erlang-base)"
        return None

    def version(self) -> str:
        out = subprocess.run(["dpkg-query", "-W", "-f=${Version}", "rabbitmq-server"],
                             capture_output=True, text=True, check=False).stdout
        return f"RabbitMQ {out.split('-')[0]}"

    def configure(self) -> None:
        (self.ports["stomp"], self.ports["mqtt"], self.amqp, self.dist,
         self.epmd_port) = free_ports(5)
        self.node = f"bench{os.getpid()}x{self.amqp}@localhost"
        w = self.workdir
        (w / "rabbitmq.conf").write_text(f"""listeners.tcp.default = {HOST}:{self.amqp}
stomp.listeners.tcp.1 = {HOST}:{self.ports['stomp']}
mqtt.listeners.tcp.1 = {HOST}:{self.ports['mqtt']}
mqtt.allow_anonymous = true
loopback_users = none
log.console = true
log.console.level = warning
log.file = false
""")
        (w / "enabled_plugins").write_text("[rabbitmq_stomp,rabbitmq_mqtt].\n")
        (w / "rabbitmq-env.conf").write_text("")
        cookie = w / ".erlang.cookie"
        cookie.write_text("MESHMQBENCHCOOKIE")
        cookie.chmod(0o400)
        # Our own epmd on a free port, so no system-wide daemon is left behind.
        epmd = subprocess.Popen(["epmd", "-port", str(self.epmd_port), "-address", HOST],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
        self._aux.append(epmd)
        deadline = time.time() + 10
        while not port_accepts(self.epmd_port) and time.time() < deadline:
            time.sleep(0.05)

    def command(self) -> tuple[list[str], dict[str, str]]:
        w = self.workdir
        env = {
            "HOME": str(w), "RABBITMQ_NODENAME": self.node,
            "RABBITMQ_NODE_IP_ADDRESS": HOST, "RABBITMQ_NODE_PORT": str(self.amqp),
            "RABBITMQ_DIST_PORT": str(self.dist), "ERL_EPMD_PORT": str(self.epmd_port),
            "ERL_EPMD_ADDRESS": HOST,
            "RABBITMQ_MNESIA_BASE": str(w / "mnesia"), "RABBITMQ_LOG_BASE": str(w / "log"),
            "RABBITMQ_CONFIG_FILE": str(w / "rabbitmq.conf"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(w / "advanced.config"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(w / "enabled_plugins"),
            "RABBITMQ_CONF_ENV_FILE": str(w / "rabbitmq-env.conf"),
            "RABBITMQ_PID_FILE": str(w / "rabbitmq.pid"),
            "RABBITMQ_LOGS": "-",
        }
        return [str(self.server)], env

    def wipe_data(self) -> None:
        shutil.rmtree(self.workdir / "mnesia", ignore_errors=True)


class Mosquitto(Broker):
    name = "mosquitto"
    protocols = frozenset({"mqtt"})

    def missing(self) -> str | None:
        if not shutil.which("mosquitto") and not Path("/usr/sbin/mosquitto").exists():
            return "Debian package mosquitto not installed (bench/setup-peers.sh)"
        return None

    def version(self) -> str:
        out = subprocess.run(["dpkg-query", "-W", "-f=${Version}", "mosquitto"],
                             capture_output=True, text=True, check=False).stdout
        return f"Mosquitto {out.split('-')[0]}"

    def configure(self) -> None:
        (self.ports["mqtt"],) = free_ports(1)
        (self.workdir / "mosquitto.conf").write_text(f"""listener {self.ports['mqtt']} {HOST}
allow_anonymous true
persistence true
persistence_location {self.workdir}/
log_dest stdout
log_type error
log_type warning
max_connections -1
""")

    def command(self) -> tuple[list[str], dict[str, str]]:
        exe = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
        return [exe, "-c", str(self.workdir / "mosquitto.conf")], {}


class CoilMQ(Broker):
    name = "coilmq"
    protocols = frozenset({"stomp"})
    persistent_store = False  # its default store is in memory
    vhost = socket.getfqdn()  # its STOMP 1.2 CONNECT insists on the host's FQDN

    def missing(self) -> str | None:
        r = subprocess.run([sys.executable, "-c", "import coilmq"], capture_output=True,
                           check=False)
        return None if r.returncode == 0 else "coilmq not importable (pip install coilmq)"

    def version(self) -> str:
        from importlib.metadata import version

        return f"coilmq {version('coilmq')}"

    # Its parser (coilmq.util.frames) fails when a frame is split across its 4 KB
    # reads, so the harness keeps fewer unconfirmed bytes than that in flight.
    max_inflight_bytes = 4000

    def configure(self) -> None:
        (self.ports["stomp"],) = free_ports(1)

    def command(self) -> tuple[list[str], dict[str, str]]:
        return ([sys.executable, "-m", "coilmq.start", "--host", HOST, "--port",
                 str(self.ports["stomp"])], {})


AMQTT_YAML = """---
listeners:
  default:
    type: tcp
    bind: {host}:{port}
plugins:
  amqtt.plugins.authentication.AnonymousAuthPlugin:
    allow_anonymous: true
"""


class Amqtt(Broker):
    name = "amqtt"
    protocols = frozenset({"mqtt"})
    persistent_store = False

    def missing(self) -> str | None:
        r = subprocess.run([sys.executable, "-c", "import amqtt.broker"], capture_output=True,
                           check=False)
        return None if r.returncode == 0 else "amqtt not importable (pip install amqtt)"

    def version(self) -> str:
        from importlib.metadata import version

        return f"amqtt {version('amqtt')}"

    def configure(self) -> None:
        (self.ports["mqtt"],) = free_ports(1)
        (self.workdir / "amqtt.yaml").write_text(
            AMQTT_YAML.format(host=HOST, port=self.ports["mqtt"]))

    def command(self) -> tuple[list[str], dict[str, str]]:
        exe = Path(sys.executable).with_name("amqtt")
        cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "amqtt.scripts.broker_script"]
        return [*cmd, "-c", str(self.workdir / "amqtt.yaml")], {}


class NullSink(Broker):
    """bench/nullsink.py: the load generator's ceiling (no broker work at all)."""

    name = "nullsink"
    protocols = frozenset({"stomp", "mqtt"})
    persistent_store = False

    def version(self) -> str:
        return "null sink (bench/nullsink.py)"

    def configure(self) -> None:
        self.ports["stomp"], self.ports["mqtt"] = free_ports(2)

    def command(self) -> tuple[list[str], dict[str, str]]:
        return ([sys.executable, str(Path(__file__).with_name("nullsink.py")),
                 "--stomp-port", str(self.ports["stomp"]),
                 "--mqtt-port", str(self.ports["mqtt"])], {})


ALL_BROKERS: dict[str, type[Broker]] = {
    cls.name: cls for cls in (NullSink, ActiveMQ, Meshmq, RabbitMQ, Mosquitto, CoilMQ, Amqtt)
}
