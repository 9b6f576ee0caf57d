"""The Debian packages built by scripts/package.sh.

For PostgreSQL 15 (Debian 12's own server package) the package is installed
into the system the way a DBA would (`apt-get install ./file.deb`), a server
is started with it preloaded, IDs are made, and `dpkg -r` leaves no file of
it behind. For 16 and 18, which Debian 12 does not ship (their postgresql-NN
packages come from apt.postgresql.org), the package is built and its control
fields and file list are checked: it cannot be installed here because
nothing satisfies its Depends.

Installing into the system would replace the library that `cargo pgrx
install` put there for the other tests: the files are set aside first and put
back afterwards.
"""

import os
import re
import shutil
import subprocess

import pytest

from conftest import PG_CONFIG, _pg_config

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAJOR = _pg_config("--version").split()[1].split(".")[0]
DEBIAN_PG15 = PG_CONFIG == "/usr/lib/postgresql/15/bin/pg_config"


def _cargo_version() -> str:
    with open(os.path.join(REPO, "Cargo.toml")) as f:
        return re.search(r'^version = "([^"]+)"', f.read(), re.M).group(1)


@pytest.fixture(scope="module")
def deb() -> str:
    """Builds the package of the PostgreSQL under test; returns its path."""
    proc = subprocess.run(["bash", os.path.join(REPO, "scripts/package.sh"), MAJOR],
                          capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-4000:]
    path = proc.stdout.strip().splitlines()[-1]
    arch = subprocess.check_output(["dpkg", "--print-architecture"], text=True).strip()
    assert os.path.basename(path) == (
        f"postgresql-{MAJOR}-snowflake-id_{_cargo_version()}_{arch}.deb")
    return path


def _field(deb: str, name: str) -> str:
    return subprocess.check_output(["dpkg-deb", "-f", deb, name], text=True).strip()


def _files(deb: str) -> list[str]:
    out = subprocess.check_output(["dpkg-deb", "-c", deb], text=True)
    return sorted(line.split()[-1].lstrip(".") for line in out.splitlines()
                  if not line.startswith("d"))


def test_package_fields_and_files(deb):
    assert _field(deb, "Package") == f"postgresql-{MAJOR}-snowflake-id"
    assert _field(deb, "Version") == _cargo_version()
    assert f"postgresql-{MAJOR}" in [d.strip() for d in _field(deb, "Depends").split(",")]
    files = _files(deb)
    version = _cargo_version()
    assert f"/usr/lib/postgresql/{MAJOR}/lib/snowflake_id.so" in files
    assert f"/usr/share/postgresql/{MAJOR}/extension/snowflake_id.control" in files
    assert f"/usr/share/postgresql/{MAJOR}/extension/snowflake_id--{version}.sql" in files
    # Every upgrade script in sql/ ships too.
    for name in os.listdir(os.path.join(REPO, "sql")):
        if name.endswith(".sql"):
            assert f"/usr/share/postgresql/{MAJOR}/extension/{name}" in files
    # Nothing outside the PostgreSQL directories and the package's docs.
    for f in files:
        assert f.startswith((f"/usr/lib/postgresql/{MAJOR}/", f"/usr/share/postgresql/{MAJOR}/",
                             f"/usr/share/doc/postgresql-{MAJOR}-snowflake-id/")), f


@pytest.mark.skipif(not DEBIAN_PG15, reason="only Debian 12's postgresql-15 satisfies a "
                    "package's Depends here (16 and 18 come from apt.postgresql.org)")
def test_install_start_make_ids_remove(deb, make_cluster):
    files = _files(deb)
    aside = {}
    for f in files:
        if os.path.exists(f) and f.startswith(("/usr/lib/postgresql/15/lib/",
                                               "/usr/share/postgresql/15/extension/")):
            aside[f] = f + ".pytest-aside"
            shutil.move(f, aside[f])
    try:
        proc = subprocess.run(["apt-get", "install", "-y", "-q", "--no-install-recommends",
                               deb], capture_output=True, text=True, timeout=600,
                              env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        status = subprocess.check_output(
            ["dpkg-query", "-W", "-f=${Status}", "postgresql-15-snowflake-id"], text=True)
        assert status == "install ok installed"
        for f in files:
            assert os.path.exists(f), f

        c = make_cluster(create_extension=True)
        ids = [r[0] for r in c.sql("SELECT snowflake_nextvals(1000)")]
        assert len(set(ids)) == 1000 and ids == sorted(ids)
        assert c.scalar("SELECT extversion FROM pg_extension "
                        "WHERE extname = 'snowflake_id'") == _cargo_version()
        c.stop()

        subprocess.run(["dpkg", "-r", "postgresql-15-snowflake-id"], check=True,
                       capture_output=True, timeout=300)
        left = [f for f in files if os.path.exists(f)]
        assert left == [], f"dpkg -r left files behind: {left}"
        status = subprocess.run(["dpkg-query", "-W", "-f=${Status}",
                                 "postgresql-15-snowflake-id"],
                                capture_output=True, text=True).stdout
        assert "installed" not in status.replace("not-installed", ""), status
    finally:
        subprocess.run(["dpkg", "-r", "postgresql-15-snowflake-id"], capture_output=True)
        for f, saved in aside.items():
            shutil.move(saved, f)
