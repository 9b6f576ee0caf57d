"""Shared by the client tests (tests/clients/test_*.py): installs the real
clients (pinned, by tests/clients/install.sh), gives each test module one
preloaded server, and reads the blocks the docs quote.

A client that cannot be installed FAILS the tests with the reason; nothing
here skips."""
from __future__ import annotations

import os
import re
import subprocess

import pytest

from harness import Cluster

HERE = os.path.dirname(os.path.abspath(__file__))
JS_DIR = os.path.join(HERE, "js")
REPO = os.path.dirname(os.path.dirname(HERE))

_installed: dict[tuple[str, ...], str] = {}


def install_clients(script: str = "install.sh", *args: str) -> str:
    """Runs an install script of tests/clients (install.sh, or
    install_java_rails.sh java|rails) once per session; fails the test with
    its output when it cannot install something. Returns what it printed."""
    key = (script, *args)
    if key not in _installed:
        proc = subprocess.run(["bash", os.path.join(HERE, script), *args], capture_output=True,
                              text=True, stdin=subprocess.DEVNULL, timeout=900)
        if proc.returncode != 0:
            pytest.fail(f"could not install the real clients (tests/clients/{script} "
                        f"{' '.join(args)}, exit {proc.returncode}):\n{proc.stdout}\n"
                        f"{proc.stderr}", pytrace=False)
        _installed[key] = proc.stdout.strip()
    return _installed[key]


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
