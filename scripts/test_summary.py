"""Totals of a scripts/test.sh run over every PostgreSQL version.

usage: test_summary.py RESULTS_DIR VERSION...

Reads RESULTS_DIR/cargo-pgNN.log (cargo's "test result:" lines) and
RESULTS_DIR/pytest-pgNN.xml (pytest's JUnit XML) for each version, prints a
line per version and, last, "total: N passed, N failed, N skipped". Exits 1
when anything failed or a version left no results.
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


def main():
    results, versions = sys.argv[1], sys.argv[2:]
    total = [0, 0, 0]
    ok = True
    extra = os.path.join(results, "summary")
    if os.path.exists(extra):
        print(open(extra).read().rstrip())
        ok = False
    for v in versions:
        seconds = os.path.join(results, f"seconds-pg{v}")
        selection = os.path.join(results, f"tests-pg{v}")
        which = "tests"
        if os.path.exists(selection) and open(selection).read().strip() == "core":
            which = "the core subset of the tests"
        if os.path.exists(seconds):
            s = int(open(seconds).read())
            print(f"PostgreSQL {v}: {s // 60} min {s % 60} s (build, install and {which})")
        for kind, counts in (
            ("cargo pgrx test", cargo_counts(os.path.join(results, f"cargo-pg{v}.log"))),
            ("pytest", pytest_counts(os.path.join(results, f"pytest-pg{v}.xml"))),
        ):
            if counts is None or sum(counts) == 0:
                print(f"PostgreSQL {v}, {kind}: no results")
                ok = False
                continue
            print(f"PostgreSQL {v}, {kind}: {counts[0]} passed, {counts[1]} failed, "
                  f"{counts[2]} skipped")
            ok = ok and counts[1] == 0
            total = [a + b for a, b in zip(total, counts)]
    print(f"total: {total[0]} passed, {total[1]} failed, {total[2]} skipped")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
