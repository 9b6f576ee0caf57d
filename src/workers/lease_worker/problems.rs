//! What keeps the lease worker from leasing, and what the holder did: the
//! log lines (each problem once, when it starts and when it ends) and the
//! text `snowflake_config()` shows.

use super::Worker;

use snowflake_core::holder::{Durability, DurabilityMode, Event, Replication};
use snowflake_core::layout::format_unix_ms;

/// What keeps the lease worker from leasing, by cause: the cause decides
/// which later success clears it. Shown in the log and in
/// `snowflake_config().lease_problem` as text.
#[derive(Clone, PartialEq)]
pub(super) enum Problem {
    /// Which Citus cluster this node belongs to cannot be read: cleared
    /// when the metadata is read.
    Citus(String),
    /// The registry refused a call: cleared by the next call that succeeds.
    Refused(String),
    /// A grant was committed but is not durable where a failover can
    /// reach it: cleared by the next durable grant.
    NotDurable(String),
    /// The registry did not answer a lease call in time, or the session
    /// broke during one: cleared when a lease call is answered (the first
    /// step on a new session makes one: a renewal, or an acquire). Until
    /// then no other problem's end clears it (`Worker::unanswered`): a new
    /// session's call may wait as long again (a lock held at the registry,
    /// a registry that accepts connections but cannot commit).
    NoAnswer(String),
    /// Anything else (no connection, fenced, no free block, went back in
    /// time): cleared when a new connection works.
    Other(String),
}

impl Problem {
    pub(super) fn text(&self) -> &str {
        match self {
            Problem::Citus(t)
            | Problem::Refused(t)
            | Problem::NotDurable(t)
            | Problem::NoAnswer(t)
            | Problem::Other(t) => t,
        }
    }
}

/// Reporting: the worker's current problem, and the holder's events.
impl Worker {
    pub(super) fn set_problem(&mut self, problem: Problem) {
        if self.problem.as_ref() != Some(&problem) {
            pgrx::warning!("snowflake_id lease: {}", problem.text());
        }
        self.header.lease.problem.set(problem.text());
        self.problem = Some(problem);
    }

    /// Clears the current problem; a lease call still unanswered
    /// (`Worker::unanswered`) becomes the problem again.
    pub(super) fn clear_problem(&mut self) {
        if let Some(text) = self.unanswered.clone() {
            self.header.lease.problem.set(&text);
            self.problem = Some(Problem::NoAnswer(text));
            return;
        }
        if self.problem.take().is_some() {
            pgrx::log!(
                "snowflake_id lease: the registry {} is reachable again",
                self.display()
            );
        }
        self.header.lease.problem.set("");
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
                Event::Rollback { seen, reply } => self.set_problem(Problem::Other(format!(
                    "the registry {display} answered from WAL position {reply}, below {seen} seen before: it went back in time; its answer is not used"
                ))),
                Event::Fenced { until_ms } => self.set_problem(Problem::Other(format!(
                    "the registry {display} is fenced until {} (a new incarnation after it may have forgotten grants): it leases no block anew until then",
                    format_unix_ms(until_ms)
                ))),
                Event::Refused(text) => self.set_problem(Problem::Refused(format!(
                    "the registry {display} refused a call: {text}"
                ))),
                Event::NoFreeBlock => self.set_problem(Problem::Other(format!(
                    "the registry {display} has no free block of worker ids for this server (snowflake_id.worker_ids limits which it may lease)"
                ))),
                Event::NotDurable {
                    what,
                    durability,
                    required,
                } => self.set_problem(Problem::NotDurable(not_durable_text(
                    &display,
                    what,
                    &durability,
                    required,
                ))),
                Event::DurableAgain => {
                    if matches!(self.problem, Some(Problem::NotDurable(_))) {
                        pgrx::log!(
                            "snowflake_id lease: grants from the registry {display} are durable again"
                        );
                        self.problem = None;
                        self.header.lease.problem.set("");
                    }
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
