"""Shared by the client tests (tests/clients/test_*.py): checks that the
real clients are installed (pinned, by scripts/clients.sh, which
scripts/test.sh runs before any test), gives each test module one preloaded
server, and reads the blocks the docs quote.

A client that is not installed FAILS the tests with the reason; nothing
here skips or installs."""
from __future__ import annotations

import os
import re
import subprocess

import pytest

from harness import Cluster

HERE = os.path.dirname(os.path.abspath(__file__))
JS_DIR = os.path.join(HERE, "js")
REPO = os.path.dirname(os.path.dirname(HERE))

_checked: dict[tuple[str, ...], str] = {}


def require_clients(*parts: str) -> str:
    """Checks, once per session, that the real clients of `parts` (python,
    debian, npm, java, rails; the first three without arguments) are
    installed at their pinned versions (`scripts/clients.sh --check`). A test
    never installs anything: scripts/test.sh installs them all before any
    test starts. Fails the test with what is missing; returns the versions."""
    parts = parts or ("python", "debian", "npm")
    if parts not in _checked:
        proc = subprocess.run(["bash", os.path.join(REPO, "scripts", "clients.sh"), "--check",
                               *parts], capture_output=True, text=True,
                              stdin=subprocess.DEVNULL, timeout=120)
        if proc.returncode != 0:
            pytest.fail(f"the real clients are not installed (scripts/clients.sh --check "
                        f"{' '.join(parts)}, exit {proc.returncode}):\n{proc.stdout}\n"
                        f"{proc.stderr}", pytrace=False)
        _checked[parts] = proc.stdout.strip()
    return _checked[parts]


def module_server(request, settings: dict | None = None, tcp: bool = False):
    """A started, preloaded server with the extension in db postgres, kept
    for the whole module; stopped at its end (dir kept if a test failed)."""
    failed_before = request.session.testsfailed
    c = Cluster(settings=settings, tcp=tcp)
    try:
        c.start()
        c.create_extension()
        yield c
    finally:
        keep = request.session.testsfailed > failed_before
        if keep:
            print(f"\nkept {c.dir}", flush=True)
        c.destroy(keep=keep)


def doc_blocks(doc: str, lang: str) -> list[str]:
    """The ```lang blocks of the Markdown file `doc` (a path from the
    repository's root, e.g. "docs/guides/clients.md"), stripped; fails the
    test if the file is missing."""
    path = os.path.join(REPO, doc)
    assert os.path.isfile(path), f"{doc} is missing"
    with open(path) as f:
        text = f.read()
    return [b.strip() for b in re.findall(rf"^```{re.escape(lang)}\n(.*?)^```", text,
                                          flags=re.M | re.S)]
