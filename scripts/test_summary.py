"""Totals of a scripts/test.sh run over every PostgreSQL version.

usage: test_summary.py RESULTS_DIR VERSION...

Reads RESULTS_DIR/cargo-core.log, cargo-sim.log and cargo-extension.log
(cargo's "test result:" lines; the Rust tests run once) and, for each version,
RESULTS_DIR/pytest-pgNN.xml and pytest-pgNN-serial.xml (pytest's JUnit XML)
and the wall times scripts/test.sh wrote (pytest-pgNN.seconds,
serial-pgNN.seconds, install-pgNN.seconds); prints a line per version and, last, "total: N passed, N failed, N skipped".
Exits 1 when anything failed or a version left no results.
"""

import os
import re
import sys
import xml.etree.ElementTree as ET

CARGO = re.compile(r"test result: \w+\. (\d+) passed; (\d+) failed; (\d+) ignored")


def cargo_counts(path):
    if not os.path.exists(path):
        return None
    passed = failed = skipped = 0
    with open(path, errors="replace") as f:
        for m in CARGO.finditer(f.read()):
            passed += int(m.group(1))
            failed += int(m.group(2))
            skipped += int(m.group(3))
    return passed, failed, skipped


def pytest_counts(path):
    if not os.path.exists(path):
        return None
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    tests = failed = skipped = 0
    for s in suites:
        tests += int(s.get("tests", 0))
        failed += int(s.get("failures", 0)) + int(s.get("errors", 0))
        skipped += int(s.get("skipped", 0))
    return tests - failed - skipped, failed, skipped


def duration(name):
    s = int(open(os.path.join(sys.argv[1], name)).read())
    return f"{s // 60} min {s % 60} s"


def main():
    results, versions = sys.argv[1], sys.argv[2:]
    total = [0, 0, 0]
    ok = True
    extra = os.path.join(results, "summary")
    if os.path.exists(extra):
        print(open(extra).read().rstrip())
        ok = False

    def add(label, counts, required=True):
        nonlocal ok, total
        if counts is None or sum(counts) == 0:
            if required:
                print(f"{label}: no results")
                ok = False
            return
        print(f"{label}: {counts[0]} passed, {counts[1]} failed, {counts[2]} skipped")
        ok = ok and counts[1] == 0
        total = [a + b for a, b in zip(total, counts)]

    add("Rust, snowflake_core", cargo_counts(os.path.join(results, "cargo-core.log")))
    add("Rust, the fleet simulation", cargo_counts(os.path.join(results, "cargo-sim.log")))
    add("Rust, the extension's unit tests",
        cargo_counts(os.path.join(results, "cargo-extension.log")))
    for v in versions:
        seconds = os.path.join(results, f"pytest-pg{v}.seconds")
        selection = os.path.join(results, f"tests-pg{v}")
        which = "the whole suite"
        if os.path.exists(selection):
            chosen = open(selection).read().strip()
            if chosen != "all":
                which = f"the {chosen} subset of the tests"
        if os.path.exists(seconds):
            times = [f"{label} {duration(seconds)}" for label, seconds in (
                ("pytest", f"pytest-pg{v}.seconds"), ("the serial tests", f"serial-pg{v}.seconds"),
                ("its install (in the background)", f"install-pg{v}.seconds"))
                if os.path.exists(os.path.join(results, seconds))]
            print(f"PostgreSQL {v}, {which}: " + ", ".join(times))
        parallel = pytest_counts(os.path.join(results, f"pytest-pg{v}.xml"))
        serial = pytest_counts(os.path.join(results, f"pytest-pg{v}-serial.xml"))
        if parallel is not None and serial is not None:
            # `-m serial` / `-m "not serial"` deselect (not skip) the other
            # run's tests, so the two reports add up.
            parallel = tuple(a + b for a, b in zip(parallel, serial))
        add(f"PostgreSQL {v}, pytest", parallel)
    print(f"total: {total[0]} passed, {total[1]} failed, {total[2]} skipped")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
