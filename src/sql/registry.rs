//! The registry table `snowflake_worker_registry` and its triggers, in
//! `registry.sql`; the registry worker (`workers::registry_worker`) keeps it.

use pgrx::extension_sql_file;

extension_sql_file!(
    "registry.sql",
    name = "snowflake_worker_registry",
    requires = [api::snowflake_advance_past, api::snowflake_from_timestamp]
);
