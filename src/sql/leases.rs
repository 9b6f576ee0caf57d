//! The registry's side of the lease protocol, in `leases.sql`: the block
//! table, the registry's incarnation, and the SECURITY DEFINER functions a
//! holder calls (`snowflake_lease_begin`, `_acquire`, `_renew`, `_release`).
//! The holder's side is `snowflake_core::holder`, driven by
//! `workers::lease_worker`.

pgrx::extension_sql_file!("leases.sql", name = "leases");
