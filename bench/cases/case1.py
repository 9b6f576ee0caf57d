"""Case 1 - single session, per ID:
SELECT count(x) FROM (SELECT <expr> x FROM generate_series(1, N) g) s
for snowflake_nextval() and PostgreSQL's own generators, wall and CPU time,
and above the bare count of the same rep.

Then side by side (issue 33's form): the bare count, `clock_timestamp()`,
the floor (bench/floor/bench_floor.c: a C function that only reads the
clock, and one that adds a sequence) and `snowflake_nextval()`, in
RATIO_ROUNDS short interleaved rounds; the cost above the bare count is
each one's minimum over the rounds less the bare count's minimum (the
minimum: the run least disturbed by other work on the machine), and
snowflake's ratio to `clock_timestamp()` is what the goal reads."""

from config import N, N_JS53, RATIO_N, RATIO_ROUNDS, REPS, log
from measure import R, drift_state, series_query, settle_drift, timed_cpu

CASE = "1_single_session"
VARIANTS = [
    # key, label, expression, server, uses snowflake
    ("bare", "g (bare count)", "g", "main", False),
    ("random", "random()", "random()", "main", False),
    ("clock", "clock_timestamp()", "clock_timestamp()", "main", False),
    # The floor (bench/floor/bench_floor.c, when it could be built): a call
    # and a clock read, then with a per-backend sequence, and nothing else.
    ("floor", "bench_clock_ms()  C floor: a call, a clock read",
     "bench_clock_ms()", "main", False),
    ("floor_seq", "bench_clock_seq()  C floor: + a sequence",
     "bench_clock_seq()", "main", False),
    ("seq1", "nextval('s1')  CACHE 1", "nextval('s1')", "main", False),
    ("seq1000", "nextval('s1000')  CACHE 1000", "nextval('s1000')", "main", False),
    ("uuid", "gen_random_uuid()", "gen_random_uuid()", "main", False),
    ("snowflake", "snowflake_nextval()  classic", "snowflake_nextval()", "main", True),
    # The cheapest text form of a new ID (decimal): the floor under any
    # token, so that the token's own cost reads as the difference.
    ("text", "snowflake_nextval()::text", "snowflake_nextval()::text", "main", True),
    # Public IDs (issue 12): the token of each new ID; the main server's
    # snowflake_id.public_key_file holds config.PUBLIC_KEY.
    ("public", "snowflake_to_public(snowflake_nextval())",
     "snowflake_to_public(snowflake_nextval())", "main", True),
    ("bare_js53", "g (bare count, js53 server)", "g", "js53", False),
    ("snowflake_js53", "snowflake_nextval()  js53", "snowflake_nextval()", "js53", True),
]


FLOOR = ("floor", "floor_seq")
# The side-by-side rounds: these variants (keys of VARIANTS), RATIO_N rows.
SIDE_BY_SIDE = ("bare", "clock", "floor", "floor_seq", "snowflake")
CLOCK = "clock_timestamp()"


def present(conns: dict) -> list:
    """VARIANTS without the floor's rows when its functions are missing."""
    have = conns["main"].execute("SELECT to_regproc('bench_clock_ms') IS NOT NULL").fetchone()[0]
    return [v for v in VARIANTS if have or v[0] not in FLOOR]


def run(conns: dict, srv) -> None:
    variants = present(conns)
    run_reps(conns, variants)
    run_side_by_side(conns, [v for v in variants if v[0] in SIDE_BY_SIDE])


def run_reps(conns: dict, variants: list) -> None:
    log(f"case 1: single session, N={N:,} (js53: {N_JS53:,}), {REPS} reps")
    n_of = {k: (N_JS53 if s == "js53" else N) for k, _, _, s, _ in variants}
    for k, _, expr, s, _ in variants:  # warm-up: claims, caches, plans
        conns[s].execute(series_query(expr, min(n_of[k], 20_000))).fetchall()
    secs: dict[str, list[float]] = {k: [] for k, *_ in variants}
    cpus: dict[str, list[float]] = {k: [] for k, *_ in variants}
    drift_after: dict[str, list[float]] = {v[0]: [] for v in variants if v[4]}
    for rep in range(REPS):
        order = variants[rep % len(variants):] + variants[:rep % len(variants)]
        for k, _, expr, s, sf in order:
            c = conns[s]
            if sf:
                settle_drift(c)
            wall, cpu = timed_cpu(c, series_query(expr, n_of[k]))
            secs[k].append(wall)
            cpus[k].append(cpu)
            if sf:
                drift_after[k].append(drift_state(c)[0])
        log(f"  rep {rep + 1}/{REPS}: " + ", ".join(
            f"{k} {secs[k][-1] * 1e9 / n_of[k]:.0f}" for k, *_ in variants) + " ns/ID")
    for k, label, expr, s, sf in variants:
        n = n_of[k]
        base = "bare_js53" if s == "js53" else "bare"
        per = [x * 1e9 / n for x in secs[k]]
        R.add(CASE, label, "seconds", "s", secs[k], f"N={n}")
        R.add(CASE, label, "ns_per_id", "ns", per, f"N={n}")
        R.add(CASE, label, "cpu_ns_per_id", "ns",
              [x * 1e9 / n for x in cpus[k]], f"N={n}", "CPU time of the backend")
        if k != base:
            above = [(x - b) * 1e9 / n for x, b in zip(secs[k], secs[base])]
            R.add(CASE, label, "ns_per_id_above_bare", "ns",
                  above, f"N={n}", "paired with the bare count of the same rep")
            R.add(CASE, label, "cpu_ns_per_id_above_bare", "ns",
                  [(x - b) * 1e9 / n for x, b in zip(cpus[k], cpus[base])], f"N={n}",
                  "CPU time of the backend, paired with the bare count of the same rep")
        if sf:
            R.add(CASE, label, "drift_after_rep", "ms",
                  drift_after[k], f"N={n}",
                  "how far the last ID ran ahead of the clock (bound: snowflake_id.max_drift)")


def run_side_by_side(conns: dict, variants: list) -> None:
    """RATIO_ROUNDS rounds of each variant on RATIO_N rows, in a rotating
    order; per variant the minimum over the rounds, wall and CPU, and above
    the bare count's minimum; snowflake's and the floor's ratio to
    `clock_timestamp()` above bare."""
    c = conns["main"]
    log(f"case 1, side by side: {', '.join(v[1] for v in variants)}; "
        f"N={RATIO_N:,}, {RATIO_ROUNDS} interleaved rounds")
    wall: dict[str, list[float]] = {v[1]: [] for v in variants}
    cpu: dict[str, list[float]] = {v[1]: [] for v in variants}
    for rnd in range(RATIO_ROUNDS):
        order = variants[rnd % len(variants):] + variants[:rnd % len(variants)]
        for _, label, expr, _, sf in order:
            if sf:
                settle_drift(c)
            w, u = timed_cpu(c, series_query(expr, RATIO_N))
            wall[label].append(w * 1e9 / RATIO_N)
            cpu[label].append(u * 1e9 / RATIO_N)
    bare = variants[0][1]
    for basis, per in (("wall", wall), ("CPU", cpu)):
        floor = min(per[bare])
        for _, label, *_ in variants:
            R.add(CASE, label, f"side_{basis}_ns_per_id", "ns", per[label], f"N={RATIO_N}",
                  f"{basis} ns per ID in each of {RATIO_ROUNDS} interleaved rounds")
            if label != bare:
                R.add(CASE, label, f"side_{basis}_above_bare_min", "ns",
                      [min(per[label]) - floor], f"N={RATIO_N}",
                      f"minimum {basis} ns per ID over the rounds less the bare count's")
        # Paired by round: each round's cost above that round's bare count,
        # over clock_timestamp()'s in the same round; the median over the
        # rounds. Less at the mercy of one lucky round than the ratio of
        # minimums (whose denominator is one round's clock_timestamp()),
        # which the C floors show: they do what clock_timestamp() does.
        for _, label, *_ in variants:
            if label in (bare, CLOCK):
                continue
            paired = [(x - b) / (c - b) for x, b, c in
                      zip(per[label], per[bare], per[CLOCK]) if c - b > 0]
            if paired:
                R.add(CASE, label, f"side_{basis}_paired_ratio", "x", paired,
                      f"N={RATIO_N}", f"per round: {basis} above that round's bare count "
                      "over clock_timestamp()'s above it; the median is the figure")
        # A ratio only of costs that came out positive: with a minimum at or
        # below the bare count's, the rounds were noisier than the cost.
        clock = min(per[CLOCK]) - floor
        for _, label, *_ in variants:
            if label not in (bare, CLOCK) and clock > 0 and min(per[label]) > floor:
                R.add(CASE, label, f"side_{basis}_ratio_to_clock", "x",
                      [(min(per[label]) - floor) / clock], f"N={RATIO_N}",
                      f"above bare over clock_timestamp()'s above bare, minimum of {basis} "
                      "ns per ID over the rounds")
    log("  side by side, CPU ns/ID above bare (min): " + ", ".join(
        f"{v[1].split('  ')[0]} {min(cpu[v[1]]) - min(cpu[bare]):.1f}" for v in variants[1:]))
