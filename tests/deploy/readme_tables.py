#!/usr/bin/python3
"""Each module README's table of files matches the tree.

A table of files is a table whose header's first cell is "file". Each of
the modules' READMEs (MODULES below) has one, and for every README.md below
the source root that has one (but those under node_modules), the first cell
of each of its rows names files or folders in backticks, relative to the
README's folder: `shard.h/.cc` is shard.h and
shard.cc, `base/` a whole folder, `no-*.yaml` a pattern; several may share a
cell (`a.cc`, `b.cc`). Then:
  - every file git tracks in that folder, and in its subfolders that have no
    README of their own, is named by some row;
  - every name in a row exists (a pattern matches at least one file).

  tests/deploy/readme_tables.py [SOURCE_DIR]
Exit 0 when every table matches, 1 with one line per mismatch, 77 (skipped)
outside a git checkout.
"""
import fnmatch
import os
import re
import subprocess
import sys

root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                       os.path.join(os.path.dirname(__file__), "..", ".."))
try:
    tracked = subprocess.run(["git", "-C", root, "ls-files"], check=True,
                             capture_output=True, text=True).stdout.split("\n")
except (OSError, subprocess.CalledProcessError) as e:
    print(f"readme_tables: skipped, {root} is not a git checkout ({e})")
    sys.exit(77)
tracked = [t for t in tracked if t and os.path.exists(os.path.join(root, t))]
MODULES = ["ps", "monitor", "worker", "worker/python", "tests", "tests/chaos", "bench",
           "deploy"]
readmes = sorted(t for t in tracked
                 if os.path.basename(t) == "README.md" and "/" in t and "node_modules/" not in t)
folders_with_readme = {os.path.dirname(r) for r in readmes}


def names_in(cell):
    """The paths a table cell names: `a.h/.cc` is a.h and a.cc."""
    out = []
    for token in re.findall(r"`([^`]+)`", cell):
        token = token.strip()
        m = re.fullmatch(r"(.*?)(\.[A-Za-z0-9]+)((?:/\.[A-Za-z0-9]+)+)", token)
        if m and not token.endswith("/"):
            out.append(m.group(1) + m.group(2))
            out += [m.group(1) + ext for ext in m.group(3).split("/")[1:]]
        else:
            out.append(token)
    return out


def covered(rel, entries):
    for e in entries:
        if e.endswith("/"):
            if rel.startswith(e) or fnmatch.fnmatch(rel, e + "*"):
                return True
        elif rel == e or fnmatch.fnmatch(rel, e):
            return True
    return False


errors = [f"{m}/README.md is missing" for m in MODULES if f"{m}/README.md" not in readmes]
for readme in readmes:
    folder = os.path.dirname(readme)
    entries = []
    in_table = False
    for line in open(os.path.join(root, readme), encoding="utf-8"):
        if not line.startswith("|"):
            in_table = False
            continue
        first = line.split("|")[1].strip()
        if re.fullmatch(r"[\s|:-]*", line.strip()):
            continue
        if not in_table:
            in_table = first == "file"  # the header row
            continue
        entries += names_in(first)
    if not entries:
        if folder in MODULES:
            errors.append(f"{readme}: no table of files")
        continue
    files = []
    for t in tracked:
        if not t.startswith(folder + "/") or t == readme:
            continue
        rel = t[len(folder) + 1:]
        # Leave files to a subfolder's own README.
        parts = rel.split("/")
        owned = any("/".join([folder] + parts[:i]) in folders_with_readme
                    for i in range(1, len(parts)))
        if not owned:
            files.append(rel)
    for rel in files:
        if not covered(rel, entries):
            errors.append(f"{readme}: {folder}/{rel} is in no row of its table")
    for e in entries:
        pattern = e.rstrip("/")
        hit = any(rel == pattern or rel.startswith(pattern + "/") or fnmatch.fnmatch(rel, pattern)
                  or fnmatch.fnmatch(rel, e + "*")
                  for rel in (t[len(folder) + 1:] for t in tracked if t.startswith(folder + "/")))
        if not hit:
            errors.append(f"{readme}: the table names {e}, which {folder}/ does not have")

for e in errors:
    print(e)
print(f"readme_tables: {len(readmes)} READMEs, {len(errors)} mismatch(es)")
sys.exit(1 if errors else 0)
