//! Citus discovery: the coordinator of the cluster this node belongs to,
//! from the metadata in `snowflake_id.registry_database`.

use super::*;

/// The coordinator of the Citus cluster this node belongs to (from
/// `pg_dist_node`), `None` when it belongs to none, or why it cannot tell.
pub(super) fn citus_target() -> Result<Option<Target>, String> {
    let database = settings::registry_database().unwrap_or_default();
    let found = BackgroundWorker::transaction(|| {
        Spi::connect(
            |client| -> Result<Option<(String, i32, i64, String)>, pgrx::spi::Error> {
                let has_citus = !client
                    .select(
                        "SELECT 1 FROM pg_extension WHERE extname = 'citus'",
                        None,
                        &[],
                    )?
                    .is_empty();
                if !has_citus {
                    return Ok(None);
                }
                let rows = client.select(
                "SELECT (SELECT count(*) FROM pg_dist_node WHERE noderole = 'primary'), \
                        c.nodename::text, c.nodeport, (SELECT rolname::text FROM pg_roles WHERE oid = 10) \
                   FROM (SELECT 1) one \
                   LEFT JOIN LATERAL (SELECT nodename, nodeport FROM pg_dist_node \
                                       WHERE groupid = 0 AND noderole = 'primary' LIMIT 1) c ON true",
                None,
                &[],
            )?;
                let Some(row) = rows.into_iter().next() else {
                    return Ok(None);
                };
                let count: i64 = row.get(1)?.unwrap_or(0);
                let host: Option<String> = row.get(2)?;
                let port: Option<i32> = row.get(3)?;
                let user: String = row.get(4)?.unwrap_or_else(|| "postgres".into());
                Ok(Some((
                    host.unwrap_or_default(),
                    port.unwrap_or(0),
                    count,
                    user,
                )))
            },
        )
    });
    match found {
        Err(e) => Err(format!("Citus metadata could not be read: {e}")),
        // Citus is preloaded: never every worker id, unchecked.
        Ok(None) => Err(format!(
            "Citus is preloaded but database \"{database}\" (snowflake_id.registry_database) has no citus extension, so this server cannot tell which cluster it belongs to: set snowflake_id.registry_database to the database where CREATE EXTENSION citus ran, or set snowflake_id.registry"
        )),
        Ok(Some((_, _, 0, _))) => Ok(None),
        Ok(Some((host, _, _, _))) if host.is_empty() => Err(
            "Citus metadata has nodes but no coordinator: run SELECT citus_set_coordinator_host('<host>', <port>) on the coordinator, or set snowflake_id.registry"
                .into(),
        ),
        Ok(Some((host, port, _, user))) => Ok(Some(Target {
            // snowflake_id.registry_options last: its user, TLS and
            // passfile settings win.
            conninfo: format!(
                "host='{}' port={port} dbname='{}' user='{}' {}",
                conninfo_quote(&host),
                conninfo_quote(&database),
                conninfo_quote(&user),
                settings::registry_options()
            ),
            display: format!("\"Citus coordinator {host}:{port} dbname={database}\""),
            mode: MODE_CITUS,
        })),
    }
}
