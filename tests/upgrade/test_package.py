"""The release artifacts built by scripts/release.sh: the Debian package of
the PostgreSQL under test, the source tarball, the PGXN zip, the signed apt
repository and its public key, and SHA256SUMS.

Each package is installed the way a DBA would (`apt-get install ./file.deb`)
into a distribution's own PostgreSQL of its version, where one exists here:

* 15: Debian 12's postgresql-15, the system's own: a server is started with
  the extension preloaded, IDs are made, and `dpkg -r` leaves no file behind.
  Installing into the system would replace the library that `cargo pgrx
  install` put there for the other tests: the files are set aside first and
  put back afterwards.
* 17: Debian 13's postgresql-17, in a Debian 13 root made with debootstrap
  (scripts/debian-root.sh, cached in .chroot/): `apt-get install postgresql-17
  ./the.deb` inside it, a cluster made and started with Debian's own tools
  (pg_createcluster, pg_ctlcluster) with the extension preloaded, IDs made
  and made again above the old ones after an immediate stop, and `dpkg -r`
  leaves no file behind. The library is built on Debian 12: this also proves
  it loads with Debian 13's newer C library.
* 19: experimental's postgresql-19 (a release candidate), in a Debian sid
  root (scripts/debian-root.sh sid; the one the suite's 19 comes from), the
  same way.
* 16 and 18: no distribution here ships them (their postgresql-NN packages
  come from apt.postgresql.org): the package is built and its control fields
  and file list are checked.

The apt repository, as a DBA uses it: in a Debian 12 root with Debian's
postgresql-15 (for 15) and a Debian 13 root with postgresql-17 (for 17),
the previous release's package (PREVIOUS_RELEASE_* in scripts/lib.sh, built
once by scripts/package-commit.sh into .cache/) is installed and makes IDs;
the repository is added with one sources line naming its key with
`signed-by`, served over HTTP on 127.0.0.1; `apt-get upgrade` brings this
release's package, the server is restarted, `ALTER EXTENSION snowflake_id
UPDATE` moves the SQL objects to this release and every new ID is above the
old ones; then the package is removed and `apt-get install
postgresql-NN-snowflake-id` installs it from the repository afresh. A
sources line naming another key is refused by apt.
"""

import contextlib
import functools
import glob
import hashlib
import http.server
import json
import os
import re
import shutil
import subprocess
import tarfile
import threading
import zipfile

import pytest

from harness import PG_CONFIG, PG_MAJOR
from helpers import APT_GET

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MAJOR = str(PG_MAJOR)
DEBIAN_PG15 = PG_CONFIG == "/usr/lib/postgresql/15/bin/pg_config"
AS_ROOT = os.geteuid() == 0

# Installing the package for real into Debian's own PostgreSQL 15 sets the
# installed extension aside while it runs: no other test may run meanwhile
# (scripts/test.sh runs 15's alone, after every other test; on the other
# versions the package goes only into copies of Debian roots, and their
# serial tests run after their version's pytest, beside other versions'
# tests). The whole module, so that the artifacts are read once.
pytestmark = pytest.mark.serial


def _cargo_version() -> str:
    with open(os.path.join(REPO, "Cargo.toml")) as f:
        return re.search(r'^version = "([^"]+)"', f.read(), re.M).group(1)


KEYRING = "snowflake-id-archive-keyring"
# The apt repository's suites: the Debian release of each.
SUITES = {"bookworm": "12", "trixie": "13"}


def _release_paths() -> list[str]:
    """The paths scripts/release.sh printed for the PostgreSQL under test.
    scripts/test.sh runs it right after that version's install (whose build
    `cargo pgrx package` then reuses) and sets SNOWFLAKE_RELEASE_RESULTS to
    the directory of its outputs: release-pgNN.rc (its exit status),
    release-pgNN.paths (what it printed), release-pgNN.log. Run without
    that, the test runs release.sh itself."""
    results = os.environ.get("SNOWFLAKE_RELEASE_RESULTS")
    if not results:
        proc = subprocess.run(["bash", os.path.join(REPO, "scripts/release.sh"), MAJOR],
                              capture_output=True, text=True, timeout=3000)
        assert proc.returncode == 0, proc.stderr[-4000:]
        return proc.stdout.split()
    base = os.path.join(results, f"release-pg{MAJOR}")
    assert os.path.exists(base + ".rc"), \
        f"SNOWFLAKE_RELEASE_RESULTS={results}: scripts/release.sh {MAJOR} was not run there"
    with open(base + ".rc") as f:
        rc = f.read().strip()
    with open(base + ".log", errors="replace") as f:
        assert rc == "0", f"scripts/release.sh {MAJOR} failed ({rc}): {f.read()[-4000:]}"
    with open(base + ".paths") as f:
        return f.read().split()


@pytest.fixture(scope="module")
def artifacts() -> dict:
    """The artifacts scripts/release.sh made for the PostgreSQL under test
    (_release_paths): {"deb", "tarball", "zip", "keyring", "keyring_asc",
    "apt", "sums"}."""
    paths = _release_paths()
    arch = subprocess.check_output(["dpkg", "--print-architecture"], text=True).strip()
    version = _cargo_version()
    names = [os.path.basename(p) for p in paths]
    assert names == [f"postgresql-{MAJOR}-snowflake-id_{version}_{arch}.deb",
                     f"snowflake_id-{version}.tar.gz", f"snowflake_id-{version}.zip",
                     f"{KEYRING}.gpg", f"{KEYRING}.asc", "apt", "SHA256SUMS"], paths
    for p in paths:
        assert os.path.isdir(p) if p.endswith("/apt") else os.path.isfile(p), p
    return dict(zip(("deb", "tarball", "zip", "keyring", "keyring_asc", "apt", "sums"), paths))


@pytest.fixture(scope="module")
def deb(artifacts) -> str:
    return artifacts["deb"]


def _field(deb: str, name: str) -> str:
    return subprocess.check_output(["dpkg-deb", "-f", deb, name], text=True).strip()


def _files(deb: str) -> list[str]:
    out = subprocess.check_output(["dpkg-deb", "-c", deb], text=True)
    return sorted(line.split()[-1].lstrip(".") for line in out.splitlines()
                  if not line.startswith("d"))


def test_package_fields_and_files(deb, tmp_path):
    assert _field(deb, "Package") == f"postgresql-{MAJOR}-snowflake-id"
    assert _field(deb, "Version") == _cargo_version()
    depends = [d.strip() for d in _field(deb, "Depends").split(",")]
    assert f"postgresql-{MAJOR}" in depends
    # The C library it needs, by the symbol versions the library uses, and
    # libpq5 when it links libpq.
    libc = [d for d in depends if d.startswith("libc6")]
    assert len(libc) == 1 and re.fullmatch(r"libc6 \(>= 2\.\d+\)", libc[0]), depends
    so = subprocess.run(f"dpkg-deb --fsys-tarfile {deb} | tar -xOf - "
                        f"./usr/lib/postgresql/{MAJOR}/lib/snowflake_id.so",
                        shell=True, capture_output=True, check=True).stdout
    (tmp_path / "snowflake_id.so").write_bytes(so)
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^]]+)\]", subprocess.check_output(
        ["readelf", "-d", str(tmp_path / "snowflake_id.so")], text=True))
    assert "libc.so.6" in needed, needed
    if "libpq.so.5" in needed:
        assert any(d.startswith("libpq5") for d in depends), (needed, depends)
    files = _files(deb)
    version = _cargo_version()
    assert f"/usr/lib/postgresql/{MAJOR}/lib/snowflake_id.so" in files
    assert f"/usr/share/postgresql/{MAJOR}/extension/snowflake_id.control" in files
    assert f"/usr/share/postgresql/{MAJOR}/extension/snowflake_id--{version}.sql" in files
    assert f"/usr/share/doc/postgresql-{MAJOR}-snowflake-id/copyright" in files
    # Every upgrade script in sql/ ships too.
    for name in os.listdir(os.path.join(REPO, "sql")):
        if name.endswith(".sql"):
            assert f"/usr/share/postgresql/{MAJOR}/extension/{name}" in files
    # Nothing outside the PostgreSQL directories and the package's docs.
    for f in files:
        assert f.startswith((f"/usr/lib/postgresql/{MAJOR}/", f"/usr/share/postgresql/{MAJOR}/",
                             f"/usr/share/doc/postgresql-{MAJOR}-snowflake-id/")), f
    # The control file in the package names the version the package has.
    extracted = subprocess.run(
        f"dpkg-deb --fsys-tarfile {deb} | tar -xOf - "
        f"./usr/share/postgresql/{MAJOR}/extension/snowflake_id.control",
        shell=True, capture_output=True, text=True, check=True).stdout
    assert f"default_version = '{version}'" in extracted


def test_source_tarball_and_checksums(artifacts):
    """The tarball holds the tracked source under snowflake_id-<version>/
    (META.json at its top, as PGXN wants) and no build or test state; every
    artifact's checksum is in SHA256SUMS and matches."""
    version = _cargo_version()
    prefix = f"snowflake_id-{version}/"
    with tarfile.open(artifacts["tarball"]) as t:
        names = t.getnames()
        meta = json.load(t.extractfile(prefix + "META.json"))
    assert all(n.startswith(prefix) for n in names), [n for n in names if not n.startswith(prefix)][:5]
    inside = {n[len(prefix):] for n in names}
    for f in ("META.json", "LICENSE", "CHANGELOG.md", "README.md", "Cargo.toml", "Cargo.lock",
              "snowflake_id.control", "src/lib.rs", "scripts/package.sh"):
        assert f in inside, f
    for name in os.listdir(os.path.join(REPO, "sql")):
        assert f"sql/{name}" in inside, name
    for bad in (".pg/", "target/", ".venv/", ".chroot/", ".pgrx/", "target-"):
        assert not any(n.startswith(bad) for n in inside), bad
    assert meta["version"] == version

    sums = artifacts["sums"]
    with open(sums) as f:
        listed = sorted(line.split()[1] for line in f.read().splitlines())
    assert listed == sorted(os.path.basename(artifacts[k])
                            for k in ("deb", "tarball", "zip", "keyring", "keyring_asc"))
    proc = subprocess.run(["sha256sum", "--strict", "-c", "SHA256SUMS"], cwd=os.path.dirname(sums),
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_pgxn_zip(artifacts):
    """The PGXN distribution: the tarball's files in a zip, under
    snowflake_id-<version>/, with META.json (the one tests/upgrade/test_meta.py
    checks against the Meta Spec) at its top."""
    version = _cargo_version()
    prefix = f"snowflake_id-{version}/"
    with zipfile.ZipFile(artifacts["zip"]) as z:
        assert z.testzip() is None
        zipped = {n for n in z.namelist() if not n.endswith("/")}
        meta = json.loads(z.read(prefix + "META.json"))
    with tarfile.open(artifacts["tarball"]) as t:
        tarred = {m.name for m in t.getmembers() if not m.isdir()}
    assert zipped == tarred, sorted(zipped ^ tarred)[:10]
    with open(os.path.join(REPO, "META.json")) as f:
        assert meta == json.load(f)
    assert meta["version"] == version


def _gpgv(keyring: str, *files: str, home: str) -> subprocess.CompletedProcess:
    return subprocess.run(["gpgv", "--keyring", keyring, *files], capture_output=True, text=True,
                          env={**os.environ, "GNUPGHOME": home})


def test_repository_is_signed(artifacts, tmp_path):
    """Each suite's InRelease and Release.gpg verify with the published
    public key, as apt checks them, and not once the Release file is
    changed; the Release file covers the Packages index, which names this
    package with the .deb's checksum."""
    keyring, apt = artifacts["keyring"], artifacts["apt"]
    arch = subprocess.check_output(["dpkg", "--print-architecture"], text=True).strip()
    with open(artifacts["deb"], "rb") as f:
        deb_sha256 = hashlib.sha256(f.read()).hexdigest()
    home = str(tmp_path / "gnupg")
    os.mkdir(home, 0o700)
    assert subprocess.run(["gpg", "--batch", "--show-keys", artifacts["keyring_asc"]],
                          capture_output=True, env={**os.environ, "GNUPGHOME": home}).returncode == 0
    for suite, number in SUITES.items():
        dists = os.path.join(apt, "dists", suite)
        proc = _gpgv(keyring, os.path.join(dists, "InRelease"), home=home)
        assert proc.returncode == 0, proc.stderr
        release_path = os.path.join(dists, "Release")
        proc = _gpgv(keyring, os.path.join(dists, "Release.gpg"), release_path, home=home)
        assert proc.returncode == 0, proc.stderr
        with open(release_path) as f:
            release = f.read()
        assert re.search(rf"^Codename: {suite}$", release, re.M), release
        assert re.search(rf"^Description: .* for Debian {number}$", release, re.M), release
        tampered = tmp_path / f"Release-{suite}"
        tampered.write_text(release.replace(f"Codename: {suite}", "Codename: sid"))
        proc = _gpgv(keyring, os.path.join(dists, "Release.gpg"), str(tampered), home=home)
        assert proc.returncode != 0, "a changed Release file still verified"

        index = f"main/binary-{arch}/Packages"
        with open(os.path.join(dists, index), "rb") as f:
            packages = f.read()
        sha256_section = release.split("\nSHA256:\n", 1)[1]
        assert re.search(rf"^ {hashlib.sha256(packages).hexdigest()} +{len(packages)} {index}$",
                         sha256_section, re.M), sha256_section
        stanza = [st for st in packages.decode().split("\n\n")
                  if f"Package: postgresql-{MAJOR}-snowflake-id\n" in st]
        assert len(stanza) == 1, packages.decode()
        assert f"\nVersion: {_cargo_version()}\n" in stanza[0]
        assert f"\nSHA256: {deb_sha256}\n" in stanza[0]
        filename = re.search(r"^Filename: (\S+)$", stanza[0], re.M).group(1)
        assert os.path.isfile(os.path.join(apt, filename)), filename


@pytest.mark.skipif(not DEBIAN_PG15, reason="Debian 12's own postgresql-15 is the system's; "
                    "the 17 and 19 packages are installed into Debian 13's and sid's in their own "
                    "test, 16 and 18 "
                    "come from apt.postgresql.org")
def test_install_start_make_ids_remove(deb, make_cluster):
    files = _files(deb)
    aside = {}
    for f in files:
        if os.path.exists(f) and f.startswith(("/usr/lib/postgresql/15/lib/",
                                               "/usr/share/postgresql/15/extension/")):
            aside[f] = f + ".pytest-aside"
            shutil.move(f, aside[f])
    try:
        proc = subprocess.run([*APT_GET, "install", "-y", "-q", "--no-install-recommends",
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


# ------------------------------------------------ Debian 13, Debian sid
class Root:
    """A throwaway copy of a cached Debian root, with /proc and a
    /dev/shm of its own mounted; commands run in it with chroot."""

    def __init__(self, base: str):
        self.dir = f"{os.path.dirname(base)}/run-{os.getpid()}"
        shutil.rmtree(self.dir, ignore_errors=True)
        subprocess.run(["cp", "-a", base, self.dir], check=True, timeout=300)
        self.mounts = []
        for fstype, where in (("proc", "proc"), ("tmpfs", "dev/shm")):
            target = os.path.join(self.dir, where)
            subprocess.run(["mount", "-t", fstype, fstype, target], check=True)
            self.mounts.append(target)

    def run(self, *cmd, check=True, timeout=600) -> subprocess.CompletedProcess:
        proc = subprocess.run(["chroot", self.dir, *cmd], capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL,
                              env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8",
                                   "DEBIAN_FRONTEND": "noninteractive"})
        if check:
            assert proc.returncode == 0, (f"{' '.join(cmd)} (exit {proc.returncode}):\n"
                                          f"{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
        return proc

    def psql(self, port: int, query: str) -> str:
        return self.run("runuser", "-u", "postgres", "--", "psql", "-X", "-At", "-v",
                        "ON_ERROR_STOP=1", "-p", str(port), "-d", "postgres",
                        "-c", query).stdout.strip()

    def path(self, p: str) -> str:
        return os.path.join(self.dir, p.lstrip("/"))

    def close(self, keep: bool) -> None:
        for target in reversed(self.mounts):
            subprocess.run(["umount", "-l", target], check=False)
        if keep:
            print(f"kept the Debian root of the failed test: {self.dir}")
        else:
            shutil.rmtree(self.dir, ignore_errors=True)


def _stale_roots(base: str) -> None:
    """Removes the copies of earlier runs whose pytest process is gone."""
    for d in glob.glob(f"{os.path.dirname(base)}/run-*"):
        pid = d.rsplit("-", 1)[-1]
        if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            for where in ("dev/shm", "proc"):
                subprocess.run(["umount", "-l", os.path.join(d, where)], capture_output=True)
            if not any(line.split()[1].startswith(d + "/") for line in open("/proc/mounts")):
                shutil.rmtree(d, ignore_errors=True)


# The distributions whose own PostgreSQL a package is installed into, in a
# root made by scripts/debian-root.sh: Debian 13's postgresql-17, and the
# release candidate of postgresql-19 in Debian experimental (on sid).
DISTRIBUTIONS = {"17": "trixie", "19": "sid"}


@pytest.mark.timeout(1200)
@pytest.mark.skipif(MAJOR not in DISTRIBUTIONS,
                    reason="Debian 13 ships PostgreSQL 17, experimental 19: those packages are "
                           "installed there in the PostgreSQL 17 and 19 passes")
@pytest.mark.skipif(not AS_ROOT, reason="debootstrap, chroot and mount need root")
def test_distribution_install_start_make_ids_remove(deb, request):
    """The package installed into the distribution's own postgresql-NN in
    a copy of a debootstrapped root (Debian 13 for 17, sid with
    experimental's postgresql-19 for 19), a cluster made with Debian's
    tools, IDs made, a crash, IDs above, the package removed with nothing
    left behind."""
    suite = DISTRIBUTIONS[MAJOR]
    proc = subprocess.run(["bash", os.path.join(REPO, "scripts/debian-root.sh"), suite],
                          capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-4000:]
    base = proc.stdout.strip().splitlines()[-1]
    _stale_roots(base)
    root = Root(base)
    failed = True
    try:
        # The root's C library is newer than the one the library was built
        # against (Debian 12's): loading it there is part of what this proves.
        libc = root.run("dpkg-query", "-W", "-f=${Version}", "libc6").stdout
        host_libc = subprocess.check_output(["dpkg-query", "-W", "-f=${Version}", "libc6"],
                                            text=True)
        assert subprocess.run(["dpkg", "--compare-versions", libc, "gt", host_libc]).returncode == 0, \
            (libc, host_libc)

        shutil.copy(deb, root.path("/tmp/"))
        name = os.path.basename(deb)
        root.run(*APT_GET, "install", "-y", "-q", "--no-install-recommends",
                 f"postgresql-{MAJOR}", f"/tmp/{name}")
        pkg = f"postgresql-{MAJOR}-snowflake-id"
        assert root.run("dpkg-query", "-W", "-f=${Status}", pkg).stdout == "install ok installed"
        files = _files(deb)
        for f in files:
            assert os.path.exists(root.path(f)), f
        server = root.run("dpkg-query", "-W", "-f=${Version}", f"postgresql-{MAJOR}").stdout
        assert server.startswith(f"{MAJOR}.") or server.startswith(f"{MAJOR}~"), server

        # A cluster made and started with Debian's own tools, the extension
        # preloaded through a conf.d file as a DBA would.
        port = 5433
        root.run("pg_createcluster", MAJOR, "sf", "-p", str(port))
        with open(root.path(f"/etc/postgresql/{MAJOR}/sf/conf.d/snowflake_id.conf"), "w") as f:
            f.write("shared_preload_libraries = 'snowflake_id'\nlisten_addresses = ''\n"
                    "snowflake_id.backfill_worker_ids = '1020-1023'\n")
        root.run("pg_ctlcluster", MAJOR, "sf", "start")
        log = root.path(f"/var/log/postgresql/postgresql-{MAJOR}-sf.log")
        assert root.psql(port, "SHOW server_version").startswith(MAJOR), open(log).read()[-3000:]
        assert root.psql(port, "SHOW shared_preload_libraries") == "snowflake_id"
        root.psql(port, "CREATE EXTENSION snowflake_id")
        assert root.psql(port, "SELECT extversion FROM pg_extension "
                               "WHERE extname = 'snowflake_id'") == _cargo_version()
        root.psql(port, "CREATE TABLE orders (id bigint PRIMARY KEY DEFAULT snowflake_nextval(),"
                        " n int)")
        root.psql(port, "INSERT INTO orders (n) SELECT g FROM generate_series(1, 50000) g")
        distinct, ordered = root.psql(
            port, "SELECT count(DISTINCT id), bool_and(id > prev) FROM (SELECT id, "
                  "lag(id, 1, 0::bigint) OVER (ORDER BY n) AS prev FROM orders) s").split("|")
        assert (distinct, ordered) == ("50000", "t")
        old_max = int(root.psql(port, "SELECT max(id) FROM orders"))

        # An immediate stop: the new start replays the reservation's WAL
        # records (custom resource manager) and makes IDs above the old ones.
        root.run("pg_ctlcluster", "-m", "immediate", MAJOR, "sf", "stop")
        root.run("pg_ctlcluster", MAJOR, "sf", "start")
        new_min = int(root.psql(port, "SELECT min(id) FROM (SELECT snowflake_nextval() AS id "
                                      "FROM generate_series(1, 1000)) s"))
        assert new_min > old_max, (new_min, old_max)
        root.run("pg_ctlcluster", MAJOR, "sf", "stop")
        root.run("pg_dropcluster", MAJOR, "sf")

        root.run("dpkg", "-r", pkg)
        left = [f for f in files if os.path.exists(root.path(f))]
        assert left == [], f"dpkg -r left files behind: {left}"
        status = root.run("dpkg-query", "-W", "-f=${Status}", pkg, check=False).stdout
        assert "installed" not in status.replace("not-installed", ""), status
        assert not os.path.exists(root.path(f"/usr/share/doc/{pkg}"))
        failed = False
    finally:
        root.run("pg_ctlcluster", "-m", "immediate", MAJOR, "sf", "stop", check=False)
        root.close(keep=failed)


# ------------------------------------------------ the apt repository
# The Debian release whose own PostgreSQL each version's repository test
# installs into, and the repository's suite for it.
REPOSITORY_ROOTS = {"15": "bookworm", "17": "trixie"}


PAST_TIMES = ("SELECT date_trunc('day', now()) - interval '300 days' + (g / 2) * interval '1 second'"
              " AS t FROM generate_series(0, 19999) g")


def _previous_release() -> tuple[str, str]:
    out = subprocess.check_output(
        ["bash", "-c", 'source scripts/lib.sh && echo "$PREVIOUS_RELEASE_VERSION '
                       '$PREVIOUS_RELEASE_COMMIT"'], cwd=REPO, text=True)
    version, commit = out.split()
    return version, commit


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


@contextlib.contextmanager
def _serve(directory: str):
    """Serves `directory` over HTTP on 127.0.0.1 (a free port); yields its
    URL. The roots share this machine's network, so apt in them reaches it."""
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(_QuietHandler, directory=directory))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.timeout(3600)
@pytest.mark.skipif(MAJOR not in REPOSITORY_ROOTS,
                    reason="the repository is installed from in Debian 12's postgresql-15 and "
                           "Debian 13's postgresql-17, in the PostgreSQL 15 and 17 passes")
@pytest.mark.skipif(not AS_ROOT, reason="debootstrap, chroot and mount need root")
def test_repository_upgrade_from_previous_release(artifacts):
    """In a copy of a Debian root with the distribution's postgresql-NN:
    the previous release's package installed, a cluster making IDs; the
    repository added with one signed-by line (one naming another key is
    refused); `apt-get upgrade` brings this release; after a restart and
    ALTER EXTENSION UPDATE every new ID is above the old ones, and the
    backfill grants the previous release took stay taken; removed and
    installed afresh with `apt-get install postgresql-NN-snowflake-id`."""
    suite = REPOSITORY_ROOTS[MAJOR]
    version = _cargo_version()
    old_version, old_commit = _previous_release()
    proc = subprocess.run(["bash", os.path.join(REPO, "scripts/package-commit.sh"), old_commit,
                           MAJOR], capture_output=True, text=True, timeout=3000)
    assert proc.returncode == 0, proc.stderr[-4000:]
    old_deb = proc.stdout.strip().splitlines()[-1]
    assert _field(old_deb, "Version") == old_version
    proc = subprocess.run(["bash", os.path.join(REPO, "scripts/debian-root.sh"), suite],
                          capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-4000:]
    base = proc.stdout.strip().splitlines()[-1]
    _stale_roots(base)
    root = Root(base)
    pkg = f"postgresql-{MAJOR}-snowflake-id"
    port = 5433
    failed = True

    def installed() -> str:
        return root.run("dpkg-query", "-W", "-f=${Status} ${Version}", pkg).stdout

    def extversion() -> str:
        return root.psql(port, "SELECT extversion FROM pg_extension WHERE extname = 'snowflake_id'")

    try:
        shutil.copy(old_deb, root.path("/tmp/"))
        root.run(*APT_GET, "install", "-y", "-q", "--no-install-recommends",
                 f"postgresql-{MAJOR}", f"/tmp/{os.path.basename(old_deb)}")
        assert installed() == f"install ok installed {old_version}"
        root.run("pg_createcluster", MAJOR, "sf", "-p", str(port))
        with open(root.path(f"/etc/postgresql/{MAJOR}/sf/conf.d/snowflake_id.conf"), "w") as f:
            f.write("shared_preload_libraries = 'snowflake_id'\nlisten_addresses = ''\n"
                    "snowflake_id.backfill_worker_ids = '1020-1023'\n")
        root.run("pg_ctlcluster", MAJOR, "sf", "start")
        root.psql(port, "CREATE EXTENSION snowflake_id")
        assert extversion() == old_version
        root.psql(port, "CREATE TABLE orders (id bigint PRIMARY KEY DEFAULT snowflake_nextval(),"
                        " n int)")
        root.psql(port, "INSERT INTO orders (n) SELECT g FROM generate_series(1, 20000) g")
        old_max = int(root.psql(port, "SELECT max(id) FROM orders"))
        # Backfill grants taken by the previous release (its state file and
        # WAL): 20,000 times in order, two rows per second of one past day.
        root.psql(port, "CREATE TABLE imported (id bigint PRIMARY KEY, at timestamptz)")
        root.psql(port, f"INSERT INTO imported SELECT snowflake_at(t), t FROM ({PAST_TIMES}"
                        " ORDER BY t) s")
        old_grants = int(root.psql(port, "SELECT sum(grants) FROM snowflake_backfill()"))
        assert old_grants > 0

        # The repository as a DBA adds it: the public key where signed-by
        # names it, one sources line. Only that source is updated (the
        # root's Debian lists stay those its packages came from, so that
        # the upgrade brings this package alone, with no network).
        keyring = f"/usr/share/keyrings/{KEYRING}.gpg"
        shutil.copy(artifacts["keyring"], root.path(keyring))
        sources = "/etc/apt/sources.list.d/snowflake-id.list"
        update = (*APT_GET, "-o", f"Dir::Etc::sourcelist={sources}", "-o",
                  "Dir::Etc::sourceparts=-", "-o", "APT::Get::List-Cleanup=0", "update")
        with _serve(os.path.dirname(artifacts["apt"])) as url:
            # Signed by a key other than the one named: refused.
            with open(root.path(sources), "w") as f:
                f.write(f"deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] "
                        f"{url}/apt {suite} main\n")
            refused = root.run(*update, check=False)
            assert refused.returncode != 0, refused.stdout + refused.stderr
            assert re.search(r"NO_PUBKEY|not signed|Missing key|signature",
                             refused.stdout + refused.stderr), refused.stdout + refused.stderr

            with open(root.path(sources), "w") as f:
                f.write(f"deb [signed-by={keyring}] {url}/apt {suite} main\n")
            root.run(*update)
            policy = root.run("apt-cache", "policy", pkg).stdout
            assert f"Candidate: {version}" in policy, policy
            root.run(*APT_GET, "upgrade", "-y", "-q")
            assert installed() == f"install ok installed {version}"

            # The new library is loaded at the restart; the SQL objects move
            # with ALTER EXTENSION UPDATE.
            root.run("pg_ctlcluster", MAJOR, "sf", "restart")
            assert extversion() == old_version
            root.psql(port, "ALTER EXTENSION snowflake_id UPDATE")
            assert extversion() == version
            root.psql(port, "INSERT INTO orders (n) SELECT g FROM generate_series(20001, 40000) g")
            new_min, count, distinct = root.psql(
                port, "SELECT min(id) FILTER (WHERE n > 20000), count(*), count(DISTINCT id) "
                      "FROM orders").split("|")
            assert int(new_min) > old_max, (new_min, old_max)
            assert (count, distinct) == ("40000", "40000")
            # The previous release's grants carry on in place: the same
            # times again, unordered, take grants above them (the primary
            # key refuses any ID made twice).
            assert int(root.psql(port, "SELECT sum(grants) FROM snowflake_backfill()")) \
                == old_grants
            root.psql(port, f"INSERT INTO imported SELECT snowflake_at(t), t FROM ({PAST_TIMES}"
                            " ORDER BY random()) s")
            count, decoded = root.psql(
                port, "SELECT count(*), count(*) FILTER (WHERE snowflake_timestamp(id)"
                      " = date_trunc('milliseconds', at)) FROM imported").split("|")
            assert (count, decoded) == ("40000", "40000")
            assert int(root.psql(port, "SELECT sum(grants) FROM snowflake_backfill()")) \
                > old_grants
            old_max = int(root.psql(port, "SELECT max(id) FROM orders"))
            root.run("pg_ctlcluster", MAJOR, "sf", "stop")

            # Removed, then installed from the repository alone.
            root.run("dpkg", "-r", pkg)
            assert not os.path.exists(root.path(f"/usr/lib/postgresql/{MAJOR}/lib/snowflake_id.so"))
            root.run(*APT_GET, "install", "-y", "-q", "--no-install-recommends", pkg)
            assert installed() == f"install ok installed {version}"
        for f in _files(artifacts["deb"]):
            assert os.path.exists(root.path(f)), f
        root.run("pg_ctlcluster", MAJOR, "sf", "start")
        assert extversion() == version
        assert int(root.psql(port, "SELECT snowflake_nextval()")) > old_max
        root.run("pg_ctlcluster", MAJOR, "sf", "stop")
        failed = False
    finally:
        root.run("pg_ctlcluster", "-m", "immediate", MAJOR, "sf", "stop", check=False)
        root.close(keep=failed)
