//! The SQL API.
//!
//! - `api`        generators, decoders, the monitoring functions and views
//! - `public_ids` `snowflake_to_public()` / `snowflake_from_public()`
//! - `tools`      SQL-language functions (`tools.sql`: decode row, convert a
//!   column, partitions) and COMMENTs
//! - `leases`     the registry's side of the lease protocol (`leases.sql`)

pub mod api;
pub mod leases;
pub mod public_ids;
pub mod tools;
