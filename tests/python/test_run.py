"""pacer-run, the one-command launcher: the multi-machine recipe (--serve,
then --join) on 127.0.0.1, and that it leaves no process behind and says
why on its own output when it is interrupted, when a worker fails, or when
the monitor refuses its flags, while killing nothing it did not start.
(The README's PyTorch command is run as written by
tests/deploy/readme_walkthrough.sh.)"""

import os
import re
import signal
import subprocess
import time
import uuid

from conftest import PYTHON, binary

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")


def pacer_run():
    return binary("pacer-run")


def marked_env(mark):
    """The environment of a launcher whose processes carry `mark` (they
    inherit it), so that the test can find any left behind."""
    return dict(os.environ, PACER_TEST_MARK=mark,
                PYTHONPATH=os.environ.get("PYTHONPATH", ""))


def left_behind(mark):
    """Pids of running processes (not zombies) whose environment holds `mark`."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open("/proc/%s/environ" % pid, "rb") as f:
                env = f.read()
            with open("/proc/%s/stat" % pid) as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if ("PACER_TEST_MARK=" + mark).encode() in env.split(b"\0") and state != "Z":
            found.append(int(pid))
    return found


def assert_none_left(mark):
    deadline = time.time() + 5
    while left_behind(mark) and time.time() < deadline:
        time.sleep(0.1)
    assert left_behind(mark) == [], "processes left behind"


def run(args, mark, timeout=180, **kw):
    p = subprocess.run([pacer_run(), *args], env=marked_env(mark), stdin=subprocess.DEVNULL,
                       capture_output=True, text=True, timeout=timeout, **kw)
    return p.returncode, p.stdout, p.stderr


def test_serve_then_two_joins(tmp_path):
    """The multi-machine recipe on one machine: one --serve, two --join."""
    mark = uuid.uuid4().hex
    serve_out = open(tmp_path / "serve.stdout", "w+")
    serve_err = open(tmp_path / "serve.stderr", "w+")
    serve = subprocess.Popen([pacer_run(), "--serve", "--workers", "2", "--shards", "1",
                              "--time-cap", "8", "--out", str(tmp_path / "serve")],
                             env=marked_env(mark), stdin=subprocess.DEVNULL,
                             stdout=serve_out, stderr=serve_err)
    try:
        address = None
        deadline = time.time() + 30
        while address is None and time.time() < deadline and serve.poll() is None:
            m = re.search(r"^monitor (tcp://\S+)$", open(tmp_path / "serve.stdout").read(), re.M)
            address = m and m.group(1)
            time.sleep(0.05)
        assert address, open(tmp_path / "serve.stderr").read()
        joins = [subprocess.Popen([pacer_run(), "--join", address, "--workers", "1",
                                   "--out", str(tmp_path / ("join%d" % i)), "--",
                                   "pacer-worker", "--train-limit", "4000", "--test-limit",
                                   "500"],
                                  env=marked_env(mark), stdin=subprocess.DEVNULL,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for i in range(2)]
        try:
            for j in joins:
                out, err = j.communicate(timeout=120)
                assert j.returncode == 0, out + err
                assert re.search(r"\[worker \d+ rank \d+\] worker summary", out), out
        finally:
            for j in joins:
                if j.poll() is None:
                    j.kill()
        assert serve.wait(timeout=60) == 0, open(tmp_path / "serve.stderr").read()
        assert "final test accuracy" in open(tmp_path / "serve.stdout").read()
    finally:
        if serve.poll() is None:
            serve.kill()
    assert_none_left(mark)


def test_what_an_exited_worker_left_in_its_group_is_stopped(tmp_path):
    """A worker command that exits 0 and leaves a process of its own behind
    (in its process group): pacer-run stops that process too."""
    mark = uuid.uuid4().hex
    rc, out, err = run(["--workers", "1", "--shards", "1", "--grace", "1", "--out",
                        str(tmp_path), "--", "/bin/sh", "-c", "sleep 300 & exit 0"], mark)
    assert rc == 0, out + err
    assert_none_left(mark)


def test_quickstart_takes_a_learning_rate_over_its_own(tmp_path):
    """deploy/quickstart.sh passes the monitor its own --lr 0.1; one given
    with --monitor-args comes later and wins (a flag given twice takes its
    last value): the job runs at lr 0.001."""
    mark = uuid.uuid4().hex
    p = subprocess.run([os.path.join(ROOT, "deploy", "quickstart.sh"), "--skip-setup",
                        "--workers", "1", "--shards", "1", "--time-cap", "3",
                        "--out", str(tmp_path), "--monitor-args", "--lr 0.001"],
                       env=marked_env(mark), stdin=subprocess.DEVNULL, capture_output=True,
                       text=True, timeout=120)
    both = p.stdout + p.stderr
    assert p.returncode in (0, 1), both[-3000:]  # 1: the target not reached in 3 s
    assert re.search(r"job \d+ running \(\w+, sgd lr 0\.001, ", both), both[-3000:]
    assert_none_left(mark)


def wait_for(path, pattern, proc, timeout):
    """The first match of `pattern` in the file at `path`, polled until
    `timeout` or until `proc` exits; None if none."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        m = re.search(pattern, open(path).read(), re.M)
        if m or proc.poll() is not None:
            return m
        time.sleep(0.05)
    return None


def test_ctrl_c_stops_everything_in_order(tmp_path):
    mark = uuid.uuid4().hex
    log = tmp_path / "pacer-run.txt"
    with open(log, "w") as f:
        p = subprocess.Popen([pacer_run(), "--workers", "2", "--shards", "1", "--time-cap", "120",
                              "--out", str(tmp_path / "out"), "--", "pacer-worker"],
                             env=marked_env(mark), stdin=subprocess.DEVNULL, stdout=f,
                             stderr=subprocess.STDOUT, start_new_session=True)
    try:
        assert wait_for(log, r"\[worker \d+ rank 1\]", p, 60), log.read_text()
        os.killpg(p.pid, signal.SIGINT)  # what a Ctrl-C at the terminal does
        p.wait(timeout=60)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    out = log.read_text()
    assert p.returncode == 130, out
    assert "interrupted" in out
    # In order: each worker left on its SIGTERM (exit 0, with its summary).
    assert len(re.findall(r"^\[pacer-run\] worker \d+ rank \d+ +0 +[0-9.]+ ", out, re.M)) == 2, out
    assert_none_left(mark)


def test_failed_worker_stops_the_job_and_spares_what_it_did_not_start(tmp_path):
    mark = uuid.uuid4().hex
    # A sleeper in the launcher's own process group, started before it: not
    # the launcher's to kill.
    script = ("sleep 60 >/dev/null 2>&1 & echo $! > %s; exec %s --workers 2 --shards 1 --time-cap 120 "
              "--out %s -- %s -c 'import sys, time; sys.stderr.write(\"boom\\n\"); "
              "sys.exit(1)'") % (tmp_path / "sleeper", pacer_run(), tmp_path / "out", PYTHON)
    p = subprocess.run(["setsid", "/bin/sh", "-c", script], env=marked_env(mark),
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
    both = p.stdout + p.stderr
    assert p.returncode == 1, both
    assert "exited with code 1" in both and "boom" in both, both
    assert "a worker failed" in both
    sleeper = int((tmp_path / "sleeper").read_text())
    try:
        with open("/proc/%d/stat" % sleeper) as f:  # still there, and not a zombie
            assert f.read().rsplit(")", 1)[1].split()[0] != "Z"
    finally:
        os.kill(sleeper, signal.SIGKILL)
    assert_none_left(mark)


def test_monitor_refusing_its_flags_is_shown(tmp_path):
    mark = uuid.uuid4().hex
    rc, out, err = run(["--workers", "1", "--shards", "1", "--monitor-args", "--mode nonsense",
                        "--out", str(tmp_path), "--", "pacer-worker"], mark, timeout=60)
    assert rc == 1, out + err
    assert "monitor exited with code 2 before it listened" in err, err
    assert "--mode" in err and "nonsense" in err, err
    assert_none_left(mark)
