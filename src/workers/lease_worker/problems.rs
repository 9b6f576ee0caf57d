//! What keeps the lease worker from leasing, and what the holder did: the
//! texts of the problems and events. Which problem is current, when it is
//! logged and ended, since when the registry has not answered and the
//! pause before connecting again are `snowflake_core::holder::problems`'
//! to decide; this logs what it returns and publishes its state for
//! `snowflake_config()`.

use super::Worker;

use snowflake_core::holder::problems::{At, Cause, Log, Problem};
use snowflake_core::holder::{Durability, DurabilityMode, Event, Replication};
use snowflake_core::layout::format_unix_ms;
use std::sync::atomic::Ordering::Release;

/// Reporting: the worker's problems (`snowflake_core::holder::problems`
/// decides; this logs what it returns and publishes its state), and the
/// holder's events.
impl Worker {
    /// Logs `logs` and publishes the problem and since when the registry
    /// has not answered.
    pub(super) fn report(&mut self, logs: Vec<Log>) {
        for log in logs {
            match log {
                Log::Warning(text) => pgrx::warning!("snowflake_id lease: {text}"),
                Log::Info(text) => pgrx::log!("snowflake_id lease: {text}"),
            }
        }
        let lease = &self.header.lease;
        lease.problem.set(self.problems.text());
        lease
            .unreachable_since_ms
            .store(self.problems.unreachable_since_ms().unwrap_or(0), Release);
    }

    pub(super) fn set_problem(&mut self, cause: Cause, text: String) {
        let logs = self.problems.set(Problem::new(cause, text));
        self.report(logs);
    }

    /// The clocks and the schedule, for the problems' state machine.
    pub(super) fn at(&self) -> At {
        At {
            mono_ms: self.mono_ms(),
            wall_ms: crate::clock::unix_ms(),
            renew_every_ms: self.timing().renew_every_ms,
        }
    }

    /// Logs what the holder did.
    pub(super) fn report_events(&mut self) {
        let display = self.display();
        for event in self.holder.take_events() {
            match event {
                Event::Leased { block, floor_ms } => {
                    let floor = if floor_ms > 0 {
                        format!("its IDs start above {}", format_unix_ms(floor_ms))
                    } else {
                        "never used before".to_string()
                    };
                    pgrx::log!("snowflake_id lease: leased block {block} from {display}; {floor}");
                }
                Event::Expired { block } => pgrx::log!(
                    "snowflake_id lease: the lease of block {block} ran out before a renewal; its worker ids are no longer used here"
                ),
                Event::Lost { block } => pgrx::log!(
                    "snowflake_id lease: block {block} is no longer leased to this server (its lease expired at the registry, or the registry did not confirm it); its worker ids are no longer used here"
                ),
                Event::Released { block } => {
                    pgrx::log!("snowflake_id lease: gave idle block {block} back")
                }
                Event::NewIncarnation { old, new } if !old.is_empty() => pgrx::log!(
                    "snowflake_id lease: the registry {display} began a new incarnation ({new}, was {old}): it may have forgotten grants (a failover, a restore, an emptied lease table); this server re-asserts the blocks it holds"
                ),
                Event::NewIncarnation { .. } => {}
                Event::Rollback { seen, reply, seen_grants, reply_grants } => {
                    let what = if reply_grants < seen_grants {
                        format!("with a grant count of {reply_grants}, below {seen_grants} seen before (at WAL position {reply})")
                    } else {
                        format!("from WAL position {reply}, below {seen} seen before")
                    };
                    self.set_problem(Cause::Other, format!(
                        "the registry {display} answered {what}: it went back in time; its answer is not used"
                    ))
                }
                Event::Fenced { until_ms } => self.set_problem(Cause::Other, format!(
                    "the registry {display} is fenced until {} (a new incarnation after it may have forgotten grants): it leases no block anew until then",
                    format_unix_ms(until_ms)
                )),
                Event::Refused(text) => self.set_problem(
                    Cause::Refused,
                    format!("the registry {display} refused a call: {text}"),
                ),
                Event::NoFreeBlock => self.set_problem(Cause::Other, format!(
                    "the registry {display} has no free block of worker ids for this server (snowflake_id.worker_ids limits which it may lease)"
                )),
                Event::NotDurable {
                    what,
                    durability,
                    required,
                } => self.set_problem(
                    Cause::NotDurable,
                    not_durable_text(&display, what, &durability, required),
                ),
                Event::DurableAgain => {
                    let logs = self.problems.durable_again(&display);
                    self.report(logs);
                }
                Event::DurabilityMode { mode } => match mode {
                    DurabilityMode::Synchronous => pgrx::log!(
                        "snowflake_id lease: grants from the registry {display} are used once its synchronous standbys have them"
                    ),
                    DurabilityMode::Asynchronous => pgrx::warning!(
                        "snowflake_id lease: the registry {display} names no synchronous standby but has standbys streaming: a grant is used once flushed there alone, and a failover to a standby fences the fleet (set synchronous_standby_names on the registry, or snowflake_id.lease_replication = synchronous here to insist)"
                    ),
                    DurabilityMode::Unchecked => pgrx::warning!(
                        "snowflake_id lease: the snowflake_id extension at the registry {display} cannot say whether a grant reached its standbys (it predates 0.7.0): a grant is used once committed there; run ALTER EXTENSION snowflake_id UPDATE there"
                    ),
                    DurabilityMode::Local => {}
                },
            }
        }
    }
}

/// The problem text of a grant that is not durable: what is wrong and what
/// to do.
fn not_durable_text(display: &str, what: &str, d: &Durability, required: Replication) -> String {
    // Candidates behind matter once synchronous_standby_names is satisfied
    // (before that, the standbys it names are what to look at).
    if !d.behind.is_empty()
        && d.flushed >= d.needed
        && (d.mode == DurabilityMode::Synchronous || required == Replication::Auto)
    {
        if d.behind.iter().any(|b| b == "*") {
            return format!(
                "a {what} from the registry {display} is committed there (WAL position {}), but its extension was made anew under a synchronous_standby_names with *: a standby it cannot name may hold a row of the registry dropped before that makes it a failover candidate, so no grant is used until about 45 s after CREATE EXTENSION; wait, or list the standbys by name in synchronous_standby_names there",
                d.lsn
            );
        }
        return format!(
            "a {what} from the registry {display} is committed there but not yet on {} (failover candidates that a promotion trusts to have every durable grant; WAL position {}): it is not used until they have it or, about 45 s after they fell behind, stop being candidates; check the registry's standbys (pg_stat_replication there)",
            d.behind.join(", "),
            d.lsn
        );
    }
    match (d.mode, required) {
        (DurabilityMode::Synchronous, _) => format!(
            "a {what} from the registry {display} is committed there but not on its synchronous standbys ({} of {} flushed WAL position {}): it is not used, and this server keeps what it holds until it is; check the registry's standbys (pg_stat_replication there)",
            d.flushed, d.needed, d.lsn
        ),
        (mode, Replication::Synchronous) => format!(
            "a {what} from the registry {display} is not on a synchronous standby (the registry's durability: {}; synchronous_standby_names is empty there, or its extension predates 0.7.0) and snowflake_id.lease_replication = synchronous: it is not used; give the registry a synchronous standby (synchronous_standby_names), update its extension, or set snowflake_id.lease_replication = auto here",
            mode.as_str()
        ),
        (mode, Replication::Auto) => format!(
            "a {what} from the registry {display} is not durable there (durability: {}): it is not used",
            mode.as_str()
        ),
    }
}
