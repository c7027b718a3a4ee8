"""A real Spark standalone cluster (one master, one worker) on 127.0.0.1 for tests.

Started from the pyspark package's own ``spark-class`` (no separate Spark install),
on free ports, with a small worker; ready when the master's JSON status lists the
worker alive. ``stop`` ends both processes (they were started here, by their ids).
"""

from __future__ import annotations

import json
import os
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

from tests.support.brokers import poll
from tests.support.ports import free_port

# Options for every JVM the tests start. Spark's JVMs here live seconds to minutes on
# small data and spend much of their CPU in the C2 compiler and in parallel GC threads;
# the C1 compiler alone and the serial GC nearly halve the CPU of the Spark tests on two
# cores (the audit transform, verdict and report tests: 52 -> 28 CPU-seconds). Not for
# production audits: on real traces C2's faster code pays for itself.
TEST_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def use_test_jvm_options() -> None:
    """Spark drivers started from Python (the tests' sessions, and the audit and example
    jobs the tests run as subprocesses, which inherit the environment) and their
    executors get TEST_JVM_OPTIONS, unless PYSPARK_SUBMIT_ARGS is already set."""
    os.environ.setdefault(
        "PYSPARK_SUBMIT_ARGS",
        f"--driver-java-options '{TEST_JVM_OPTIONS}' "
        f"--conf 'spark.executor.extraJavaOptions={TEST_JVM_OPTIONS}' pyspark-shell")


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


class StandaloneCluster:
    def __init__(self, root: Path, *, worker_cores: int = 1,
                 worker_memory: str = "1g") -> None:
        self.root = root
        self.port, self.ui_port = free_port(), free_port()
        self.worker_cores, self.worker_memory = worker_cores, worker_memory
        self.procs: list[subprocess.Popen[bytes]] = []

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def _spawn(self, name: str, *args: str) -> None:
        env = dict(os.environ, SPARK_HOME=str(spark_home()), SPARK_LOCAL_IP="127.0.0.1",
                   SPARK_NO_DAEMONIZE="1", SPARK_DAEMON_JAVA_OPTS=TEST_JVM_OPTIONS)
        with (self.root / f"{name}.log").open("wb") as log:  # the child keeps its copy
            self.procs.append(subprocess.Popen(
                [str(spark_home() / "bin" / "spark-class"), *args], stdout=log,
                stderr=subprocess.STDOUT, env=env, cwd=self.root))

    def status(self) -> dict[str, Any]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/",
                                        timeout=5) as response:
                result: dict[str, Any] = json.load(response)
                return result
        except (OSError, ValueError):
            # Not up yet: no answer, or (seen while the master starts under load) an HTML
            # page where the JSON status will be.
            return {}

    def start(self) -> StandaloneCluster:
        """Master, then worker; a failure stops what had started, then raises."""
        try:
            return self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> StandaloneCluster:
        self.root.mkdir(parents=True, exist_ok=True)
        self._spawn("master", "org.apache.spark.deploy.master.Master", "--host",
                    "127.0.0.1", "--port", str(self.port), "--webui-port",
                    str(self.ui_port))
        poll(lambda: self.status().get("status") == "ALIVE", 90, "the Spark master")
        self._spawn("worker", "org.apache.spark.deploy.worker.Worker", "--host",
                    "127.0.0.1", "--port", str(free_port()), "--webui-port",
                    str(free_port()), "--cores", str(self.worker_cores), "--memory",
                    self.worker_memory, "--work-dir", str(self.root / "work"), self.url)
        poll(lambda: self.status().get("aliveworkers", 0) >= 1, 90, "a Spark worker")
        return self

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)

    def __enter__(self) -> StandaloneCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
