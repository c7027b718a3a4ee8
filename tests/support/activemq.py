"""Apache ActiveMQ 5 (Debian package ``activemq``) as a subprocess on free loopback ports.

What it takes to run Debian's ActiveMQ outside its init scripts (the same recipe as
bench/brokers.py): an activemq.xml with STOMP and MQTT connectors, log4j settings, the
``--add-opens`` a modern JVM needs, and the MQTT codec jars Debian ships separately
linked into the instance's ``lib``. ``missing()`` says why it cannot run here.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import ClassVar

from tests.support.ports import free_ports

ACTIVEMQ_HOME = Path("/usr/share/activemq")
MQTT_JARS = ("/usr/share/java/mqtt-client.jar", "/usr/share/java/hawtdispatch.jar",
             "/usr/share/java/hawtdispatch-transport.jar")

_XML = """<beans xmlns="http://www.springframework.org/schema/beans"
  xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance"
  xsi:schemaLocation="http://www.springframework.org/schema/beans http://www.springframework.org/schema/beans/spring-beans.xsd
  http://activemq.apache.org/schema/core http://activemq.apache.org/schema/core/activemq-core.xsd">
  <broker xmlns="http://activemq.apache.org/schema/core" brokerName="{name}"
          dataDirectory="{data}" useJmx="false" persistent="true" schedulerSupport="false"
          advisorySupport="false">
    <persistenceAdapter><kahaDB directory="{data}/kahadb"/></persistenceAdapter>
    <transportConnectors>
      <transportConnector name="stomp" uri="stomp://127.0.0.1:{stomp}"/>
      <transportConnector name="mqtt" uri="mqtt://127.0.0.1:{mqtt}"/>
    </transportConnectors>
  </broker>
</beans>
"""
_LOG4J = """log4j.rootLogger=WARN, console
log4j.appender.console=org.apache.log4j.ConsoleAppender
log4j.appender.console.layout=org.apache.log4j.PatternLayout
log4j.appender.console.layout.ConversionPattern=%d %-5p %c{1} - %m%n
"""
_OPENS = ("java.base/java.security", "java.base/java.net", "java.base/java.lang",
          "java.base/java.util", "java.naming/javax.naming.spi",
          "java.rmi/sun.rmi.transport.tcp", "java.base/java.util.concurrent",
          "java.base/java.util.concurrent.atomic")


def missing() -> str | None:
    if not (ACTIVEMQ_HOME / "bin" / "activemq.jar").exists():
        return "Debian package activemq is not installed (dev/apt.d/activemq)"
    if shutil.which("java") is None:
        return "no java runtime (openjdk-17-jre-headless)"
    if not all(Path(j).exists() for j in MQTT_JARS):
        return "libmqtt-client-java / libhawtdispatch-java are not installed"
    return None


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


class ActiveMQProcess:
    """One ActiveMQ instance in ``workdir``; ``start()`` again restarts it on the same
    ports and data."""

    running: ClassVar[set[ActiveMQProcess]] = set()

    def __init__(self, workdir: Path, name: str = "amq") -> None:
        self.workdir = workdir
        self.name = name
        self.ports: dict[str, int] = {}
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = workdir / "activemq.log"

    def _configure(self) -> None:
        self.ports["stomp"], self.ports["mqtt"] = free_ports(2)
        conf = self.workdir / "conf"
        conf.mkdir(parents=True, exist_ok=True)
        (conf / "activemq.xml").write_text(_XML.format(name=self.name,
                                                       data=self.workdir / "data", **self.ports))
        (conf / "log4j.properties").write_text(_LOG4J)
        lib = self.workdir / "lib"
        lib.mkdir(exist_ok=True)
        for jar in MQTT_JARS:
            link = lib / Path(jar).name
            if not link.exists():
                link.symlink_to(jar)
        (self.workdir / "tmp").mkdir(exist_ok=True)

    def start(self, timeout: float = 120.0) -> ActiveMQProcess:
        if not self.ports:
            self._configure()
        conf = self.workdir / "conf"
        cmd = ["java", "-Xms32M", "-Xmx256M", "-Djava.awt.headless=true",
               f"-Djava.io.tmpdir={self.workdir / 'tmp'}", "--add-reads=java.xml=java.logging",
               *(f"--add-opens={m}=ALL-UNNAMED" for m in _OPENS),
               f"-Dlog4j.configuration=file:{conf / 'log4j.properties'}",
               f"-Dactivemq.classpath={conf}:{ACTIVEMQ_HOME / 'lib'}/",
               f"-Dactivemq.home={ACTIVEMQ_HOME}", f"-Dactivemq.base={self.workdir}",
               f"-Dactivemq.conf={conf}", f"-Dactivemq.data={self.workdir / 'data'}",
               "-jar", str(ACTIVEMQ_HOME / "bin" / "activemq.jar"),
               "start", f"xbean:file:{conf / 'activemq.xml'}"]
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                         cwd=self.workdir, env=dict(os.environ),
                                         start_new_session=True)
        ActiveMQProcess.running.add(self)
        deadline = time.monotonic() + timeout
        delay = 0.05
        while not all(_accepts(p) for p in self.ports.values()):
            if self.proc.poll() is not None:
                raise RuntimeError(f"ActiveMQ exited with {self.proc.returncode}:\n"
                                   + self.log_path.read_text(errors="replace")[-3000:])
            if time.monotonic() > deadline:
                self.kill9()
                raise RuntimeError(f"ActiveMQ did not open its ports within {timeout} s")
            time.sleep(delay)  # a back-off inside a deadline poll
            delay = min(delay * 2, 0.5)
        return self

    def kill9(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)
        ActiveMQProcess.running.discard(self)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill9()
        ActiveMQProcess.running.discard(self)
