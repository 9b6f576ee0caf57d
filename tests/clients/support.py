"""Shared by tests/test_clients_*.py: installs the real clients (pinned, by
tests/clients/install.sh) and gives each test module one preloaded server.

A client that cannot be installed FAILS the tests with the reason; nothing
here skips."""
from __future__ import annotations

import os
import subprocess

import pytest

from conftest import Cluster

HERE = os.path.dirname(os.path.abspath(__file__))
INSTALL = os.path.join(HERE, "install.sh")
JS_DIR = os.path.join(HERE, "js")
README = os.path.join(HERE, "..", "..", "README.md")

_installed: list[str] = []


def install_clients() -> str:
    """Runs install.sh once per session; fails the test with its output
    when it cannot install something."""
    if not _installed:
        proc = subprocess.run(["bash", INSTALL], capture_output=True, text=True,
                              stdin=subprocess.DEVNULL, timeout=900)
        if proc.returncode != 0:
            pytest.fail("could not install the real clients (tests/clients/install.sh, exit "
                        f"{proc.returncode}):\n{proc.stdout}\n{proc.stderr}", pytrace=False)
        _installed.append(proc.stdout.strip())
    return _installed[0]


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


def readme_block(start_marker: str, lang: str) -> str:
    """The README's ```lang block that follows the line `start_marker`."""
    text = open(README).read()
    at = text.index(start_marker)
    fence = f"```{lang}\n"
    begin = text.index(fence, at) + len(fence)
    end = text.index("```", begin)
    return text[begin:end]
