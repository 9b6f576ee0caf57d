"""The benchmark figures quoted in README.md, docs/design/performance.md and
bench/README.md are those of the published run (no server): each quoted
figure below is found by its sentence and compared, at the precision it is
quoted with, with bench/results/results.csv (PostgreSQL 15),
bench/results/pg18/results.csv (18) or bench/results/profile.txt. A new
run (or an edited figure) that makes a quote wrong fails here; so does a
quote that is no longer found (update FIGURES with the text). Every file
that quotes figures says the bench's settings (synchronous_commit = off,
autovacuum = off). The self-tests plant a figure that disagrees."""

from __future__ import annotations

import csv
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
RESULTS = {"15": ROOT / "bench/results/results.csv",
           "18": ROOT / "bench/results/pg18/results.csv"}
PROFILE = ROOT / "bench/results/profile.txt"

README, PERF, BENCH = "README.md", "docs/design/performance.md", "bench/README.md"
C1, C2, C6 = "1_single_session", "2_bulk_load", "6_insert"
SF = "snowflake_nextval()  classic"
SEQ1 = "nextval('s1')  CACHE 1"
SF6 = "snowflake_nextval()"

# (file, regex whose group 1 is the figure, version, case, variant, metric)
FIGURES = [
    (README, r"\*\*([\d.]+)×\*\* \(1\.16× on 15\)", "18", C6, f"{SF6} | outgrows",
     "rows_per_s_ratio_to_bigserial"),
    (README, r"\*\*1\.15×\*\* \(([\d.]+)× on 15\)", "15", C6, f"{SF6} | outgrows",
     "rows_per_s_ratio_to_bigserial"),
    (README, r"\| ([\d.]+)× \(`uuidv7\(\)`\)", "18", C6, "uuidv7() | outgrows",
     "rows_per_s_ratio_to_bigserial"),
    (README, r"adds about ([\d.]+) ns of CPU", "18", C1, SF, "side_CPU_above_bare_min"),
    (README, r"([\d.]+)× what a `clock_timestamp\(\)` call adds", "18", C1, SF,
     "side_CPU_ratio_to_clock"),
    (README, r"call adds \(([\d.]+)× on 15\)", "15", C1, SF, "side_CPU_ratio_to_clock"),
    (README, r"against ([\d,]+) ns\s+for a sequence's `nextval\(\)`", "18", C1, SEQ1,
     "cpu_ns_per_id_above_bare"),
    (README, r"`nextval\(\)` \(([\d,]+) ns on 15\)", "15", C1, SEQ1,
     "cpu_ns_per_id_above_bare"),
    (PERF, r"\*\*([\d.]+) ns \(15\), [\d.]+ ns \(18\)\*\*", "15", C1, SF,
     "side_CPU_above_bare_min"),
    (PERF, r"\*\*[\d.]+ ns \(15\), ([\d.]+) ns \(18\)\*\*", "18", C1, SF,
     "side_CPU_above_bare_min"),
    (PERF, r"\| ([\d.]+) ns \(15\); 18's bare count", "15", C1, SF,
     "cpu_ns_per_id_above_bare"),
    (PERF, r"`nextval\(\)` CACHE 1: ([\d,]+) ns \(15\)", "15", C1, SEQ1,
     "ns_per_id_above_bare"),
    (PERF, r"CACHE 1000: ([\d,]+) ns \(15\)", "15", C1, "nextval('s1000')  CACHE 1000",
     "ns_per_id_above_bare"),
    (PERF, r"\*\*([\d.]+)× \(18\), [\d.]+× \(15\)\*\* \| `uuidv7\(\)` 0\.27×", "18", C6,
     f"{SF6} | outgrows", "rows_per_s_ratio_to_bigserial"),
    (PERF, r"\*\*[\d.]+× \(18\), ([\d.]+)× \(15\)\*\* \| `uuidv7\(\)` 0\.27×", "15", C6,
     f"{SF6} | outgrows", "rows_per_s_ratio_to_bigserial"),
    (PERF, r"\| ([\d.]+)× \(18\), [\d.]+× \(15\) \| `uuidv7\(\)`", "18", C6,
     f"{SF6} | fits", "rows_per_s_ratio_to_bigserial"),
    (PERF, r"\*\*([\d.]+)× \(18\), [\d.]+× \(15\)\*\* \| CACHE 1000", "18", C2,
     "bigint snowflake_nextval()", "ratio_to_bigserial"),
    (PERF, r"\*\*[\d.]+× \(18\), ([\d.]+)× \(15\)\*\* \| CACHE 1000", "15", C2,
     "bigint snowflake_nextval()", "ratio_to_bigserial"),
    (PERF, r"\*\*([\d.]+) ns \(15\)\*\* \(18: [\d.]+ ns", "15", C1,
     "snowflake_to_public(snowflake_nextval())", "ns_per_id_above_bare"),
    (PERF, r"with the ([\d.]+) ns of `snowflake_nextval\(\)::text`", "15", C1,
     "snowflake_nextval()::text", "ns_per_id_above_bare"),
    (PERF, r"At ([\d.]+) ns per\s+ID \(wall, on 15\)", "15", C1, SF, "ns_per_id"),
    (PERF, r"drift after 2,000,000 IDs: ([\d.]+) ms", "15", C1, SF, "drift_after_rep"),
    (PERF, r"IDs per second \(([\d,]+) ns per ID\)", "15", C1, "snowflake_nextval()  js53",
     "ns_per_id"),
    (PERF, r"\| ([\d.]+) MiB \(= bigserial\), [\d]+ B \|", "18", C6, f"{SF6} | outgrows",
     "pkey_mb"),
    (PERF, r"\| [\d.]+ MiB \(= bigserial\), ([\d]+) B \|", "18", C6, f"{SF6} | outgrows",
     "wal_bytes_per_row"),
    (PERF, r"`uuidv7\(\)` ([\d.]+) MiB, [\d]+ B;", "18", C6, "uuidv7() | outgrows", "pkey_mb"),
    (PERF, r"`uuidv7\(\)` [\d.]+ MiB, ([\d]+) B;", "18", C6, "uuidv7() | outgrows",
     "wal_bytes_per_row"),
    (PERF, r"`gen_random_uuid\(\)` ([\d.]+) MiB, [\d]+ B;", "18", C6,
     "gen_random_uuid() | outgrows", "pkey_mb"),
    (PERF, r"`gen_random_uuid\(\)` [\d.]+ MiB, ([\d]+) B;", "18", C6,
     "gen_random_uuid() | outgrows", "wal_bytes_per_row"),
    (PERF, r"; bigserial ([\d]+) B \|", "18", C6, "bigserial | outgrows", "wal_bytes_per_row"),
    (PERF, r"\*\*([\d]+)–[\d]+ µs\*\*, then under 1 µs", "18", "5_first_call",
     "snowflake_nextval()", "call1_server"),
    (PERF, r"\*\*[\d]+–([\d]+) µs\*\*, then under 1 µs", "15", "5_first_call",
     "snowflake_nextval()", "call1_server"),
    (BENCH, r"\(case 5\): ([\d]+)–[\d]+ µs in the server", "18", "5_first_call",
     "snowflake_nextval()", "call1_server"),
    (BENCH, r"\(case 5\): [\d]+–([\d]+) µs in the server", "15", "5_first_call",
     "snowflake_nextval()", "call1_server"),
    (BENCH, r"WAL per row: ([\d]+) B against bigserial's", "18", C6, f"{SF6} | outgrows",
     "wal_bytes_per_row"),
    (BENCH, r"against bigserial's ([\d]+),", "18", C6, "bigserial | outgrows",
     "wal_bytes_per_row"),
    (BENCH, r"`uuidv7\(\)`'s ([\d]+), `gen_random_uuid\(\)`'s [\d]+", "18", C6,
     "uuidv7() | outgrows", "wal_bytes_per_row"),
    (BENCH, r"`uuidv7\(\)`'s [\d]+, `gen_random_uuid\(\)`'s ([\d]+)", "18", C6,
     "gen_random_uuid() | outgrows", "wal_bytes_per_row"),
    (BENCH, r"\(([\d]+) full-page images and [\d]+\s+index reads", "18", C6,
     "gen_random_uuid() | outgrows", "fpi_per_1k_rows"),
    (BENCH, r"full-page images and ([\d]+)\s+index reads", "18", C6,
     "gen_random_uuid() | outgrows", "idx_reads_per_1k_rows"),
    (BENCH, r"`uuidv7\(\)`'s ([\d.]+)×,\s+`gen_random_uuid\(\)`'s [\d.]+×", "18", C6,
     "uuidv7() | outgrows", "pkey_ratio_to_bigserial"),
    (BENCH, r"`uuidv7\(\)`'s [\d.]+×,\s+`gen_random_uuid\(\)`'s ([\d.]+)×", "18", C6,
     "gen_random_uuid() | outgrows", "pkey_ratio_to_bigserial"),
    (BENCH, r"\| \*\*`snowflake_nextval\(\)`\*\* \| \*\*([\d.]+) ns", "15", C1, SF,
     "side_CPU_above_bare_min"),
    (BENCH, r"on 15 snowflake ([\d.]+) ns, `nextval\(\)` CACHE 1", "15", C1, SF,
     "ns_per_id_above_bare"),
    (BENCH, r"`nextval\(\)` CACHE 1\s+([\d,]+) ns, CACHE 1000", "15", C1, SEQ1,
     "ns_per_id_above_bare"),
    (BENCH, r"\*\*([\d.]+)× bigserial's rows/s\*\*", "18", C6, f"{SF6} | outgrows",
     "rows_per_s_ratio_to_bigserial"),
    (BENCH, r"`SELECT snowflake_nextval\(\)`, ([\d,]+) with two clients", "15",
     "3_concurrency", "SELECT snowflake_nextval() | clients=2", "tps"),
    (BENCH, r"case 3: ([\d,]+) TPS for", "15", "3_concurrency",
     "SELECT snowflake_nextval() | clients=1", "tps"),
]

# (file, regex, the figure in profile.txt it quotes: a regex with group 1)
PROFILE_FIGURES = [
    (PERF, r"one call is ([\d.]+)\s+instructions",
     r"inside snowflake_nextval_wrapper, per call: ([\d.]+) Ir"),
    (PERF, r"runs\s+([\d.]+) instructions per ID above the bare count",
     r"snowflake_nextval\(\)\s+[\d.]+\s+([\d.]+)"),
    (PERF, r"against ([\d,.]+) for\s+`nextval\(\)` on a CACHE 1 sequence",
     r"nextval\('s1'\) CACHE 1\s+[\d.]+\s+([\d.]+)"),
    (BENCH, r"([\d.]+) instructions per call",
     r"inside snowflake_nextval_wrapper, per call: ([\d.]+) Ir"),
]

# The same, for 0.8.0's profile on 18 (bench/results/pg18/profile-0.8.0.txt).
PROFILE_080 = ROOT / "bench/results/pg18/profile-0.8.0.txt"
PROFILE_080_FIGURES = [
    (BENCH, r"([\d.]+) Ir per call in 0\.8\.0",
     r"inside snowflake_nextval_wrapper, per call: ([\d.]+) Ir"),
    (BENCH, r"per call in 0\.8\.0, against [\d.]+ above; ([\d.]+) of them",
     r"([\d.]+)\s+[\d,]+ \([\d.]+%\)\s+snowflake_nextval_wrapper\n"),
    (BENCH, r"the executor runs ([\d,]+) instructions",
     r"snowflake_nextval\(\)\s+([\d.]+)\s+[\d.]+"),
]

SETTINGS_NOTE = ("synchronous_commit = off", "autovacuum = off")


def results(version: str) -> dict[tuple[str, str, str], float]:
    with open(RESULTS[version], newline="") as f:
        return {(r["case"], r["variant"], r["metric"]): float(r["value"])
                for r in csv.DictReader(f)}


def agrees(quoted: str, value: float) -> bool:
    """The quote is the value at the precision it is written with."""
    text = quoted.replace(",", "")
    decimals = len(text.split(".")[1]) if "." in text else 0
    return abs(float(text) - value) <= 0.5 * 10 ** -decimals + 1e-9


def disagreements(texts: dict[str, str]) -> list[str]:
    data = {v: results(v) for v in RESULTS}
    profile = PROFILE.read_text()
    bad = []
    for path, pattern, version, case, variant, metric in FIGURES:
        key = (case, variant, metric)
        if key not in data[version]:
            bad.append(f"{key} is not in {RESULTS[version].relative_to(ROOT)}")
            continue
        quotes = re.findall(pattern, texts[path])
        if not quotes:
            bad.append(f"{path}: no figure matches {pattern!r} (update FIGURES)")
        value = data[version][key]
        bad += [f"{path}: {q} quoted for {variant} {metric} on {version}; results: {value:g}"
                for q in quotes if not agrees(q, value)]
    profiles = [(PROFILE_FIGURES, profile, PROFILE.name),
                (PROFILE_080_FIGURES, PROFILE_080.read_text(), PROFILE_080.name)]
    for path, pattern, source, profile, name in (
            (*f, text, name) for figures, text, name in profiles for f in figures):
        m = re.search(source, profile)
        quotes = re.findall(pattern, texts[path])
        if m is None or not quotes:
            bad.append(f"{path}: {pattern!r} or {name}'s {source!r} not found")
            continue
        bad += [f"{path}: {q} quoted; {name}: {m.group(1)}"
                for q in quotes if not agrees(q, float(m.group(1)))]
    return bad


def texts() -> dict[str, str]:
    return {p: (ROOT / p).read_text() for p in (README, PERF, BENCH)}


def test_quoted_figures_are_the_published_results():
    assert disagreements(texts()) == []


def test_files_quoting_figures_say_the_bench_settings():
    for path, text in texts().items():
        flat = re.sub(r"\s+", " ", text)
        for note in SETTINGS_NOTE:
            assert note in flat, f"{path} quotes bench figures without saying {note!r}"


@pytest.mark.parametrize("path, old, new", [
    (README, "**1.15×**", "**1.25×**"),
    (PERF, "`nextval()` CACHE 1: 167 ns (15)", "`nextval()` CACHE 1: 139 ns (15)"),
    (BENCH, "52.1 instructions per call", "295 instructions per call"),
])
def test_a_planted_figure_that_disagrees_fails(path, old, new):
    t = texts()
    assert old in t[path]
    t[path] = t[path].replace(old, new, 1)
    assert disagreements(t)


def test_agrees_reads_the_precision_quoted():
    assert agrees("22", 21.74) and agrees("1.15", 1.14892) and agrees("16,445", 16445.2)
    assert not agrees("1.16", 1.14892) and not agrees("21", 21.74)
