"""The PGXN distribution metadata (META.json), the licence and the
changelog agree with the sources and with the PGXN Meta Spec 1.0.0
(https://pgxn.org/spec/): the checks its JSON schema makes on the fields
used here (required fields, terms, SemVer versions, version ranges, the
licence name, prereq phases and relationships), and what only this
repository can tell (the version is the control file's, the extension's
file exists, PostgreSQL's range covers exactly the supported versions).

The version is the one the installed control file of the PostgreSQL under
test says (snowflake_id.control has default_version = '@CARGO_VERSION@',
which `cargo pgrx install` makes Cargo.toml's version).
"""

import json
import os
import re
import subprocess

import pytest

from harness import pg_config

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# The Meta Spec's patterns (the JSON schema of pgxn_meta, v1).
SEMVER = (r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
          r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
          r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?")
RANGE_ITEM = rf"(?:(?:[=!]=|[<>]=?)\s*)?(?:{SEMVER}|0)"
VERSION_RANGE = rf"{RANGE_ITEM}(?:,\s*{RANGE_ITEM})*"
# A term: at least two characters, none of them a slash, backslash, colon,
# whitespace or control character.
TERM = r"[^/\\:\s\x00-\x1f\x7f]{2,}"
LICENSES = {"agpl_3", "apache_1_1", "apache_2_0", "artistic_1", "artistic_2", "bsd",
            "freebsd", "gfdl_1_2", "gfdl_1_3", "gpl_1", "gpl_2", "gpl_3", "lgpl_2_1",
            "lgpl_3_0", "mit", "mozilla_1_0", "mozilla_1_1", "openssl", "perl_5",
            "postgresql", "qpl_1_0", "ssleay", "sun", "zlib", "open_source",
            "restricted", "unrestricted", "unknown"}
PHASES = {"configure", "build", "test", "runtime", "develop"}
RELATIONSHIPS = {"requires", "recommends", "suggests", "conflicts"}


def _meta() -> dict:
    with open(os.path.join(REPO, "META.json")) as f:
        return json.load(f)


def _read(name: str) -> str:
    with open(os.path.join(REPO, name)) as f:
        return f.read()


def _cargo_version() -> str:
    return re.search(r'^version = "([^"]+)"', _read("Cargo.toml"), re.M).group(1)


def _control_version() -> str:
    """default_version of the control file installed into the PostgreSQL
    under test, as built from this repository."""
    path = os.path.join(pg_config("--sharedir"), "extension", "snowflake_id.control")
    if not os.path.exists(path):
        pytest.fail(f"{path} not found: install the extension first (cargo pgrx install)")
    with open(path) as f:
        return re.search(r"^default_version = '([^']+)'", f.read(), re.M).group(1)


def _supported_versions() -> list[int]:
    out = subprocess.check_output(
        ["bash", "-c", 'source scripts/lib.sh && echo "${SUPPORTED_PG_VERSIONS[*]}"'],
        cwd=REPO, text=True)
    return [int(v) for v in out.split()]


def _satisfies(version: tuple, spec: str) -> bool:
    """Whether `version` (a tuple of ints) is in the Meta Spec range `spec`."""
    ok = True
    for item in spec.split(","):
        m = re.fullmatch(r"\s*([=!]=|[<>]=?)?\s*(\S+)\s*", item)
        op, v = m.group(1) or ">=", m.group(2)
        bound = (0,) if v == "0" else tuple(int(x) for x in v.split("-")[0].split("."))
        ok = ok and {"==": version == bound, "!=": version != bound, "<": version < bound,
                     "<=": version <= bound, ">": version > bound, ">=": version >= bound}[op]
    return ok


def test_range_evaluation():
    """The range evaluator the next test relies on."""
    assert _satisfies((15, 0, 0), "15.0.0") and not _satisfies((14, 9, 0), "15.0.0")
    assert _satisfies((18, 3, 0), ">= 15.0.0, < 19.0.0")
    assert not _satisfies((19, 0, 0), ">= 15.0.0, < 19.0.0")
    assert _satisfies((1, 2, 3), "0")


def test_meta_json_follows_the_spec():
    meta = _meta()
    for key in ("name", "abstract", "version", "maintainer", "license", "provides", "meta-spec"):
        assert key in meta, f"META.json lacks the required field {key!r}"
    assert re.fullmatch(TERM, meta["name"]), meta["name"]
    assert isinstance(meta["abstract"], str) and meta["abstract"]
    assert re.fullmatch(SEMVER, meta["version"]), meta["version"]
    maintainer = meta["maintainer"]
    assert (isinstance(maintainer, str) and maintainer) or (
        isinstance(maintainer, list) and maintainer and all(isinstance(m, str) and m
                                                            for m in maintainer)), maintainer
    assert meta["license"] in LICENSES, meta["license"]
    assert meta["meta-spec"]["version"] == "1.0.0"
    assert meta.get("release_status", "stable") in {"stable", "testing", "unstable"}
    for name, ext in meta["provides"].items():
        assert re.fullmatch(TERM, name), name
        assert set(ext) <= {"file", "version", "abstract", "docfile"}, ext
        assert re.fullmatch(SEMVER, ext["version"]), ext
        assert isinstance(ext["file"], str) and ext["file"], ext
    for phase, relations in meta.get("prereqs", {}).items():
        assert phase in PHASES, phase
        for relation, prereqs in relations.items():
            assert relation in RELATIONSHIPS, relation
            for prereq, spec in prereqs.items():
                assert re.fullmatch(TERM, prereq), prereq
                assert re.fullmatch(VERSION_RANGE, spec), (prereq, spec)
    for tag in meta.get("tags", []):
        assert isinstance(tag, str) and 0 < len(tag) <= 255 and "\n" not in tag, tag
    for kind, paths in meta.get("no_index", {}).items():
        assert kind in {"file", "directory"}, kind
        for p in paths:
            assert os.path.exists(os.path.join(REPO, p)), p
    unknown = set(meta) - {"name", "abstract", "description", "version", "maintainer",
                           "license", "provides", "meta-spec", "prereqs", "release_status",
                           "resources", "generated_by", "tags", "no_index"}
    assert all(k.lower().startswith("x_") for k in unknown), unknown


def test_meta_json_matches_the_sources():
    meta = _meta()
    version = _control_version()
    assert version == _cargo_version()
    assert meta["version"] == version, \
        f"META.json says {meta['version']}, the control file {version}: update META.json"
    assert meta["name"] == "snowflake_id"
    ext = meta["provides"]["snowflake_id"]
    assert ext["version"] == version
    assert os.path.isfile(os.path.join(REPO, ext["file"])), ext["file"]
    assert os.path.isfile(os.path.join(REPO, ext["docfile"])), ext["docfile"]
    # The licence Cargo.toml names, and its text.
    assert meta["license"] == "postgresql"
    assert re.search(r'^license = "PostgreSQL"$', _read("Cargo.toml"), re.M)
    licence = _read("LICENSE")
    assert licence.startswith("PostgreSQL License")
    assert "Permission to use, copy, modify, and distribute this software" in licence
    # PostgreSQL: every supported version is in the range, 14 (no custom
    # WAL resource managers) and 20 (not built or tested) are not.
    for phase in ("build", "runtime"):
        spec = meta["prereqs"][phase]["requires"]["PostgreSQL"]
        for v in _supported_versions():
            assert _satisfies((v, 0, 0), spec), (phase, v, spec)
        assert not _satisfies((14, 9, 0), spec), (phase, spec)
        assert not _satisfies((20, 0, 0), spec), (phase, spec)


def test_changelog_has_every_release():
    """CHANGELOG.md has a section for the current version and for every
    version an upgrade script in sql/ starts from or leads to, newest first."""
    headings = re.findall(r"^## (\d+\.\d+\.\d+)\b", _read("CHANGELOG.md"), re.M)
    versions = {_cargo_version(), "0.1.0"}
    for name in os.listdir(os.path.join(REPO, "sql")):
        m = re.fullmatch(r"snowflake_id--(.+)--(.+)\.sql", name)
        if m:
            versions |= {m.group(1), m.group(2)}
    assert versions <= set(headings), versions - set(headings)
    keys = [tuple(int(x) for x in h.split(".")) for h in headings]
    assert keys == sorted(keys, reverse=True) and len(set(keys)) == len(keys), headings
