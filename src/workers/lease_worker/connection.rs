//! The lease worker's connection to the registry: connect, introduce this
//! node (its id, name and layout), take the node's lock, and end this
//! worker's own earlier session if a network break left it behind.

use super::*;

impl Worker {
    /// Connects, finds the schema of the registry's lease functions and
    /// introduces this node.
    pub(super) fn connect(&mut self) {
        let Some(target) = self.file.target.clone() else {
            return;
        };
        // Names resolve in pg_catalog only: the session may be a
        // superuser's, and other roles may create objects on the
        // registry's default search_path. Grants are durable before the
        // holder uses them, whatever the registry's default.
        let options = "-c statement_timeout=10s -c lock_timeout=5s -c search_path=pg_catalog,pg_temp -c synchronous_commit=on";
        let connected = Connection::connect(
            &target.conninfo,
            "snowflake_id lease",
            options,
            self.next_host,
        );
        let mut client = match connected {
            Ok((client, host)) => {
                self.host_index = Some(host);
                client
            }
            Err(e) => {
                self.unreachable(format!(
                    "could not connect to {}: {}",
                    target.display,
                    call_error_text(&e)
                ));
                return;
            }
        };
        // Where the lease functions are: the schema of the extension's
        // member snowflake_lease_begin(jsonb), found through the
        // extension's membership (pg_depend, deptype 'e'), not by name on
        // a search_path. A 0.4.0 or 0.5.0 registry has it in the
        // extension's schema, 0.6.0 and later in snowflake_id_internal;
        // every call below names that schema.
        let found = client.query(
            "SELECT f.schema, f.usable, \
                    has_database_privilege('public', current_database(), 'CONNECT'), \
                    quote_ident(current_user), f.durable \
               FROM pg_extension e \
               LEFT JOIN LATERAL ( \
                    SELECT quote_ident(n.nspname) AS schema, \
                           has_schema_privilege(n.oid, 'USAGE') AS usable, \
                           EXISTS (SELECT 1 FROM pg_proc q WHERE q.pronamespace = n.oid \
                                      AND q.proname = 'snowflake_lease_durable') AS durable \
                      FROM pg_depend d \
                      JOIN pg_proc p ON p.oid = d.objid \
                      JOIN pg_namespace n ON n.oid = p.pronamespace \
                     WHERE d.classid = 'pg_proc'::regclass \
                       AND d.refclassid = 'pg_extension'::regclass \
                       AND d.refobjid = e.oid AND d.deptype = 'e' \
                       AND p.proname = 'snowflake_lease_begin' AND p.pronargs = 1 \
                       AND p.proargtypes[0] = 'jsonb'::regtype \
                     LIMIT 1) f ON true \
              WHERE e.extname = 'snowflake_id'",
            &[],
        );
        let durable_check: bool;
        let schema: String = match found.map(|rows| rows.into_iter().next()) {
            Ok(Some(row)) => {
                let column = |i: usize| row.get(i).cloned().flatten();
                let (Some(schema), usable) = (column(0), column(1)) else {
                    self.unreachable(format!(
                        "the snowflake_id extension at {} predates this server's (0.4.0 fences leases): run ALTER EXTENSION snowflake_id UPDATE there",
                        target.display
                    ));
                    return;
                };
                if usable.as_deref() != Some("t") {
                    let role = column(3).unwrap_or_default();
                    self.unreachable(format!(
                        "the role {role} may not use schema {schema} at {}, which holds the lease functions: run GRANT USAGE ON SCHEMA {schema} TO {role} there (with EXECUTE on its snowflake_lease_* functions), or connect as a superuser",
                        target.display
                    ));
                    return;
                }
                // 0.7.0 and later: grants are checked durable on the
                // registry's standbys (snowflake_lease_durable).
                durable_check = column(4).as_deref() == Some("t");
                if column(2).as_deref() == Some("t") && !self.public_warned {
                    self.public_warned = true;
                    pgrx::warning!(
                        "snowflake_id lease: every role may connect to the registry database at {}: any role that can log in there sees this server's lock keys in pg_locks and can take them, holding up its leases",
                        target.display
                    );
                }
                schema
            }
            Ok(None) => {
                self.unreachable(format!(
                    "{} has no snowflake_id extension: run CREATE EXTENSION snowflake_id in that database",
                    target.display
                ));
                return;
            }
            Err(e) => {
                self.unreachable(format!("{}: {}", target.display, call_error_text(&e)));
                return;
            }
        };
        // The node id's session lock: taken by a live session means a copy
        // of this data directory (or its original) is running, unless that
        // session is this worker's own earlier one, left behind by a broken
        // connection.
        let mut lingering = self.registry_session.take();
        // Blocks leased in that session stay this server's in the next one
        // (the registry lets a session it cannot tie to the node's earlier
        // one take them only after their lease and grace ran out).
        self.holder.previous_session = lingering
            .map(|(pid, start)| format!("{pid}:{start}"))
            .unwrap_or_default();
        let mut renamed = false;
        loop {
            let node = self.holder.id.node.clone();
            let hello = client.value(
                &format!("SELECT {schema}.snowflake_lease_hello($1)"),
                &[&node],
            );
            match hello {
                Ok(Some(t)) if t == "t" => break,
                Ok(_) if lingering.is_some_and(|old| self.end_lingering(&mut client, old)) => {
                    lingering = None;
                }
                Ok(_) if !renamed => {
                    lingering = None;
                    renamed = true;
                    let old = std::mem::replace(&mut self.holder.id.node, new_node_id());
                    pgrx::log!(
                        "snowflake_id lease: node id {old} is in use by another running server (this data directory is a copy of it, or it of this one): this server is now node {} and leases its own worker ids",
                        self.holder.id.node
                    );
                    self.header.lease.node_id.set(&self.holder.id.node);
                    let mut host = ShmHost::new(self.header, &self.layout, &mut self.file);
                    self.holder.forget_all(&mut host);
                    self.saved_provable = false;
                    self.persist();
                }
                Ok(_) => {
                    self.unreachable("the registry refused a fresh node id".into());
                    return;
                }
                Err(e) => {
                    self.unreachable(format!("{}: {}", target.display, call_error_text(&e)));
                    return;
                }
            }
        }
        let session = client.query(
            "SELECT pg_backend_pid()::text, \
                    (SELECT (extract(epoch FROM backend_start) * 1000000)::int8::text \
                       FROM pg_stat_activity WHERE pid = pg_backend_pid())",
            &[],
        );
        match session {
            Ok(rows) => {
                self.registry_session = rows.into_iter().next().and_then(|row| {
                    let pid = row.first().cloned().flatten()?.parse().ok()?;
                    let start = row.get(1).cloned().flatten()?.parse().ok()?;
                    Some((pid, start))
                });
            }
            Err(e) => {
                self.unreachable(format!("{}: {}", target.display, call_error_text(&e)));
                return;
            }
        }
        self.client = Some(PgRegistry {
            client,
            schema,
            durable_check,
        });
        self.connect_backoff_ms = 0;
        self.unreachable = false;
        self.header.lease.unreachable_since_ms.store(0, Release);
        self.clear_problem();
        // Renew at once: confirms the leases held before a restart or an
        // outage, and drops those handed to another server since.
        self.holder.reconnected();
    }

    /// Ends `old`, this worker's earlier registry session, if it is still
    /// there (same pid and start, so not a reused pid): true when it ended,
    /// and with it its hold on the node id and the blocks' locks.
    pub(super) fn end_lingering(&mut self, client: &mut Connection, old: (i32, i64)) -> bool {
        let ended = client.value(
            "SELECT coalesce(bool_or(pg_terminate_backend(pid, 5000)), false) \
               FROM pg_stat_activity \
              WHERE pid = $1::int AND (extract(epoch FROM backend_start) * 1000000)::int8 = $2::int8",
            &[&old.0.to_string(), &old.1.to_string()],
        );
        match ended {
            Ok(Some(t)) if t == "t" => {
                pgrx::log!(
                    "snowflake_id lease: ended this server's earlier session on {} (pid {}), left behind by a broken connection, to take back node id {}",
                    self.display(),
                    old.0,
                    self.holder.id.node
                );
                true
            }
            Ok(_) => false,
            Err(e) => {
                pgrx::log!(
                    "snowflake_id lease: could not end this server's earlier session on {} (pid {}): {}",
                    self.display(),
                    old.0,
                    call_error_text(&e)
                );
                false
            }
        }
    }
}
