"""The versions the docs state agree with the files that set them (no
server): the release (Cargo.toml's version; snowflake_id.control takes it
from there), pgrx (Cargo.toml), the supported PostgreSQL versions
(SUPPORTED_PG_VERSIONS in scripts/lib.sh), which tests run on each
(tests_for_version in scripts/lib.sh) and the PostgreSQL each was tested
with (scripts/pg-wheels.txt, scripts/lib.sh's pins, Debian's postgresql-15
where it is installed). A doc that states another version fails here; the
self-tests plant one."""

from __future__ import annotations

import pathlib
import re
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
LIB_SH = (ROOT / "scripts" / "lib.sh").read_text()


def prose_files() -> list[pathlib.Path]:
    return ([ROOT / "README.md", ROOT / "CONTRIBUTING.md"]
            + sorted((ROOT / "docs").rglob("*.md")) + [ROOT / "bench" / "README.md"])


def release() -> str:
    m = re.search(r'^\[workspace\.package\]\n(?:.*\n)*?version = "([^"]+)"',
                  (ROOT / "Cargo.toml").read_text(), re.M)
    if m is None:
        m = re.search(r'^version = "([^"]+)"', (ROOT / "Cargo.toml").read_text(), re.M)
    assert m, "no version in Cargo.toml"
    return m.group(1)


def pgrx_version() -> str:
    m = re.search(r'^PGRX_VERSION="([^"]+)"', LIB_SH, re.M)
    assert m
    cargo = (ROOT / "Cargo.toml").read_text()
    assert re.search(rf'pgrx[^\n]*"=?{re.escape(m.group(1))}"', cargo), \
        f"Cargo.toml's pgrx is not scripts/lib.sh's {m.group(1)}"
    return m.group(1)


def supported() -> list[int]:
    m = re.search(r"^SUPPORTED_PG_VERSIONS=\(([^)]*)\)", LIB_SH, re.M)
    assert m
    return [int(v) for v in m.group(1).split()]


def suites() -> dict[int, str]:
    """tests_for_version's answer for each supported version."""
    body = re.search(r"^tests_for_version\(\) \{\n(.*?)^\}", LIB_SH, re.M | re.S)
    assert body
    cases = dict(re.findall(r"^\s*([\d*]+)\) echo (\S+) ;;", body.group(1), re.M))
    return {v: cases.get(str(v), cases["*"]) for v in supported()}


def pinned_releases() -> dict[int, list[str]]:
    """The PostgreSQL releases each version is tested with, from the files
    that pin them."""
    wheels = (ROOT / "scripts" / "pg-wheels.txt").read_text()
    found: dict[int, list[str]] = {}
    for v in re.findall(r"^# PostgreSQL (\d+\.\d+) ", wheels, re.M):
        found.setdefault(int(v.split(".")[0]), []).append(v)
    headers = re.search(r'^PG17_HEADERS_DEB_VERSION="(\d+\.\d+)-', LIB_SH, re.M)
    pg19 = re.search(r'^PG19_DEB_VERSION="([^"]+)"', LIB_SH, re.M)
    assert headers and pg19
    found.setdefault(17, []).append(headers.group(1))
    found[19] = [pg19.group(1)]
    try:
        out = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", "postgresql-15"],
                             capture_output=True, text=True, check=False).stdout
    except FileNotFoundError:
        out = ""
    m = re.match(r"(15\.\d+)", out)
    if m:
        found[15] = [m.group(1)]
    return found


# ------------------------------------------------------------------ checks
# Each takes {path: text} and returns the disagreements.

def check_release(texts: dict[str, str]) -> list[str]:
    """A sentence saying which release this is names the current one."""
    want = release()
    bad = []
    for path, text in texts.items():
        for m in re.finditer(r"(?i)\bthis is (?:release|version|snowflake_id) (\d+\.\d+\.\d+)",
                             text):
            if m.group(1) != want:
                bad.append(f"{path}: {m.group(0)!r} (the release is {want}, Cargo.toml)")
    return bad


def check_pgrx(texts: dict[str, str]) -> list[str]:
    want = pgrx_version()
    return [f"{path}: 'pgrx {v}' (pgrx is {want}, Cargo.toml and scripts/lib.sh)"
            for path, text in texts.items()
            for v in re.findall(r"\bpgrx (\d+\.\d+\.\d+)", text) if v != want]


VERSION_LIST = r"(\d\d(?:, \d\d)*,? (?:and|or) \d\d)"


def check_supported(texts: dict[str, str]) -> list[str]:
    """A list of PostgreSQL versions called supported is the supported
    set, and no supported version is called unsupported."""
    want = supported()
    bad = []
    for path, text in texts.items():
        flat = re.sub(r"\s+", " ", text)
        for m in re.finditer(rf"PostgreSQL {VERSION_LIST}\**[^.]{{0,40}}?\bsupported", flat):
            listed = [int(v) for v in re.findall(r"\d\d", m.group(1))]
            if listed != want:
                bad.append(f"{path}: {m.group(0)!r} (supported: {want}, scripts/lib.sh)")
        for m in re.finditer(r"PostgreSQL (\d\d) is not supported", flat):
            if int(m.group(1)) in want:
                bad.append(f"{path}: {m.group(0)!r} ({m.group(1)} is supported, scripts/lib.sh)")
    return bad


SUITE_WORDS = {"all": "whole suite", "core": "core subset",
               "core+grants": "core subset, limits and durable grants",
               "all-but-grants": "whole suite but limits and durable grants"}


def requirements_rows(readme: str) -> dict[int, list[str]]:
    """README's requirements table: version -> its cells."""
    req = readme.split("## Requirements", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in req.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and re.fullmatch(r"\d\d", cells[0]):
            rows[int(cells[0])] = cells
    return rows


def check_requirements_table(readme: str) -> list[str]:
    """One row per supported version; its 'tested with' cell names the
    pinned releases, its 'tests' cell the suite tests_for_version runs."""
    rows = requirements_rows(readme)
    bad = []
    if sorted(rows) != supported():
        bad.append(f"README.md requirements table: rows for {sorted(rows)}, "
                   f"supported {supported()}")
    pins = pinned_releases()
    for v, suite in suites().items():
        cells = rows.get(v)
        if cells is None:
            continue
        with_cell, tests_cell = cells[1], cells[2]
        stated = re.findall(r"\b(\d\d\.\d+|\d\d~rc\d+-\d+)", with_cell)
        for pin in pins.get(v, []):
            if pin not in stated:
                bad.append(f"README.md: PostgreSQL {v} tested with {with_cell!r}: "
                           f"{pin} is what is pinned")
        for s in stated:
            if s not in pins.get(v, []) and not (v == 19 and s.startswith("19rc")):
                bad.append(f"README.md: PostgreSQL {v} tested with {s}: not pinned "
                           f"(pinned: {pins.get(v)})")
        if tests_cell != SUITE_WORDS[suite]:
            bad.append(f"README.md: PostgreSQL {v} runs {tests_cell!r}; tests_for_version "
                       f"says {suite} ({SUITE_WORDS[suite]!r})")
    return bad


def check_readme_sections(texts: dict[str, str], readme: str) -> list[str]:
    """(README, "Section") names a section README.md has."""
    headings = set(re.findall(r"^#+ (.+?)\s*$", readme, re.M))
    return [f"{path}: README has no section {name!r}"
            for path, text in texts.items()
            for name in re.findall(r'README(?:\.md)?, "([^"]+)"', text) if name not in headings]


def texts() -> dict[str, str]:
    return {p.relative_to(ROOT).as_posix(): p.read_text() for p in prose_files()}


def test_the_release_is_stated_once():
    assert check_release(texts()) == []


def test_pgrx_version():
    assert check_pgrx(texts()) == []


def test_supported_versions():
    assert check_supported(texts()) == []


def test_named_readme_sections_exist():
    docs = {**texts(), "CHANGELOG.md": (ROOT / "CHANGELOG.md").read_text()}
    assert check_readme_sections(docs, (ROOT / "README.md").read_text()) == []
    assert check_readme_sections({"x.md": '(README, "Upgrading the extension")'},
                                 (ROOT / "README.md").read_text())


def test_requirements_table_matches_the_pins_and_the_suites():
    assert check_requirements_table((ROOT / "README.md").read_text()) == []


# --------------------------------------------------------------- self-tests
def test_a_planted_stale_release_fails():
    assert check_release({"x.md": "This is release 0.6.0 (what changed..."})
    assert not check_release({"x.md": f"This is release {release()}."})


def test_a_planted_stale_pgrx_or_unsupported_version_fails():
    assert check_pgrx({"x.md": "19 cannot be built with pgrx 0.18.1"})
    assert check_supported({"x.md": "PostgreSQL 19 is not supported yet"})
    assert check_supported({"x.md": "PostgreSQL 15, 16, 17 and 18 are supported and tested"})
    listed = ", ".join(map(str, supported()[:-1])) + f" and {supported()[-1]}"
    assert not check_supported({"x.md": f"PostgreSQL {listed} are supported"})


@pytest.mark.parametrize("old, new", [("16.14", "16.13"), ("whole suite", "core subset")])
def test_a_planted_stale_requirements_row_fails(old, new):
    readme = (ROOT / "README.md").read_text()
    assert old in readme
    assert check_requirements_table(readme.replace(old, new, 1))
