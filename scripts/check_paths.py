#!/usr/bin/env python3
"""Every repository path named in the repository's own text exists.

Reads the files git tracks (code comments and strings, docs, scripts, SQL)
and finds the words that name a path in the repository: a path that starts
with one of the repository's top-level folders (src/, core/, tests/, docs/,
...) and names a file (with an extension) or a folder (ending with /). A
`:line` or `#anchor` after it is ignored, and so is a path with a pattern in
it (`*`, `{`, `<`, `NN`). Prints each path that names nothing, with where it
is named; exits 1 when there is one. Run by scripts/check.sh.

Paths that name what is made at run time (target/, bench/out/...: what git
ignores) are not checked, nor the shipped upgrade scripts
(sql/snowflake_id--*.sql), whose comments describe the tree of the
release they were written in and never change.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEXT = (".rs", ".py", ".sh", ".md", ".sql", ".toml", ".txt", ".json", ".control", ".ini", ".yml",
        ".yaml", ".rb", ".java", ".js", "run")
PATTERN = re.compile(r"(?<![\w./-])((?:{tops})/[\w./-]*[\w/])")
WILD = ("*", "{", "<", "NN", "XX", "...", "OLD", "NEW")


def tracked() -> list[str]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, check=True, capture_output=True)
    return [p for p in out.stdout.decode().split("\0") if p]


def ignored(path: str) -> bool:
    """Whether git ignores `path` (made at run time, as bench/out/)."""
    return subprocess.run(["git", "check-ignore", "-q", "--no-index", path], cwd=REPO).returncode == 0


def main() -> int:
    files = tracked()
    tops = sorted({p.split("/", 1)[0] for p in files if "/" in p})
    pattern = re.compile(PATTERN.pattern.format(tops="|".join(re.escape(t) for t in tops)))
    known = set(files) | {os.path.dirname(p) for p in files}
    for p in list(known):
        while p:
            p = os.path.dirname(p)
            known.add(p)
    missing = []
    for path in files:
        if not path.endswith(TEXT) or re.match(r"(tests/upgrade|sql)/snowflake_id--", path):
            continue
        try:
            with open(os.path.join(REPO, path), encoding="utf-8") as f:
                lines = f.read().splitlines()
        except (UnicodeDecodeError, FileNotFoundError):
            continue
        for number, line in enumerate(lines, 1):
            for match in pattern.finditer(line):
                named = match.group(1).rstrip(".")
                tail = line[match.end():match.end() + 1]
                if any(w in named for w in WILD) or tail in ("*", "{", "<"):
                    continue
                base = os.path.basename(named.rstrip("/"))
                if not named.endswith("/") and "." not in base:
                    continue  # a word such as "tests/fleet" in prose, or a command
                if named.rstrip("/") not in known and not ignored(named):
                    missing.append(f"{path}:{number}: {named}")
    for m in missing:
        print(f"names a path that does not exist: {m}")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
