//! The holder's `Registry`: the lease protocol's calls (one `jsonb`
//! request each) over the registry client's session.

use crate::settings;
use crate::workers::registry_client::Connection;
use serde::{Deserialize, Serialize};
use snowflake_core::holder::{
    AcquireRequest, CallError, Durability, DurabilityMode, Refusal, Registry, ReleaseReply,
    ReleaseRequest, RenewRequest, Reply,
};
use snowflake_core::lease::Timing;

/// SQLSTATE of a request beyond the registry's limits (0.7.0:
/// `snowflake_lease_limits`, checked by `snowflake_lease_check`).
const PROGRAM_LIMIT_EXCEEDED: &str = "54000";

/// The registry over a client session that took the node's lock.
pub(super) struct PgRegistry {
    pub(super) client: Connection,
    /// The schema of the registry's lease functions, quoted: the
    /// extension's schema up to 0.5.0, `snowflake_id_internal` from 0.6.0
    /// (`Worker::connect` finds it through the extension's membership).
    pub(super) schema: String,
    /// Whether the registry has `snowflake_lease_durable` (0.7.0 and
    /// later); an older one's grants are taken as committed ("unchecked").
    pub(super) durable_check: bool,
}

impl PgRegistry {
    fn call<T: for<'de> Deserialize<'de>>(
        &mut self,
        function: &str,
        req: &impl Serialize,
    ) -> Result<T, CallError> {
        let body = serde_json::to_string(req)
            .map_err(|e| CallError::unusable(format!("request not encoded: {e}")))?;
        let sql = format!("SELECT {}.{function}($1::jsonb)::text", self.schema);
        let answer = self.client.value(&sql, &[&body]).map_err(|e| match e {
            // The function or its schema is gone from where this session
            // found it: the registry's extension was updated (0.6.0 moved
            // the lease functions to snowflake_id_internal), or dropped and
            // created again. A new session looks them up again (connect:
            // `CallError::drops_session`); until it has, nothing is
            // renewed, and blocks stop at their deadline as for any
            // registry that does not answer.
            CallError::Refused(r) if r.functions_gone() => CallError::Refused(Refusal {
                message: format!(
                    "{} (the registry's lease functions are no longer in schema {}: its extension was updated or made again; reconnecting to find them)",
                    r.message, self.schema
                ),
                ..r
            }),
            // Beyond the registry's limits: its message names the limit and
            // the setting to lower; this server's own values go with it.
            CallError::Refused(r) if r.sqlstate.as_deref() == Some(PROGRAM_LIMIT_EXCEEDED) => {
                CallError::Refused(Refusal {
                    message: format!("{} [this server: {}]", r.message, own_settings()),
                    ..r
                })
            }
            e => e,
        })?;
        let text =
            answer.ok_or_else(|| CallError::unusable(format!("{function} answered nothing")))?;
        serde_json::from_str(&text).map_err(|e| {
            CallError::unusable(format!(
                "{function} answered what this server cannot read: {e}"
            ))
        })
    }
}

impl Registry for PgRegistry {
    fn acquire(&mut self, req: &AcquireRequest) -> Result<Reply, CallError> {
        self.call("snowflake_lease_acquire", req)
    }
    fn renew(&mut self, req: &RenewRequest) -> Result<Reply, CallError> {
        self.call("snowflake_lease_renew", req)
    }
    fn release(&mut self, req: &ReleaseRequest) -> Result<ReleaseReply, CallError> {
        self.call("snowflake_lease_release", req)
    }
    fn answer_by(&mut self, deadline_mono_ms: Option<i64>) {
        self.client.set_answer_by(deadline_mono_ms);
    }
    fn durable(&mut self, wait_ms: i64) -> Result<Durability, CallError> {
        if !self.durable_check {
            return Ok(Durability {
                durable: true,
                mode: DurabilityMode::Unchecked,
                ..Durability::default()
            });
        }
        self.call(
            "snowflake_lease_durable",
            &serde_json::json!({ "wait_ms": wait_ms }),
        )
    }
}

/// The settings of this server that its lease requests follow: what the
/// DBA compares with the registry's limits (`snowflake_lease_set_limits()`
/// there).
fn own_settings() -> String {
    let timing = Timing::new(settings::lease_time_ms());
    format!(
        "snowflake_id.lease_time = {} ms (grace {} ms), snowflake_id.max_drift = {} ms: marks up to {} ms ahead of its clock; snowflake_id.max_blocks = {}",
        timing.lease_ms,
        timing.grace_ms,
        settings::max_drift_ms(),
        timing.lease_ms.saturating_add(settings::max_drift_ms()),
        settings::max_blocks()
    )
}
