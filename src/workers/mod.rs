//! Background workers, and the libpq client the lease worker talks through.
//!
//! - `registry_worker` the workers that keep the registry table of worker-id
//!   ranges, and its DDL
//! - `registry_backfill` the registry worker's part in backfill: grants into
//!   `snowflake_backfill_grants` and back, the set-aside ids' live history
//! - `lease_worker`    the worker that leases worker-id blocks from a
//!   registry server (the holder state machine is `snowflake_core::holder`)
//! - `registry_client` the lease worker's connection: libpq loaded at run
//!   time, non-blocking, waiting on the latch, each call bounded

pub mod lease_worker;
pub mod registry_backfill;
pub mod registry_client;
pub mod registry_worker;
