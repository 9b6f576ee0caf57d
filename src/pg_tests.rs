//! `#[pg_test]`s: each runs inside a server that preloads the extension
//! (see `pg_test::postgresql_conf_options` in lib.rs).

#[pgrx::pg_schema]
mod tests {
    use pgrx::pg_sys::panic::CaughtError;
    use pgrx::prelude::*;

    /// The SQLSTATE a statement fails with, or None when it succeeds.
    fn sqlstate_of(sql: &'static str) -> Option<String> {
        PgTryBuilder::new(|| {
            Spi::run(sql).expect("SPI error other than an ereport");
            None
        })
        .catch_others(|e| match e {
            CaughtError::PostgresError(r)
            | CaughtError::ErrorReport(r)
            | CaughtError::RustPanic { ereport: r, .. } => {
                let code = r.sql_error_code() as i32;
                // Unpack PostgreSQL's 6-bit-per-character SQLSTATE encoding.
                let text: String = (0..5)
                    .map(|i| (((code >> (6 * i)) & 0x3F) as u8 + b'0') as char)
                    .collect();
                Some(text)
            }
        })
        .execute()
    }

    fn one<T: IntoDatum + FromDatum>(sql: &str) -> T {
        Spi::get_one::<T>(sql)
            .expect("query failed")
            .expect("query returned NULL")
    }

    #[pg_test]
    fn column_default_fills_distinct_increasing_ids() {
        Spi::run(
            "CREATE TABLE orders (id bigint PRIMARY KEY DEFAULT snowflake_nextval(), item text);
             INSERT INTO orders (item) SELECT 'item ' || g FROM generate_series(1, 1000) g;",
        )
        .unwrap();
        assert_eq!(one::<i64>("SELECT count(DISTINCT id) FROM orders"), 1000);
        // Rows were inserted in item order, so IDs must increase with it.
        assert_eq!(
            one::<i64>(
                "SELECT count(*) FROM (SELECT id, lag(id) OVER (ORDER BY substr(item, 6)::int) p
                   FROM orders) s WHERE id <= p"
            ),
            0
        );
    }

    #[pg_test]
    fn decode_of_a_fresh_id_gives_now_my_worker_and_a_sequence_in_range() {
        Spi::run("CREATE TEMP TABLE d AS SELECT * FROM snowflake_decode(snowflake_nextval())")
            .unwrap();
        let skew_ms: f64 =
            one("SELECT abs(extract(epoch FROM (clock_timestamp() - ts)) * 1000)::float8 FROM d");
        assert!(skew_ms < 1000.0, "decoded time is {skew_ms} ms from now");
        let worker: i32 = one("SELECT worker_id FROM d");
        let mine: i32 = one("SELECT my_worker_id FROM snowflake_config()");
        assert_eq!(worker, mine);
        assert!(one::<bool>(
            "SELECT sequence BETWEEN 0 AND (SELECT max_sequence FROM snowflake_layout()) FROM d"
        ));
        // snowflake_timestamp agrees with snowflake_decode.
        assert!(one::<bool>(
            "WITH i AS (SELECT snowflake_nextval() id)
             SELECT snowflake_timestamp(id) = (SELECT ts FROM snowflake_decode(id)) FROM i"
        ));
    }

    #[pg_test]
    fn a_million_ids_in_one_statement_are_distinct_and_strictly_increasing() {
        Spi::run(
            "CREATE TEMP TABLE m AS
             SELECT g, snowflake_nextval() AS id FROM generate_series(1, 1000000) g",
        )
        .unwrap();
        assert_eq!(one::<i64>("SELECT count(DISTINCT id) FROM m"), 1_000_000);
        assert_eq!(
            one::<i64>(
                "SELECT count(*) FROM (SELECT id, lag(id) OVER (ORDER BY g) p FROM m) s WHERE id <= p"
            ),
            0
        );
    }

    #[pg_test]
    fn negative_id_is_22003() {
        assert_eq!(
            sqlstate_of("SELECT * FROM snowflake_decode(-1)").as_deref(),
            Some("22003")
        );
        assert_eq!(
            sqlstate_of("SELECT snowflake_timestamp(-42)").as_deref(),
            Some("22003")
        );
    }

    #[pg_test]
    fn functions_are_labelled_for_what_they_are() {
        let label = |f: &str| -> String {
            Spi::get_one::<String>(&format!(
                "SELECT provolatile::text || proparallel::text || proisstrict::text
                   FROM pg_proc WHERE proname = '{f}'"
            ))
            .unwrap()
            .unwrap()
        };
        // volatile, parallel unsafe
        assert_eq!(&label("snowflake_nextval")[..2], "vu");
        assert_eq!(&label("snowflake_nextvals")[..2], "vu");
        // stable (the layout can change at a restart), parallel safe, strict
        for f in [
            "snowflake_decode",
            "snowflake_timestamp",
            "snowflake_from_timestamp",
            "snowflake_compose",
        ] {
            assert_eq!(label(f), "sstrue", "{f}");
        }
    }

    #[pg_test]
    fn claim_is_visible_in_pg_locks_and_the_workers_view() {
        let worker: i64 = one("SELECT snowflake_nextval()");
        let worker = one::<i32>(&format!("SELECT worker_id FROM snowflake_decode({worker})"));
        assert_eq!(
            one::<i64>(&format!(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND database = 0
                   AND classid = 1397641047 AND objid = {worker} AND objsubid = 3
                   AND pid = pg_backend_pid() AND granted AND mode = 'ShareLock'"
            )),
            1
        );
        assert!(one::<bool>(&format!(
            "SELECT pid = pg_backend_pid() AND ids_issued >= 1 AND database = current_database()
                    AND sessions = 1 AND shared_claims = 0
               FROM snowflake_workers WHERE worker_id = {worker}"
        )));
    }
}
