#!/usr/bin/env python3
"""Puts a generated section into bench/RESULTS.md: replaces the text between
<!-- NAME:begin ... --> and <!-- NAME:end --> with SUMMARY (which carries its
own markers), or appends it under TITLE when the markers are not there yet.

  put-section.py RESULTS.md NAME TITLE SUMMARY
"""
import re
import sys

path, name, title, summary_path = sys.argv[1:5]
summary = open(summary_path).read().strip()
text = open(path).read()
pattern = re.compile(r"<!-- %s:begin.*?<!-- %s:end -->" % (name, name), re.S)
if pattern.search(text):
    text = pattern.sub(lambda _: summary, text)
else:
    text = text.rstrip() + "\n\n## " + title + "\n\n" + summary + "\n"
open(path, "w").write(text)
