#!/usr/bin/python3
"""Clang's thread-safety analysis over ps/, monitor/ and worker/.

  check.py BUILD_DIR [--clang CLANGXX] [-j N]

Every translation unit of those directories in BUILD_DIR/compile_commands.json
is parsed by clang (whatever compiler built it) with
-fsyntax-only -Wthread-safety -Werror: a field marked ABSL_GUARDED_BY(mu) read
or written without mu held, or a function marked
ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) called without it, fails the test. First it
proves the analysis bites (tests/thread_safety/unguarded.cc must be rejected),
and that no std::mutex / std::lock_guard / std::scoped_lock / owning
std::unique_lock is left in those directories (clang cannot see through
libstdc++'s: they must be pacer::Mutex / pacer::MutexLock, ps/base/mutex.h),
nor a lock()/unlock() on MutexLock::native().
Exit 77 (skipped) without clang++, but under CI=true (deploy/setup.sh installs
clang there): then a missing clang fails. It also fails when it checked none
of the files that hold the planes' locks (an empty or stale
compile_commands.json, or a filter that dropped them), so it cannot pass
without checking."""
import argparse, atexit, json, os, re, shlex, shutil, subprocess, sys, tempfile, time
from concurrent.futures import ThreadPoolExecutor

DIRS = ('ps', 'monitor', 'worker')
FLAGS = ['-fsyntax-only', '-Wthread-safety', '-Werror']
# Declarations of unannotated locks (a std::unique_lock<std::mutex>& parameter,
# as Clock::WaitUntil takes, is fine: MutexLock::native() lends one).
FORBIDDEN = re.compile(r'\bstd::(?:recursive_|timed_|shared_)?mutex\s+\w+\s*[;{]'
                       r'|\bstd::(?:lock_guard|scoped_lock)\b'
                       r'|\bstd::unique_lock<[^>]*>\s+\w+\s*[({]'
                       # native() lends the std::unique_lock to waits only: unlocking
                       # it by hand would be invisible to the analysis.
                       r'|\.native\(\)\.(?:un)?lock\(')

ap = argparse.ArgumentParser()
ap.add_argument('build_dir')
ap.add_argument('--clang', default=None)
ap.add_argument('-j', type=int, default=os.cpu_count() or 1)
a = ap.parse_args()
root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
clang = a.clang or shutil.which('clang++') or shutil.which('clang++-14')
if not clang:
    if os.environ.get('CI') == 'true':
        print('check.py: no clang++ under CI (deploy/setup.sh installs Debian\'s clang)')
        sys.exit(1)
    print('check.py: no clang++ (Debian: apt-get install clang); skipped')
    sys.exit(77)
db_path = os.path.join(a.build_dir, 'compile_commands.json')
if not os.path.exists(db_path):
    print(f'check.py: {db_path} missing (CMAKE_EXPORT_COMPILE_COMMANDS)'); sys.exit(1)

failed = False
# 1. No lock clang cannot see.
for d in DIRS:
    for dirpath, _, files in os.walk(os.path.join(root, d)):
        for name in files:
            if not name.endswith(('.h', '.cc')):
                continue
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root)
            if rel == 'ps/base/mutex.h':
                continue
            for n, line in enumerate(open(path, encoding='utf-8', errors='replace'), 1):
                if FORBIDDEN.search(line.split('//')[0]):
                    print(f'{rel}:{n}: use pacer::Mutex / pacer::MutexLock (ps/base/mutex.h): {line.strip()}')
                    failed = True

# 2. The analysis is on: a known violation is rejected, its correct half is not.
fixture = os.path.join(root, 'tests/thread_safety/unguarded.cc')
base = [clang, '-std=c++20', '-I', root] + FLAGS + [fixture]
ok = subprocess.run(base, capture_output=True, text=True)
bad = subprocess.run(base + ['-DPACER_TSA_BUG'], capture_output=True, text=True)
if ok.returncode != 0 or bad.returncode == 0 or 'requires holding mutex' not in bad.stderr:
    print('check.py: the thread-safety analysis does not bite on tests/thread_safety/unguarded.cc')
    print(ok.stderr + bad.stderr)
    failed = True

# 3. Every translation unit of ps/, monitor/, worker/ that can see an
# annotation: one that includes no annotated file has nothing to check. Which
# files each includes comes from ninja's record of the last build (ninja -t
# deps; tests/run.sh builds before it tests, so the record is current);
# without it, every translation unit.
ANNOTATION = re.compile(r'\bABSL_(?:PT_)?GUARDED_BY\b|\bABSL_(?:EXCLUSIVE|SHARED)_LOCKS_REQUIRED\b|\bABSL_LOCKABLE\b')
annotated = set()
for d in DIRS:
    for dirpath, _, files in os.walk(os.path.join(root, d)):
        for name in files:
            path = os.path.join(dirpath, name)
            if name.endswith(('.h', '.cc')) and ANNOTATION.search(open(path, encoding='utf-8', errors='replace').read()):
                annotated.add(os.path.realpath(path))
sees = None  # source -> whether it includes an annotated file
try:
    deps = subprocess.run(['ninja', '-C', a.build_dir, '-t', 'deps'], capture_output=True, text=True, check=True).stdout
    sees, source, hit = {}, None, False
    for line in deps.splitlines() + ['#deps end']:
        if '#deps' in line:
            if source:
                sees[source] = sees.get(source, False) or hit
            source, hit, first = None, False, True
        elif line.startswith('    '):
            dep = os.path.realpath(os.path.join(a.build_dir, line.strip()))
            if first:
                source, first = dep, False
            hit = hit or dep in annotated
except (OSError, subprocess.CalledProcessError):
    print('check.py: no ninja deps; every translation unit is checked')

jobs, seen = [], set()
for e in json.load(open(db_path)):
    f = os.path.abspath(os.path.join(e.get('directory', ''), e['file']))
    rel = os.path.relpath(f, root)
    if not f.endswith('.cc') or rel.split(os.sep)[0] not in DIRS or rel in seen:
        continue
    seen.add(rel)
    if sees is not None and not sees.get(os.path.realpath(f), True):
        continue  # sees no annotation (a file ninja has not built yet is checked)
    args = e['arguments'] if 'arguments' in e else shlex.split(e['command'])
    keep, it = [], iter(args[1:])
    for x in it:
        if x in ('-o', '-MF', '-MT', '-MQ'):
            next(it)
        elif x in ('-c', e['file'], f) or x.startswith(('-O', '-W', '-MD', '-MMD', '-g')):
            pass
        elif x == '-isystem':
            inc = next(it)
            if os.path.isdir(inc):  # /usr/local/cuda/include on a CUDA build only
                keep += [x, inc]
        else:
            keep.append(x)
    jobs.append((rel, [clang] + keep + FLAGS + [f], e.get('directory', root)))

# The files that hold the planes' locks: each must be among those checked.
MUST = ['ps/base/parallel.cc', 'ps/base/fault.cc', 'ps/checkpoint_writer.cc',
        'ps/shard_server.cc', 'worker/trainer.cc', 'worker/monitor_session.cc',
        'worker/partition_reader.cc', 'worker/evaluation.cc']
missing = [m for m in MUST if m not in {rel for rel, _, _ in jobs}]
if missing:
    print(f'check.py: {", ".join(missing)} not checked (not in {db_path}, or no annotation seen)')
    failed = True


# A precompiled header of the standard and third-party headers most files
# include (never Pacer's own, whose annotations are what is checked), one per
# set of flags that at least PCH_MIN files share: about a third less time per
# file. A set whose header fails to build is checked without one.
PRE = ['algorithm', 'atomic', 'chrono', 'cmath', 'condition_variable', 'cstdint',
       'cstring', 'deque', 'functional', 'map', 'memory', 'mutex', 'optional',
       'set', 'span', 'string', 'string_view', 'thread', 'utility', 'vector',
       'absl/status/status.h', 'absl/status/statusor.h', 'prometheus/counter.h',
       'prometheus/gauge.h', 'prometheus/histogram.h', 'prometheus/registry.h',
       'spdlog/spdlog.h', 'flatbuffers/flatbuffers.h', 'zmq.h', 'random', 'sstream',
       'limits', 'cstdio', 'unordered_map', 'absl/strings/str_cat.h',
       'absl/strings/str_format.h']
PCH_MIN = 8
t0 = time.time()
pch_dir = tempfile.mkdtemp(prefix='pacer-tsa-')
atexit.register(shutil.rmtree, pch_dir, True)
header = os.path.join(pch_dir, 'pre.h')
with open(header, 'w') as out:
    out.writelines(f'#include <{h}>\n' for h in PRE)
groups = {}
for rel, cmd, cwd in jobs:
    groups.setdefault(tuple(cmd[1:-len(FLAGS) - 1]), []).append(rel)


def build_pch(item):
    n, flags = item
    pch = os.path.join(pch_dir, f'pre{n}.pch')
    p = subprocess.run([clang] + list(flags) + ['-x', 'c++-header', header, '-o', pch],
                       capture_output=True, text=True)
    return flags, (pch if p.returncode == 0 else None), p.stderr


pch_of = {}
with ThreadPoolExecutor(a.j) as ex:
    big = [(n, f) for n, f in enumerate(groups) if len(groups[f]) >= PCH_MIN]
    for flags, pch, err in ex.map(build_pch, big):
        if pch:
            pch_of[flags] = pch
        else:
            print(f'check.py: no precompiled header for {len(groups[flags])} files '
                  f'(checked without one):\n{err[:500]}')


def run(job):
    rel, cmd, cwd = job
    pch = pch_of.get(tuple(cmd[1:-len(FLAGS) - 1]))
    if pch:
        cmd = cmd[:-1] + ['-include-pch', pch, cmd[-1]]
    p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    return rel, p.returncode, p.stderr

with ThreadPoolExecutor(a.j) as ex:
    for rel, rc, err in ex.map(run, jobs):
        if rc:
            failed = True
            print(f'FAIL {rel}\n{err}')
print(f'check.py: {len(jobs)} translation units ({sum(len(groups[f]) for f in pch_of)} '
      f'with a precompiled header), {time.time() - t0:.0f} s, '
      f'{"FAILED" if failed else "ok"}')
sys.exit(1 if failed else 0)
