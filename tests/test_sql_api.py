"""SQL API details a DBA meets (issue 13): snowflake_config() without
preloading, and the layout-changed error naming what changed."""
from __future__ import annotations

import psycopg
import pytest


def test_config_without_preload_says_not_preloaded(make_cluster):
    c = make_cluster(preload=False)
    c.create_extension()
    rows = c.sql("SELECT worker_ids, worker_ids_total, worker_ids_held, worker_ids_free, "
                 "my_worker_id FROM snowflake_config()")
    assert rows == [("not preloaded", None, None, None, None)]


def test_layout_changed_error_names_the_settings_recorded_vs_now(make_cluster):
    c = make_cluster(create_extension=True)
    assert c.scalar("SELECT snowflake_nextval()") > 0
    c.configure(**{"snowflake_id.layout": "js53"})
    c.restart()
    with c.connect() as conn:
        with pytest.raises(psycopg.Error) as ei:
            conn.execute("SELECT snowflake_nextval()")
    e = ei.value
    assert e.sqlstate == "55000"
    detail = e.diag.message_detail or ""
    assert ("Changed: snowflake_id.total_bits 63 (recorded) vs 53 (now); "
            "snowflake_id.worker_bits 10 (recorded) vs 6 (now); "
            "snowflake_id.sequence_bits 12 (recorded) vs 6 (now).") in detail, detail
    assert "epoch" not in detail and "time_unit_ms" not in detail, detail
