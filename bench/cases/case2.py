"""Case 2 - bulk load: INSERT INTO t SELECT FROM generate_series(1, N) into
an UNLOGGED table keyed by each generator; seconds, ns per row and the
ratio to bigserial (per rep), wall and CPU time."""

from config import N, REPS, log
from measure import R, settle_drift, timed_cpu

CASE = "2_bulk_load"
VARIANTS = [
    # label, table, its column
    ("bigserial", "bulk_bigserial", "id bigserial PRIMARY KEY"),
    ("bigint + sequence CACHE 1000", "bulk_seq1000",
     "id bigint PRIMARY KEY DEFAULT nextval('bulk_s1000')"),
    ("uuid gen_random_uuid()", "bulk_uuid", "id uuid PRIMARY KEY DEFAULT gen_random_uuid()"),
    ("bigint snowflake_nextval()", "bulk_snowflake",
     "id bigint PRIMARY KEY DEFAULT snowflake_nextval()"),
]


def run(conns: dict, srv) -> None:
    conn = conns["main"]
    log(f"case 2: bulk load of {N:,} rows into UNLOGGED tables, {REPS} reps")
    conn.execute("CREATE UNLOGGED SEQUENCE bulk_s1000 CACHE 1000")
    for _, t, cols in VARIANTS:
        conn.execute(f"CREATE UNLOGGED TABLE {t} ({cols})")
    for _, t, _ in VARIANTS:  # warm-up
        conn.execute(f"INSERT INTO {t} SELECT FROM generate_series(1, 10000)")
        conn.execute(f"TRUNCATE {t}")
    secs = {t: [] for _, t, _ in VARIANTS}
    cpus = {t: [] for _, t, _ in VARIANTS}
    for rep in range(REPS):
        order = VARIANTS[rep % len(VARIANTS):] + VARIANTS[:rep % len(VARIANTS)]
        for label, t, _ in order:
            conn.execute(f"TRUNCATE {t}")
            if t == "bulk_snowflake":
                settle_drift(conn)
            wall, cpu = timed_cpu(conn, f"INSERT INTO {t} SELECT FROM generate_series(1, {N})")
            secs[t].append(wall)
            cpus[t].append(cpu)
        for _, t, _ in VARIANTS:
            conn.execute(f"TRUNCATE {t}")
        log(f"  rep {rep + 1}/{REPS}: " + ", ".join(
            f"{t} {secs[t][-1]:.2f}s" for _, t, _ in VARIANTS))
    for label, t, _ in VARIANTS:
        R.add(CASE, label, "seconds", "s", secs[t], f"N={N}")
        R.add(CASE, label, "ratio_to_bigserial", "x",
              [a / b for a, b in zip(secs[t], secs["bulk_bigserial"])], f"N={N}",
              "per rep, paired")
        R.add(CASE, label, "ns_per_row", "ns",
              [s * 1e9 / N for s in secs[t]], f"N={N}")
        R.add(CASE, label, "cpu_seconds", "s", cpus[t], f"N={N}",
              "CPU time of the backend")
        R.add(CASE, label, "cpu_ratio_to_bigserial", "x",
              [a / b for a, b in zip(cpus[t], cpus["bulk_bigserial"])], f"N={N}",
              "CPU time of the backend, per rep, paired")
