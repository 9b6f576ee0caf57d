//! Where leases come from: the registry of `snowflake_id.registry`,
//! switching to another target (a registry, a Citus coordinator, or this
//! server's own worker ids), and connection strings as messages show them.

use super::host::{set_all_limits, ShmHost};
use super::{Target, Worker};

use crate::settings;
use crate::shmem::{LeaseMode, MODE_REGISTRY, NO_LEASE};
use crate::workers::registry_client;
use std::sync::atomic::Ordering::{Relaxed, Release};

/// The registry set in `snowflake_id.registry`, if any.
pub(super) fn configured_target() -> Option<Target> {
    settings::registry().map(|registry| Target {
        display: redact(&registry),
        conninfo: registry,
        mode: MODE_REGISTRY,
    })
}

impl Worker {
    /// Switches to `target` (`None`: this server's own worker_ids).
    pub(super) fn set_target(&mut self, target: Option<Target>) {
        if self.file.target == target && self.header.lease.mode(Relaxed) != LeaseMode::Undecided {
            return;
        }
        // Another registry: nothing held from the old one is used again.
        let mut host = ShmHost::new(self.header, &self.layout, &mut self.file);
        self.holder.forget_all(&mut host);
        self.client = None;
        // Whether the old registry answered says nothing of the new one.
        self.problems.target_changed();
        self.report(Vec::new());
        self.registry_session = None;
        self.host_index = None;
        self.next_host = 0;
        self.saved_provable = false;
        let lease = &self.header.lease;
        match &target {
            Some(t) => {
                lease.registry.set(&t.display);
                lease.coordinator.set(if t.mode == MODE_REGISTRY {
                    ""
                } else {
                    &t.conninfo
                });
                if lease.mode(Relaxed) == LeaseMode::Local {
                    set_all_limits(self.header, NO_LEASE);
                }
                lease.set_mode(
                    LeaseMode::try_from(t.mode).unwrap_or(LeaseMode::Undecided),
                    Release,
                );
                pgrx::log!("snowflake_id lease: leasing worker ids from {}", t.display);
            }
            None => {
                lease.registry.set("");
                lease.coordinator.set("");
                set_all_limits(self.header, i64::MAX);
                lease.set_mode(LeaseMode::Local, Release);
            }
        }
        self.file.target = target;
        self.persist();
    }
}

/// A connection string without its password, for messages: its hosts,
/// ports and database as libpq reads them.
pub(crate) fn redact(conninfo: &str) -> String {
    match registry_client::parse_conninfo(conninfo) {
        Ok(options) => {
            let get = |key: &str| {
                options
                    .iter()
                    .find(|(k, v)| k == key && !v.is_empty())
                    .map(|(_, v)| v.clone())
            };
            format!(
                "\"host={} port={} dbname={}\"",
                get("host")
                    .or_else(|| get("hostaddr"))
                    .unwrap_or_else(|| "(default)".into()),
                get("port").unwrap_or_else(|| "5432".into()),
                get("dbname").unwrap_or_else(|| "(user name)".into())
            )
        }
        Err(_) => "(an invalid connection string)".into(),
    }
}

/// A value for a single-quoted libpq connection-string value.
pub(super) fn conninfo_quote(value: &str) -> String {
    value.replace('\\', "\\\\").replace('\'', "\\'")
}
