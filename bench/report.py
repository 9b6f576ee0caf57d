"""The report of a run: the tables of each case, the goals (PASS/MISS/inconclusive), and
the files in BENCH_OUT: results.csv, results.txt (the printed tables),
meta.json, chart.svg/chart.png (cases 1-3) and chart_insert.svg/.png
(case 6), drawn by matplotlib (Agg backend)."""

from __future__ import annotations

import csv
import datetime as dt
import hashlib
import json
import os
import platform
import subprocess

from cases import case1, case2, case3, case4, case5, case6, case7
from config import (BACKFILL_REPS, BACKFILL_ROWS, BATCH_N, CASES, CLIENTS, CONNECTIONS, INSERT_BATCH,
                    INSERT_CHECKPOINT_EVERY, INSERT_CLIENTS, INSERT_REPS, INSERT_ROWS,
                    INSERT_ROWS_BIG, INSERT_SHARED_BUFFERS, N, N_JS53, NCPU, PGB_REPS,
                    PGB_SECONDS, QUICK, RATIO_N, RATIO_ROUNDS, RELEASE_SO, REPO, REPS,
                    SERVER_SETTINGS)
from measure import Metric, R
from servers import PG_PKGLIBDIR, TREE, _conf_value

EXTENSION_SO = os.path.join(PG_PKGLIBDIR, "snowflake_id.so")


# ------------------------------------------------------------------ printing
def fmt(x: float | None) -> str:
    if x is None:
        return "-"
    a = abs(x)
    if a >= 1000:
        return f"{x:,.0f}"
    if a >= 100:
        return f"{x:.0f}"
    if a >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}"


def fmt_spread(m: Metric | None) -> str:
    if m is None:
        return "-"
    s = m.s
    if s["reps"] < 2:
        return fmt(s["median"])
    return f"{fmt(s['median'])} [{fmt(s['min'])}–{fmt(s['max'])}]"


def fmt_iqr(m: Metric | None) -> str:
    if m is None:
        return "-"
    s = m.s
    return f"{fmt(s['median'])} [{fmt(s['p25'])}–{fmt(s['p75'])}]"


OUTPUT: list[str] = []  # every printed line, for results.txt


def out(line: str = "") -> None:
    print(line, flush=True)
    OUTPUT.append(line)


def table(headers: list[str], rows: list[list[str]], right: set[int]) -> None:
    widths = [max(len(str(r[i])) for r in [headers] + rows)
              for i in range(len(headers))]

    def line(cells):
        parts = []
        for i, c in enumerate(cells):
            parts.append(str(c).rjust(widths[i]) if i in right
                         else str(c).ljust(widths[i]))
        return "  ".join(parts).rstrip()

    out("  " + line(headers))
    out("  " + "  ".join("-" * w for w in widths))
    for r in rows:
        out("  " + line(r))


def load_note(case: str) -> str:
    i = R.case_info.get(case)
    return (f"; {i['seconds']:.0f} s, load average {i['load_start']:.1f} → {i['load_end']:.1f}"
            if i else "")


# --------------------------------------------------------------------- cases
def report_case1() -> None:
    C = case1.CASE
    if R.get(C, case1.VARIANTS[0][1], "ns_per_id") is None:
        return
    out()
    out("Case 1 - single session: SELECT count(x) FROM (SELECT <expr> x FROM "
        "generate_series(1, N)) s")
    out(f"         median [min–max] over {REPS} reps; wall: client-timed over a warm "
        f"unix-socket connection; CPU: the backend's CPU time{load_note('1')}")
    rows = []
    for k, label, expr, srv, sf in case1.VARIANTS:
        g = lambda m: R.get(C, label, m)  # noqa: E731
        per = g("ns_per_id")
        if per is None:
            continue
        drift = g("drift_after_rep")
        rows.append([label, f"{int(per.params[2:]):,}", fmt_spread(per),
                     fmt_spread(g("ns_per_id_above_bare")) if g("ns_per_id_above_bare") else "-",
                     fmt(g("cpu_ns_per_id").s["median"]),
                     fmt_spread(g("cpu_ns_per_id_above_bare"))
                     if g("cpu_ns_per_id_above_bare") else "-",
                     f"{drift.s['median']:.0f} ms" if drift else ""])
    table(["expression", "N", "wall ns/ID", "wall above bare", "CPU ns/ID",
           "CPU above bare", "drift after"], rows, {1, 2, 3, 4, 5, 6})
    out("  drift after: how far the newest snowflake ran ahead of the wall clock "
        "after the rep (each rep starts at 0;")
    out("  ticks are borrowed when the sequence of a tick is used up, up to "
        "snowflake_id.max_drift (the server line above), then it waits).")
    report_case1_side_by_side()


def report_case1_side_by_side() -> None:
    C = case1.CASE
    rows = []
    for k, label, *_ in case1.VARIANTS:
        g = lambda m: R.get(C, label, m)  # noqa: E731
        wall, cpu = g("side_wall_ns_per_id"), g("side_CPU_ns_per_id")
        if wall is None:
            continue
        above = [g(f"side_{b}_above_bare_min") for b in ("wall", "CPU")]
        ratio = [g(f"side_{b}_ratio_to_clock") for b in ("wall", "CPU")]
        paired = [g(f"side_{b}_paired_ratio") for b in ("wall", "CPU")]
        rows.append([label, fmt(wall.s["min"]), fmt(above[0].values[0]) if above[0] else "-",
                     fmt(ratio[0].values[0]) + " ×" if ratio[0] else "",
                     fmt(cpu.s["min"]), fmt(above[1].values[0]) if above[1] else "-",
                     fmt(ratio[1].values[0]) + " ×" if ratio[1] else "",
                     fmt(cpu.s["median"]),
                     " / ".join(fmt(p.s["median"]) for p in paired if p) + " ×"
                     if all(paired) else ""])
    if not rows:
        return
    out()
    out(f"Case 1, side by side: {RATIO_ROUNDS} interleaved rounds of N = {RATIO_N:,}; "
        "minimum per ID over the rounds, above: less the bare count's minimum;")
    out("         × clock: above bare over clock_timestamp()'s above bare (the goal's figure);")
    out("         paired: the same per round (each round's own bare count and clock_timestamp()),"
        " median over the rounds, wall / CPU")
    table(["expression", "wall min", "wall above", "× clock", "CPU min", "CPU above",
           "× clock", "CPU median", "paired"], rows, {1, 2, 3, 4, 5, 6, 7, 8})
    out("  bench_clock_ms() / bench_clock_seq(): bench/floor/bench_floor.c, C functions that "
        "only read the clock (and count)")
    out("  in the millisecond): the least any time-ordered ID costs, none of snowflake_id's "
        "guarantees.")


def report_case2() -> None:
    C = case2.CASE
    if R.get(C, case2.VARIANTS[0][0], "seconds") is None:
        return
    out()
    out(f"Case 2 - bulk load: INSERT INTO t SELECT FROM generate_series(1, {N:,}) "
        "into an UNLOGGED table with its primary key")
    out(f"         median [min–max] over {REPS} reps, table truncated before each{load_note('2')}")
    rows = []
    for label, t, _ in case2.VARIANTS:
        s = R.get(C, label, "seconds")
        if s is None:
            return
        rows.append([label, fmt_spread(s),
                     fmt_spread(R.get(C, label, "ns_per_row")),
                     fmt_spread(R.get(C, label, "ratio_to_bigserial")),
                     fmt_spread(R.get(C, label, "cpu_seconds")),
                     fmt_spread(R.get(C, label, "cpu_ratio_to_bigserial"))])
    table(["key", "wall seconds", "wall ns/row", "wall × bigserial", "CPU seconds",
           "CPU × bigserial"], rows, {1, 2, 3, 4, 5})


def report_case3() -> None:
    C = case3.CASE
    if R.get(C, f"{case3.VARIANTS[0][0]} | clients={CLIENTS[0]}", "tps") is None:
        return
    out()
    out(f"Case 3 - concurrency: pgbench -n -M prepared -T {PGB_SECONDS}, one "
        f"statement per transaction, synchronous_commit = off")
    out(f"         TPS, median of {PGB_REPS} reps (min–max in bench/out/results.csv); "
        f"{NCPU} CPUs, pgbench threads = min(clients, {NCPU}){load_note('3')}")
    rows = []
    for label, key, _, _ in case3.VARIANTS:
        if R.get(C, f"{label} | clients={CLIENTS[0]}", "tps") is None:
            continue  # a variant this run did not have
        row = [label]
        for c in CLIENTS:
            row.append(fmt(R.get(C, f"{label} | clients={c}", "tps").s["median"]))
        sc = R.get(C, label, "scaling_1_to_2_clients")
        row.append(fmt_spread(sc) if sc else "-")
        rows.append(row)
    table(["script"] + [f"{c} cl" for c in CLIENTS] + ["2 cl / 1 cl"], rows,
          set(range(1, len(CLIENTS) + 2)))
    out("  1 client: each transaction waits for an idle CPU to wake up (bench/cases/case3.py); "
        "a 1 cl figure at SELECT 1's is that floor, not the script's cost")


def report_case4() -> None:
    C, L = case4.CASE, case4.LABELS
    if R.get(C, L["batch"], "ns_per_id") is None:
        return
    out()
    out(f"Case 4 - batch vs single: SELECT count(*) FROM snowflake_nextvals({BATCH_N:,}) "
        f"vs the single form over generate_series")
    out(f"         median [min–max] over {REPS} reps{load_note('4')}")
    rows = []
    for k in ("bare", "single", "batch"):
        g = lambda m: R.get(C, L[k], m)  # noqa: E731
        rows.append([L[k], fmt_spread(g("ns_per_id")),
                     fmt_spread(g("ns_per_id_above_bare")) if k != "bare" else "",
                     fmt_spread(g("cpu_ns_per_id")),
                     fmt_spread(g("cpu_ns_per_id_above_bare")) if k != "bare" else ""])
    table(["form", "wall ns/ID", "wall above bare", "CPU ns/ID", "CPU above bare"],
          rows, {1, 2, 3, 4})
    out(f"  single / batch time: wall {fmt_spread(R.get(C, 'single / batch', 'ratio'))} ×,"
        f" CPU {fmt_spread(R.get(C, 'single / batch', 'cpu_ratio'))} ×")


def report_case5() -> None:
    C = case5.CASE
    if R.get(C, "snowflake_nextval()", "connect") is None:
        return
    out()
    out("Case 5 - first call in a new connection (worker claim) vs later calls, "
        f"{CONNECTIONS // 2} new connections each{load_note('5')}")
    out("         µs, median [p25–p75] over connections; client = round trip timed "
        "by the client (libpq, unix socket);")
    out("         server = time between two clock_timestamp() around the call in "
        "the same target list (1 µs resolution)")
    names = [("connect", "connect (client)"), ("select1_first", "first SELECT 1 (client)"),
             ("select1_warm", "second SELECT 1 (client, round-trip baseline)"),
             ("call1_client", "1st call statement (client)"),
             ("call2_client", "2nd call statement (client)"),
             ("call3_client", "3rd call statement (client)"),
             ("first_minus_second_client", "1st − 2nd statement (client)"),
             ("call1_server", "1st call (server)"), ("call2_server", "2nd call (server)")]
    rows = [[label, fmt_iqr(R.get(C, "snowflake_nextval()", m)),
             fmt_iqr(R.get(C, "nextval('s1')", m))] for m, label in names]
    table(["µs", "snowflake_nextval()", "nextval('s1')  (reference)"], rows, {1, 2})


def report_case7() -> None:
    C = case7.CASE
    if R.get(C, case7.PLAIN, "rows_per_s") is None:
        return
    out()
    out(f"Case 7 - backfill: INSERT INTO a logged table (bigint primary key) SELECT key, ... "
        f"FROM a legacy table of {BACKFILL_ROWS:,} rows{load_note('7')}")
    out("         times at random over five years; ordered: the legacy rows in time order; "
        "unordered: in key order;")
    out(f"         one statement, a new session each; median [min–max] over {BACKFILL_REPS} "
        "reps; ratios of wall time, per rep, paired")
    ratio = {a: (metric, b) for a, b, metric in case7.RATIOS}
    rows = []
    for label, expr, source, target in case7.VARIANTS:
        r = ratio.get(label)
        rows.append([label, f"INTO {target} SELECT {expr} FROM {source}",
                     fmt_spread(R.get(C, label, "rows_per_s")),
                     fmt_spread(R.get(C, label, "cpu_us_per_row")),
                     f"{fmt_spread(R.get(C, label, r[0]))} × {r[1]}" if r else ""])
    table(["key", "INSERT", "rows/s", "CPU µs/row", "time ×"], rows, {2, 3})


def case6_ran() -> list[tuple]:
    """The variants of case 6 that ran (uuidv7 needs 18, pgEdge its extension)."""
    return [v for v in case6.VARIANTS
            if R.get(case6.CASE, f"{v[0]} | clients={INSERT_CLIENTS[0]}", "rows_per_s")
            or R.get(case6.CASE, f"{v[0]} | fits", "rows_per_s")]


def case6_load_params(phase: str) -> str:
    m = next((R.get(case6.CASE, f"{v[0]} | {phase}", "rows_per_s") for v in case6_ran()),
             None)
    return m.params if m else ""


def report_case6() -> None:
    C, ran = case6.CASE, case6_ran()
    if not ran:
        return
    g = lambda label, m: R.get(C, label, m)  # noqa: E731
    out()
    out("Case 6 - INSERT into a logged table whose only column is the primary key, "
        f"defaulting to each generator{load_note('6')}")
    out(f"  a) pgbench -n -M prepared -T {PGB_SECONDS}: INSERT INTO t DEFAULT VALUES, one "
        "row per transaction (synchronous_commit = off);")
    out(f"     rows/s, median [min–max] over {PGB_REPS} reps; × bigserial: per rep, paired; "
        "table truncated and a CHECKPOINT before each run")
    rows = []
    for label, *_ in ran:
        row = [label]
        row += [fmt_spread(g(f"{label} | clients={c}", "rows_per_s")) for c in INSERT_CLIENTS]
        row += [fmt_spread(g(f"{label} | clients={c}", "rows_per_s_ratio_to_bigserial"))
                for c in INSERT_CLIENTS]
        sc = g(label, "scaling_1_to_2_clients")
        rows.append(row + [fmt_spread(sc) if sc else "-"])
    table(["key"] + [f"{c} cl rows/s" for c in INSERT_CLIENTS]
          + [f"{c} cl × bigserial" for c in INSERT_CLIENTS] + ["2 cl / 1 cl"], rows,
          set(range(1, 2 * len(INSERT_CLIENTS) + 2)))
    for i, (phase, title) in enumerate(case6.PHASES):
        params = case6_load_params(phase)
        if not params:
            continue
        p = dict(kv.split("=", 1) for kv in params.split())
        out(f"  {'bc'[i]}) {title}: {int(p['rows']):,} rows, shared_buffers {p['shared_buffers']}, "
            f"INSERT … SELECT FROM generate_series of {int(p['batch']):,} rows per statement,")
        out(f"     a CHECKPOINT every {int(p['checkpoint_every']):,} rows (and before the "
            f"load); median [min–max] over {INSERT_REPS} reps; WAL includes the full-page "
            "images after each checkpoint")
        rows = []
        for label, *_ in ran:
            k = f"{label} | {phase}"
            med = lambda m: fmt(g(k, m).s["median"]) if g(k, m) else "-"  # noqa: E731
            rows.append([label, fmt_spread(g(k, "rows_per_s")),
                         fmt_spread(g(k, "rows_per_s_ratio_to_bigserial")),
                         med("pkey_mb"), med("pkey_bytes_per_row"),
                         fmt_spread(g(k, "pkey_ratio_to_bigserial")),
                         med("pkey_over_shared_buffers"), med("wal_bytes_per_row"),
                         fmt_spread(g(k, "wal_ratio_to_uuidv7")), med("fpi_per_1k_rows"),
                         med("idx_reads_per_1k_rows"), med("heap_bytes_per_row")])
        table(["key", "rows/s", "× bigserial", "pkey MiB", "pkey B/row", "× bigserial",
               "/ sh_buf", "WAL B/row", "× uuidv7", "FPI/1k rows", "idx reads/1k",
               "heap B/row"], rows, set(range(1, 12)))
    out("  FPI: full-page images written (pg_stat_wal.wal_fpi); idx reads: primary-key "
        "blocks not found in shared_buffers")
    out("  (pg_statio_user_indexes.idx_blks_read); / sh_buf: primary key size over "
        "shared_buffers at the end of the load.")


# --------------------------------------------------------------------- goals
def goal_status(measured: float, limit: float, better: str) -> str:
    """PASS or MISS of a goal's median; every goal's figure is a cost, a
    size or a ratio of them, so one at or below zero says the noise was
    larger than what was measured: inconclusive, never a PASS (an upper
    bound met by a negative cost proves nothing)."""
    if measured <= 0:
        return "inconclusive"
    ok = measured <= limit if better == "le" else measured >= limit
    return "PASS" if ok else "MISS"


def goals(meta: dict) -> None:
    G: list[dict] = []
    c1, c2, c3 = case1.CASE, case2.CASE, case3.CASE

    def add(name, basis, m: Metric | None, limit, better, unit, detail="", spread=None,
            missing="case not run"):
        """m: the metric whose median is the measured figure; spread: the
        per-rep values behind it (default m's own): their min–max, and how
        many of them meet the goal on their own; missing: why there is no m."""
        if m is None:
            G.append({"goal": name, "basis": basis, "status": "n/a", "measured": None,
                      "unit": unit, "limit": limit, "detail": missing,
                      "values": [], "reps_meeting": ""})
            return
        meets = (lambda x: x <= limit) if better == "le" else (lambda x: x >= limit)
        v = m.s["median"]
        values = spread or m.values
        G.append({"goal": name, "basis": basis, "status": goal_status(v, limit, better),
                  "measured": v, "unit": unit, "limit": limit, "values": values,
                  "reps_meeting": f"{sum(x > 0 and meets(x) for x in values)}/{len(values)}",
                  "detail": detail or f"[{fmt(min(values))}–{fmt(max(values))}]"})

    def ratio_goal(basis, metric):
        """snowflake above bare over nextval CACHE 1 above bare: the ratio of
        the two medians (a per-rep ratio is unstable when its denominator is
        small and noisy); the per-rep ratios give the spread."""
        sf = R.get(c1, "snowflake_nextval()  classic", metric)
        seq = R.get(c1, "nextval('s1')  CACHE 1", metric)
        if not (sf and seq and seq.s["median"] > 0):
            add("snowflake_nextval() ≤ 1/5 of nextval CACHE 1 above bare", basis, None,
                0.2, "le", "x")
            return
        per_rep = [a / b for a, b in zip(sf.values, seq.values) if b > 0]
        add("snowflake_nextval() ≤ 1/5 of nextval CACHE 1 above bare", basis,
            Metric("goal", "", "", "x", [sf.s["median"] / seq.s["median"]]), 0.2, "le", "x",
            f"{fmt(sf.s['median'])} ns / {fmt(seq.s['median'])} ns; per-rep "
            f"[{fmt(min(per_rep))}–{fmt(max(per_rep))}]" if per_rep else "",
            spread=per_rep)

    sf = "snowflake_nextval()  classic"
    add("snowflake_nextval() ≤ 60 ns/ID above bare", "wall",
        R.get(c1, sf, "ns_per_id_above_bare"), 60, "le", "ns")
    add("snowflake_nextval() ≤ 60 ns/ID above bare", "CPU",
        R.get(c1, sf, "cpu_ns_per_id_above_bare"), 60, "le", "ns")
    pub = "snowflake_to_public(snowflake_nextval())"
    add(f"{pub} < 100 ns/ID above bare", "wall",
        R.get(c1, pub, "ns_per_id_above_bare"), 100, "le", "ns")
    add(f"{pub} < 100 ns/ID above bare", "CPU",
        R.get(c1, pub, "cpu_ns_per_id_above_bare"), 100, "le", "ns")
    ratio_goal("wall", "ns_per_id_above_bare")
    ratio_goal("CPU", "cpu_ns_per_id_above_bare")
    for basis in ("wall", "CPU"):
        m = R.get(c1, sf, f"side_{basis}_ratio_to_clock")
        add("snowflake_nextval() ≤ 1.3 × clock_timestamp() above bare", f"{basis} min", m,
            1.3, "le", "x", f"minimum over {RATIO_ROUNDS} interleaved rounds",
            missing="no positive cost above the bare count: rounds noisier than the cost"
            if R.get(c1, sf, f"side_{basis}_ns_per_id") else "case not run")
    for basis in ("wall", "CPU"):
        m = R.get(c1, sf, f"side_{basis}_paired_ratio")
        floor = R.get(c1, "bench_clock_ms()  C floor: a call, a clock read",
                      f"side_{basis}_paired_ratio")
        add("snowflake_nextval() ≤ 1.3 × clock_timestamp() above bare", f"{basis} paired", m,
            1.3, "le", "x", f"median over {RATIO_ROUNDS} rounds of the ratio in each round"
            + (f"; the C floor's: {fmt(floor.s['median'])} x" if floor else ""))
    add("bulk load ≤ 1.0 × bigserial", "wall", R.get(
        c2, "bigint snowflake_nextval()", "ratio_to_bigserial"), 1.0, "le", "x")
    add("bulk load ≤ 1.0 × bigserial", "CPU", R.get(
        c2, "bigint snowflake_nextval()", "cpu_ratio_to_bigserial"), 1.0, "le", "x")
    add("2 clients ≥ 1.8 × 1 client, SELECT snowflake_nextval()", "TPS",
        R.get(c3, "SELECT snowflake_nextval()", "scaling_1_to_2_clients"), 1.8, "ge", "x")
    add("2 clients ≥ 1.8 × 1 client, INSERT snowflake key", "TPS",
        R.get(c3, "INSERT snowflake", "scaling_1_to_2_clients"), 1.8, "ge", "x")
    c6, sf6, ran6 = case6.CASE, case6.SNOWFLAKE, case6_ran()
    for c in INSERT_CLIENTS:
        add(f"INSERT rows/s ≥ 0.95 × bigserial, pgbench {c} client{'s' * (c > 1)}", "wall",
            R.get(c6, f"{sf6} | clients={c}", "rows_per_s_ratio_to_bigserial"), 0.95, "ge",
            "x")
    for phase, title in case6.PHASES:
        add(f"INSERT rows/s ≥ 0.95 × bigserial, load, {title}", "wall",
            R.get(c6, f"{sf6} | {phase}", "rows_per_s_ratio_to_bigserial"), 0.95, "ge", "x")
        add(f"primary key ≤ 1.05 × bigserial's, {title}", "size",
            R.get(c6, f"{sf6} | {phase}", "pkey_ratio_to_bigserial"), 1.05, "le", "x")
        add(f"WAL per row ≤ uuidv7()'s, {title}", "WAL",
            R.get(c6, f"{sf6} | {phase}", "wal_ratio_to_uuidv7"), 1.0, "le", "x",
            missing="no uuidv7() on this PostgreSQL (18 and later)" if ran6
            else "case not run")
    c7 = case7.CASE
    add("backfill unordered ≤ 2 × ordered (time)", "wall",
        R.get(c7, case7.UNORDERED, "time_ratio_unordered_to_ordered"), 2.0, "le", "x")
    add("backfill unordered ≤ 2 × ordered (time), no index", "wall",
        R.get(c7, case7.UNORDERED_HEAP, "time_ratio_unordered_to_ordered"), 2.0, "le", "x")
    add("backfill ordered ≤ 1.5 × snowflake_nextval() (time)", "wall",
        R.get(c7, case7.ORDERED, "time_ratio_ordered_to_nextval"), 1.5, "le", "x")
    out()
    out("Goals: PASS/MISS by the median across reps (inconclusive: a median at or below zero, "
        "noise larger than the cost); 'reps' = how many single reps meet the goal on their own")
    out("       wall = elapsed time as a client sees it (what the goals are about); CPU = "
        "the backend's CPU time, the")
    out("       cross-check that other work on the machine does not disturb "
        f"(load average at start {meta.get('loadavg_start', '?')})")
    rows = [[g["status"], g["goal"], g["basis"],
             f"{fmt(g['measured'])} {g['unit']}" if g["measured"] is not None else "-",
             g["reps_meeting"], g["detail"]] for g in G]
    table(["", "goal", "basis", "measured", "reps", "spread"], rows, {3, 4})
    for g in G:
        R.add("goals", f"{g['goal']} ({g['basis']})", "measured", g["unit"],
              g["values"] or [float("nan")], f"limit={g['limit']}",
              f"{g['status']}; reps meeting it: {g['reps_meeting']}",
              value=g["measured"] if g["measured"] is not None else float("nan"))


# ------------------------------------------------------------------ metadata
def sha256(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return None


def metadata() -> dict:
    """The run's machine, build and parameters (meta.json); the server's
    version and settings are added once it runs."""
    def cmd(*a):
        try:
            return subprocess.check_output(a, text=True, cwd=REPO,
                                           stderr=subprocess.DEVNULL).strip()
        except (OSError, subprocess.CalledProcessError):
            return ""
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f
                        if line.startswith("model name")), "")
    except OSError:
        pass
    so = sha256(TREE["so"])
    return {
        "date": dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"),
        "git_commit": cmd("git", "rev-parse", "HEAD"),
        "git_dirty": bool(cmd("git", "status", "--porcelain", "--", "src", "core",
                              "Cargo.toml")),
        "library_source": TREE["source"],
        "library_sha256": so,
        "is_target_release_build": so is not None and so == sha256(RELEASE_SO),
        "installed_library_is_the_same": so == sha256(EXTENSION_SO),
        "pg_version": "",  # filled in from the server
        "cpu": cpu, "ncpu": NCPU, "kernel": platform.release(),
        "loadavg_start": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "quick": QUICK,
        "params": {"reps": REPS, "n": N, "n_js53": N_JS53, "batch_n": BATCH_N,
                   "pgbench_seconds": PGB_SECONDS, "pgbench_reps": PGB_REPS,
                   "clients": CLIENTS, "connections": CONNECTIONS,
                   "insert_clients": INSERT_CLIENTS, "insert_rows": INSERT_ROWS,
                   "insert_rows_big": INSERT_ROWS_BIG,
                   "insert_shared_buffers": INSERT_SHARED_BUFFERS,
                   "insert_batch": INSERT_BATCH,
                   "insert_checkpoint_every": INSERT_CHECKPOINT_EVERY,
                   "insert_reps": INSERT_REPS, "backfill_rows": BACKFILL_ROWS,
                   "backfill_reps": BACKFILL_REPS, "cases": sorted(CASES)},
        "server_settings": {k: _conf_value(v) for k, v in SERVER_SETTINGS.items()},
    }


def header(meta: dict) -> None:
    out()
    out(f"snowflake_id benchmarks — {meta['date']}, commit {meta['git_commit'][:10]}"
        f"{' + uncommitted changes in src/' if meta['git_dirty'] else ''}"
        f"{'  [QUICK MODE]' if QUICK else ''}")
    out(f"PostgreSQL {meta['pg_version']}, {NCPU} CPUs ({meta['cpu']}), load average "
        f"{meta['loadavg_start']} at start, {meta['loadavg_end']} at end; "
        f"{meta['elapsed_s']:.0f} s")
    out(f"library {meta['library_source']}/snowflake_id.so sha256 "
        f"{meta['library_sha256'][:12]} ("
        f"{'= the target/release build' if meta['is_target_release_build'] else 'NOT the target/release build'}"
        f"; a private copy, so builds installed meanwhile do not matter)")
    out("server: " + ", ".join(f"{k}={v}" for k, v in meta.get("pg_settings", {}).items()))


# ------------------------------------------------------------------- outputs
def write_csv(path: str) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["case", "variant", "metric", "value", "unit", "median", "min", "max",
                    "p25", "p75", "reps", "params", "note"])
        for m in R.metrics:
            s = m.s
            r = lambda x: f"{x:.6g}"  # noqa: E731
            value = s["median"] if m.value is None else m.value
            w.writerow([m.case, m.variant, m.metric, r(value), m.unit, r(s["median"]),
                        r(s["min"]), r(s["max"]), r(s["p25"]), r(s["p75"]), s["reps"],
                        m.params, m.note])


CLIENT_COLORS = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948",
                 "#b07aa1", "#9c755f"]


def chart_panels() -> list[dict]:
    """What the chart shows, one panel per case (1, 2, 3) that ran: bars of
    (label, median, min, max, color, annotation)."""
    panels = []
    SF, OTHER = "#e15759", "#4e79a7"
    bars = []
    for k, label, expr, srv, sf in case1.VARIANTS:
        m = R.get(case1.CASE, label, "ns_per_id_above_bare")
        if m is not None:
            bars.append((label, m.s["median"], m.s["min"], m.s["max"], SF if sf else OTHER, ""))
    panels.append({
        "title": "Case 1 — ns per ID above the bare generate_series count (single session)",
        "subtitle": f"N = {N:,} IDs per statement (js53: {N_JS53:,}); median, whiskers "
                    f"min–max over {REPS} reps; lower is better",
        "bars": bars, "unit": "ns per ID", "cap_outliers": True})
    bars = []
    for label, t, _ in case2.VARIANTS:
        m = R.get(case2.CASE, label, "seconds")
        if m is not None:
            r = R.get(case2.CASE, label, "ratio_to_bigserial").s["median"]
            bars.append((label, m.s["median"], m.s["min"], m.s["max"],
                         SF if "snowflake" in label else OTHER, f"({r:.2f}× bigserial)"))
    panels.append({
        "title": "Case 2 — bulk load, seconds for one INSERT … SELECT FROM generate_series",
        "subtitle": f"{N:,} rows into an UNLOGGED table with the primary-key index; median, "
                    f"whiskers min–max over {REPS} reps; lower is better",
        "bars": bars, "unit": "seconds", "cap_outliers": False})
    bars = []
    for label, key, _, _ in case3.VARIANTS:
        for ci, c in enumerate(CLIENTS):
            m = R.get(case3.CASE, f"{label} | clients={c}", "tps")
            if m is not None:
                bars.append((f"{label}, {c} cl", m.s["median"], m.s["min"], m.s["max"],
                             CLIENT_COLORS[ci % len(CLIENT_COLORS)], ""))
    panels.append({
        "title": "Case 3 — pgbench TPS by number of clients",
        "subtitle": f"-M prepared -T {PGB_SECONDS}, {NCPU} CPUs; median, whiskers min–max "
                    f"over {PGB_REPS} reps; higher is better",
        "bars": bars, "unit": "transactions per second", "cap_outliers": False})
    return [p for p in panels if p["bars"]]


def insert_panels() -> list[dict]:
    """Case 6's chart (chart_insert.svg), one panel per figure: pgbench rows/s,
    the loads' rows/s, primary-key bytes per row and WAL bytes per row."""
    C, ran = case6.CASE, case6_ran()
    if not ran:
        return []

    def bar(label, m, color, ann=""):
        return (label, m.s["median"], m.s["min"], m.s["max"], color, ann)

    def ratio_ann(k, metric, base):
        r = R.get(C, k, metric)
        return f"({r.s['median']:.2f}× {base})" if r else ""

    panels = []
    bars = []
    for label, *_ in ran:
        for ci, c in enumerate(INSERT_CLIENTS):
            m = R.get(C, f"{label} | clients={c}", "rows_per_s")
            if m is not None:
                bars.append(bar(f"{label}, {c} cl", m, CLIENT_COLORS[ci % len(CLIENT_COLORS)],
                                ratio_ann(f"{label} | clients={c}",
                                          "rows_per_s_ratio_to_bigserial", "bigserial")))
    panels.append({
        "title": "Case 6 — INSERT rows/s into a logged table, pgbench, one row per transaction",
        "subtitle": f"-M prepared -T {PGB_SECONDS}, synchronous_commit = off, {NCPU} CPUs; "
                    f"median, whiskers min–max over {PGB_REPS} reps; higher is better",
        "bars": bars, "unit": "rows per second", "cap_outliers": False})
    loads = [(phase, title, case6_load_params(phase)) for phase, title in case6.PHASES]
    loads = [(phase, title, dict(kv.split("=", 1) for kv in p.split()))
             for phase, title, p in loads if p]
    sizes = "; ".join(f"{phase}: {int(p['rows']):,} rows in {p['shared_buffers']}"
                      + " shared_buffers" * (i == 0) for i, (phase, _, p) in enumerate(loads))
    for metric, title, unit, better, ann in [
            ("rows_per_s", "batched load, rows/s", "rows per second", "higher",
             lambda k: ratio_ann(k, "rows_per_s_ratio_to_bigserial", "bigserial")),
            ("pkey_bytes_per_row", "primary-key index bytes per row after the load",
             "bytes per row", "lower",
             lambda k: f"({fmt(R.get(C, k, 'pkey_mb').s['median'])} MiB, "
                       f"{fmt(R.get(C, k, 'pkey_over_shared_buffers').s['median'])}× "
                       "shared_buffers)"),
            ("wal_bytes_per_row", "WAL bytes per row, checkpoints' full-page images included",
             "bytes per row", "lower",
             lambda k: f"({fmt(R.get(C, k, 'fpi_per_1k_rows').s['median'])} FPI per 1k rows)")]:
        bars = []
        for label, *_ in ran:
            for pi, (phase, _, _) in enumerate(loads):
                k = f"{label} | {phase}"
                m = R.get(C, k, metric)
                if m is not None:
                    bars.append(bar(f"{label}, {phase}", m, CLIENT_COLORS[pi], ann(k)))
        panels.append({
            "title": f"Case 6 — {title}",
            "subtitle": f"{sizes}; CHECKPOINT every {INSERT_CHECKPOINT_EVERY:,} rows; "
                        f"{better} is better",
            "bars": bars, "unit": f"{unit}; median, whiskers min–max over {INSERT_REPS} reps",
            "cap_outliers": False})
    return [p for p in panels if p["bars"]]


def write_chart(path_svg: str, meta: dict, panels: list[dict]) -> list[str]:
    """path_svg and the same as .png: a horizontal bar chart per panel
    (chart_panels(), insert_panels()), median with min–max whiskers, drawn by
    matplotlib (Agg backend)."""
    if not panels:
        return []
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"svg.fonttype": "none", "svg.hashsalt": "snowflake_id",
                         "font.family": "DejaVu Sans", "font.size": 9})
    heights = [1.2 + 0.26 * len(p["bars"]) for p in panels]
    fig, axes = plt.subplots(len(panels), 1, figsize=(10.5, sum(heights) + 0.5),
                             gridspec_kw={"height_ratios": heights}, squeeze=False)
    for ax, p in zip(axes[:, 0], panels):
        bars = p["bars"]
        y = list(range(len(bars)))
        meds = [b[1] for b in bars]
        vals = sorted(max(b[1], b[3]) for b in bars)
        vmax = vals[-1]
        if p["cap_outliers"] and len(vals) > 2 and vals[-1] > 4 * vals[-2] > 0:
            vmax = vals[-2] * 1.25  # keep the others readable; clipped bars are marked
        vmax = max(vmax, 1e-9)
        ax.barh(y, [max(m, 0) for m in meds], color=[b[4] for b in bars], height=0.7,
                zorder=2)
        for i, (label, med, lo, hi, color, ann) in enumerate(bars):
            clipped = med > vmax
            if not clipped:
                ax.errorbar([med], [i], xerr=[[med - lo], [hi - med]], fmt="none",
                            ecolor="#222", elinewidth=1.1, capsize=3, zorder=3)
            x = max(0, min(vmax, hi))
            ax.annotate(fmt(med) + (" (clipped)" if clipped else "") + (f"  {ann}" if ann else ""),
                        (x, i), xytext=(5, 0), textcoords="offset points", va="center",
                        fontsize=8, annotation_clip=False)
        ax.set_yticks(y, [b[0] for b in bars])
        ax.invert_yaxis()
        ax.set_xlim(0, vmax * 1.02)
        ax.set_xlabel(p["unit"], fontsize=8, color="#555")
        ax.grid(axis="x", color="#ddd", zorder=0)
        ax.spines[["top", "right"]].set_visible(False)
        ax.set_title(p["title"] + "\n", loc="left", fontsize=11, fontweight="bold")
        ax.text(0, 1.02, p["subtitle"], transform=ax.transAxes, fontsize=8, color="#555")
        ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(
            lambda v, _, big=vmax >= 5: f"{v:,.0f}" if big else f"{v:g}"))
    fig.text(0.01, 0.005, f"snowflake_id {meta.get('git_commit', '')[:10]}"
             f"{' (dirty)' if meta.get('git_dirty') else ''} · {meta.get('date', '')} · "
             f"PostgreSQL {meta.get('pg_version', '')} · {NCPU} CPUs · "
             f"load avg at start {meta.get('loadavg_start', '')}", fontsize=7, color="#777")
    fig.tight_layout(rect=(0, 0.02, 1, 1), h_pad=2.0)
    path_png = os.path.splitext(path_svg)[0] + ".png"
    fig.savefig(path_svg, metadata={"Date": None})
    fig.savefig(path_png, dpi=110)
    plt.close(fig)
    return [os.path.basename(path_svg), os.path.basename(path_png)]


def report(meta: dict, out_dir: str) -> None:
    """Prints the tables and goals, and writes the files into out_dir."""
    header(meta)
    for r in (report_case1, report_case2, report_case3, report_case4, report_case5,
              report_case6, report_case7):
        r()
    goals(meta)
    write_csv(os.path.join(out_dir, "results.csv"))
    charts = write_chart(os.path.join(out_dir, "chart.svg"), meta, chart_panels())
    charts += write_chart(os.path.join(out_dir, "chart_insert.svg"), meta, insert_panels())
    with open(os.path.join(out_dir, "results.txt"), "w") as f:
        f.write("\n".join(OUTPUT).lstrip("\n") + "\n")
    with open(os.path.join(out_dir, "meta.json"), "w") as f:
        json.dump(meta, f, indent=2)
        f.write("\n")
    out()
    out(f"wrote {out_dir}/results.csv, {', '.join(charts) + ', ' if charts else ''}"
        "results.txt, meta.json")
