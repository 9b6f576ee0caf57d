"""Case 4 - batch vs single: SELECT count(*) FROM snowflake_nextvals(n)
against snowflake_nextval() over generate_series (and the bare count)."""

from config import BATCH_N, REPS, log
from measure import R, series_query, settle_drift, timed_cpu

CASE = "4_batch"
LABELS = {"bare": "generate_series count (bare)",
          "single": "snowflake_nextval() over generate_series",
          "batch": "snowflake_nextvals(n)"}


def run(conns: dict, srv) -> None:
    conn = conns["main"]
    n = BATCH_N
    log(f"case 4: batch vs single, N={n:,}, {REPS} reps")
    qs = [("bare", series_query("g", n), False),
          ("single", series_query("snowflake_nextval()", n), True),
          ("batch", f"SELECT count(*) FROM snowflake_nextvals({n})", True)]
    for _, q, _ in qs:
        conn.execute(q.replace(str(n), "1000")).fetchall()
    secs = {k: [] for k, _, _ in qs}
    cpus = {k: [] for k, _, _ in qs}
    for rep in range(REPS):
        for k, q, sf in qs[rep % 3:] + qs[:rep % 3]:
            if sf:
                settle_drift(conn)
            wall, cpu = timed_cpu(conn, q)
            secs[k].append(wall)
            cpus[k].append(cpu)
    for k, _, _ in qs:
        R.add(CASE, LABELS[k], "ns_per_id", "ns",
              [s * 1e9 / n for s in secs[k]], f"N={n}")
        R.add(CASE, LABELS[k], "cpu_ns_per_id", "ns",
              [s * 1e9 / n for s in cpus[k]], f"N={n}", "CPU time of the backend")
    for k in ("single", "batch"):
        R.add(CASE, LABELS[k], "ns_per_id_above_bare", "ns",
              [(a - b) * 1e9 / n for a, b in zip(secs[k], secs["bare"])], f"N={n}")
        R.add(CASE, LABELS[k], "cpu_ns_per_id_above_bare", "ns",
              [(a - b) * 1e9 / n for a, b in zip(cpus[k], cpus["bare"])], f"N={n}",
              "CPU time of the backend")
    R.add(CASE, "single / batch", "ratio", "x",
          [a / b for a, b in zip(secs["single"], secs["batch"])], f"N={n}",
          "wall time of the single form over the batch form, per rep")
    R.add(CASE, "single / batch", "cpu_ratio", "x",
          [a / b for a, b in zip(cpus["single"], cpus["batch"])], f"N={n}",
          "CPU time of the single form over the batch form, per rep")
