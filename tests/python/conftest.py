"""Fixtures of the `pacer` Python package's tests: a job of real processes
(pacer-monitor and pacer-server from PACER_BUILD_DIR) on 127.0.0.1, every
process stopped at the end, its logs kept under the test's tmp_path."""

import os
import re
import subprocess
import time

import pytest

BUILD = os.environ.get("PACER_BUILD_DIR", "")
PYTHON = "/usr/bin/python3"  # Debian's, with numpy and torch


def binary(name):
    for sub in ("monitor", "ps", "worker"):
        path = os.path.join(BUILD, sub, name)
        if os.access(path, os.X_OK):
            return path
    pytest.fail("%s not found under PACER_BUILD_DIR=%r" % (name, BUILD))


class Job:
    """A monitor and its shards; workers are the test's own."""

    def __init__(self, tmp_path):
        self.dir = tmp_path
        self.procs = []
        self.monitor = None

    def start(self, name, args, env=None):
        out = open(os.path.join(self.dir, name + ".out"), "w")
        log = open(os.path.join(self.dir, name + ".log"), "w")
        p = subprocess.Popen(args, stdout=out, stderr=log, stdin=subprocess.DEVNULL, env=env)
        self.procs.append(p)
        return p

    def address(self, name, timeout=10.0):
        path = os.path.join(self.dir, name + ".out")
        deadline = time.time() + timeout
        while time.time() < deadline:
            with open(path) as f:
                m = re.search(r"^listening (tcp://\S+)", f.read(), re.M)
            if m:
                return m.group(1)
            time.sleep(0.05)
        pytest.fail("%s printed no address; its log:\n%s" % (name, self.log(name)))

    def log(self, name):
        path = os.path.join(self.dir, name + ".log")
        return open(path).read() if os.path.exists(path) else ""

    def run(self, shards=1, monitor_args=()):
        self.start("monitor", [binary("pacer-monitor"), "--listen", "tcp://127.0.0.1:0",
                               "--metrics-addr", "off", "--min-shards", str(shards),
                               *monitor_args])
        self.monitor = self.address("monitor")
        for i in range(shards):
            self.start("shard%d" % i, [binary("pacer-server"), "--listen", "tcp://127.0.0.1:0",
                                       "--monitor", self.monitor, "--metrics-addr", "off"])
        return self.monitor

    def worker(self, name, script, *args, env=None):
        """A Python worker process: `script` (in this folder) with `args`."""
        here = os.path.dirname(os.path.abspath(__file__))
        e = dict(os.environ, PACER_MONITOR=self.monitor, **(env or {}))
        return self.start(name, [PYTHON, os.path.join(here, script), *map(str, args)], env=e)

    def stop(self):
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


@pytest.fixture
def job(tmp_path):
    j = Job(tmp_path)
    yield j
    j.stop()
