"""What the cases share: the results store (every metric with its per-rep
values), timing of one statement (wall and the backend's CPU time), and the
drift of a backend's IDs ahead of the clock."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

import psycopg


# -------------------------------------------------------------------- results
def summarize(values: list[float]) -> dict:
    v = sorted(values)
    med = statistics.median(v)
    if len(v) >= 2:
        q = statistics.quantiles(v, n=4, method="inclusive")
        p25, p75 = q[0], q[2]
    else:
        p25 = p75 = med
    return {"median": med, "min": v[0], "max": v[-1], "p25": p25, "p75": p75,
            "reps": len(v)}


@dataclass
class Metric:
    case: str
    variant: str
    metric: str
    unit: str
    values: list
    params: str = ""
    note: str = ""
    value: float | None = None  # the figure reported, when not the median

    @property
    def s(self) -> dict:
        return summarize(self.values)


@dataclass
class Results:
    metrics: list = field(default_factory=list)
    # case -> 1-minute load average at its start and end, duration
    case_info: dict = field(default_factory=dict)

    def add(self, case, variant, metric, unit, values, params="", note="", value=None):
        m = Metric(case, variant, metric, unit, list(values), params, note, value)
        self.metrics.append(m)
        return m

    def get(self, case, variant, metric) -> Metric | None:
        for m in self.metrics:
            if (m.case, m.variant, m.metric) == (case, variant, metric):
                return m
        return None


R = Results()  # the run's results: the cases add, bench/report.py reads


# ---------------------------------------------------------------- measurement
def backend_cpu_ns(conn: psycopg.Connection) -> int | None:
    """CPU time the connection's backend has run so far, in ns: the first
    field of /proc/<pid>/schedstat (the server runs on this machine)."""
    try:
        with open(f"/proc/{conn.info.backend_pid}/schedstat") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def timed_cpu(conn: psycopg.Connection, query: str) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the backend) for one statement over a
    warm connection (unix socket; the round trip is ~0.1 ms, noise next to
    the runs).

    Wall time is what a client sees, but on a machine busy with other work it
    also counts the time the backend waited for a CPU. The backend's CPU time
    does not, so it is the steadier estimate of the work per ID (it leaves
    out sleeping and I/O waits, e.g. js53 waiting for the clock)."""
    c0 = backend_cpu_ns(conn)
    t0 = time.perf_counter()
    cur = conn.execute(query)
    if cur.description is not None:
        cur.fetchall()
    wall = time.perf_counter() - t0
    c1 = backend_cpu_ns(conn)
    return wall, ((c1 - c0) / 1e9 if c0 is not None and c1 is not None else float("nan"))


def drift_state(conn) -> tuple[int, int]:
    """(current drift in ms, ticks exhausted so far) of this backend's worker."""
    row = conn.execute(
        "SELECT current_drift_ms, sequence_exhausted FROM snowflake_worker_status() "
        "WHERE pid = pg_backend_pid()").fetchone()
    return (int(row[0]), int(row[1])) if row else (0, 0)


def settle_drift(conn, limit_s: float = 10.0) -> None:
    """Waits until this backend's IDs no longer run ahead of the clock, so
    that every snowflake rep starts from the same state (no borrowed ticks)."""
    deadline = time.monotonic() + limit_s
    while True:
        drift, _ = drift_state(conn)
        if drift <= 0 or time.monotonic() > deadline:
            return
        time.sleep(min(drift / 1000 + 0.005, 1.0))


def series_query(expr: str, n: int) -> str:
    return f"SELECT count(x) FROM (SELECT {expr} x FROM generate_series(1, {n}) g) s"
