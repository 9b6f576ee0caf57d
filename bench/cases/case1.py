"""Case 1 - single session, per ID:
SELECT count(x) FROM (SELECT <expr> x FROM generate_series(1, N) g) s
for snowflake_nextval() and PostgreSQL's own generators, wall and CPU time,
and above the bare count of the same rep."""

from config import N, N_JS53, REPS, log
from measure import R, drift_state, series_query, settle_drift, timed_cpu

CASE = "1_single_session"
VARIANTS = [
    # key, label, expression, server, uses snowflake
    ("bare", "g (bare count)", "g", "main", False),
    ("random", "random()", "random()", "main", False),
    ("clock", "clock_timestamp()", "clock_timestamp()", "main", False),
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


def run(conns: dict, srv) -> None:
    log(f"case 1: single session, N={N:,} (js53: {N_JS53:,}), {REPS} reps")
    n_of = {k: (N_JS53 if s == "js53" else N) for k, _, _, s, _ in VARIANTS}
    for k, _, expr, s, _ in VARIANTS:  # warm-up: claims, caches, plans
        conns[s].execute(series_query(expr, min(n_of[k], 20_000))).fetchall()
    secs: dict[str, list[float]] = {k: [] for k, *_ in VARIANTS}
    cpus: dict[str, list[float]] = {k: [] for k, *_ in VARIANTS}
    drift_after: dict[str, list[float]] = {v[0]: [] for v in VARIANTS if v[4]}
    for rep in range(REPS):
        order = VARIANTS[rep % len(VARIANTS):] + VARIANTS[:rep % len(VARIANTS)]
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
            f"{k} {secs[k][-1] * 1e9 / n_of[k]:.0f}" for k, *_ in VARIANTS) + " ns/ID")
    for k, label, expr, s, sf in VARIANTS:
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
