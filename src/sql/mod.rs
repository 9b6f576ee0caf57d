//! The SQL API.
//!
//! - `api`        generators, decoders, the monitoring functions and views
//! - `backfill`   `snowflake_at()` (IDs for past times) and `snowflake_backfill()`
//! - `backfill_fleet` backfill grants from a fleet's registry (`backfill_fleet.sql`)
//! - `health`     `snowflake_health()`: one row per check (the decisions: `snowflake_core::health`)
//! - `public_ids` `snowflake_to_public()` / `snowflake_from_public()`
//! - `tools`      SQL-language functions (`tools.sql`: decode row, convert a
//!   column, partitions) and COMMENTs
//! - `leases`     the registry's side of the lease protocol (`leases.sql`)
//! - `lease_lock` how long a lease call may keep the registry's locks
//! - `registry`   the table the registry worker keeps (`registry.sql`)
//!
//! The SQL objects are in `.sql` files next to the Rust that pulls them in
//! with `extension_sql_file!`: `internal_schema.sql` (first in the script),
//! `privileges.sql`, `workers_view.sql`, `registry.sql`, `leases.sql`,
//! `tools.sql`.
//!
//! The user-facing objects are in the extension's schema; the internal ones
//! (the lease protocol, trigger functions, the explicit-layout decoders'
//! checks) in `snowflake_id_internal`, which the extension script creates.

pub mod api;
pub mod backfill;
pub mod backfill_fleet;
pub mod health;
pub mod lease_lock;
pub mod leases;
pub mod public_ids;
pub mod registry;
pub mod tools;

use pgrx::spi::Spi;

// The internal schema, before every other object of the script.
pgrx::extension_sql_file!("internal_schema.sql", name = "internal_schema", bootstrap);

/// The extension's schema in this database, quoted for SQL text; `None`
/// when the extension is not created here. Needs a transaction.
pub fn extension_schema() -> Option<String> {
    Spi::get_one::<String>(
        "SELECT quote_ident(n.nspname) FROM pg_catalog.pg_extension e \
           JOIN pg_catalog.pg_namespace n ON n.oid = e.extnamespace \
          WHERE e.extname = 'snowflake_id'",
    )
    .ok()
    .flatten()
}
