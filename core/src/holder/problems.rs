//! What keeps the lease worker from leasing, as a state machine: the
//! current problem (each logged once, when it starts, and its end), the
//! lease call the registry left unanswered, since when the registry has
//! not answered (`snowflake_config().registry_unreachable_since`), and the
//! pause before the next connection attempt. The glue feeds it what
//! happened and logs what it returns; it publishes [`Problems::text`] and
//! [`Problems::unreachable_since_ms`] after each event.

use super::{CallError, Round};

/// What keeps the worker from leasing, by cause: the cause decides which
/// later success clears it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cause {
    /// Which Citus cluster this node belongs to cannot be read: cleared
    /// when the metadata is read.
    Citus,
    /// The registry refused a call: cleared by the next round without an
    /// error.
    Refused,
    /// A grant was committed but is not durable where a failover can
    /// reach it: cleared by the next durable grant.
    NotDurable,
    /// The registry did not answer a lease call in time, or the session
    /// broke during one: cleared when a lease call is answered. Until then
    /// no other problem's end clears it: a new session's call may wait as
    /// long again (a lock held at the registry, a registry that accepts
    /// connections but cannot commit).
    NoAnswer,
    /// Anything else (no connection, fenced, no free block, went back in
    /// time): cleared when a new connection works.
    Other,
}

/// A problem: its cause and the text shown in the log and in
/// `snowflake_config().lease_problem`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    pub cause: Cause,
    pub text: String,
}

impl Problem {
    pub fn new(cause: Cause, text: impl Into<String>) -> Problem {
        Problem {
            cause,
            text: text.into(),
        }
    }
}

/// A line for the server log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Log {
    /// At WARNING: a problem began (or changed).
    Warning(String),
    /// At LOG: a problem ended.
    Info(String),
}

/// The shortest pause before connecting again after a failure (ms); it
/// doubles up to the renewal interval (at least 1 s).
pub const BACKOFF_MIN_MS: i64 = 250;

/// The lease worker's problem reporting.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Problems {
    current: Option<Problem>,
    /// The last lease call the registry did not answer, until one is
    /// answered: a new session does not answer it (a lock held there holds
    /// the next call too), nor does another problem's end.
    unanswered: Option<String>,
    /// Unix ms since when the registry has not answered.
    unreachable_since_ms: Option<i64>,
    /// A connection attempt or a session failed since the last success.
    unreachable: bool,
    backoff_ms: i64,
    next_connect_mono_ms: i64,
}

impl Problems {
    /// The current problem's text ('' for none).
    pub fn text(&self) -> &str {
        self.current.as_ref().map_or("", |p| p.text.as_str())
    }

    pub fn current(&self) -> Option<&Problem> {
        self.current.as_ref()
    }

    /// Unix ms since when the registry has not answered (`None`: it
    /// answers).
    pub fn unreachable_since_ms(&self) -> Option<i64> {
        self.unreachable_since_ms
    }

    /// Whether a connection attempt or a session failed since the last
    /// connection that worked.
    pub fn unreachable(&self) -> bool {
        self.unreachable
    }

    /// Whether a connection may be attempted at `now_mono_ms`.
    pub fn may_connect(&self, now_mono_ms: i64) -> bool {
        now_mono_ms >= self.next_connect_mono_ms
    }

    /// The pause before the next connection attempt (ms).
    pub fn backoff_ms(&self) -> i64 {
        self.backoff_ms
    }

    /// A problem arises: logged when it differs from the current one.
    pub fn set(&mut self, problem: Problem) -> Vec<Log> {
        let mut out = Vec::new();
        if self.current.as_ref() != Some(&problem) {
            out.push(Log::Warning(problem.text.clone()));
        }
        self.current = Some(problem);
        out
    }

    /// The current problem ends (of the registry `display`); a lease call
    /// still unanswered becomes the problem again.
    fn clear(&mut self, display: &str) -> Vec<Log> {
        if let Some(text) = self.unanswered.clone() {
            self.current = Some(Problem::new(Cause::NoAnswer, text));
            return Vec::new();
        }
        match self.current.take() {
            Some(_) => vec![Log::Info(format!(
                "the registry {display} is reachable again"
            ))],
            None => Vec::new(),
        }
    }

    /// The registry does not answer, from `now_wall_ms` unless already so.
    fn not_answering(&mut self, now_wall_ms: i64) {
        self.unreachable_since_ms.get_or_insert(now_wall_ms);
    }

    /// A lease call was answered: nothing is unanswered.
    fn answering(&mut self) {
        self.unanswered = None;
        self.unreachable_since_ms = None;
    }

    /// The session is gone or none could be made: the pause before the
    /// next attempt doubles, from [`BACKOFF_MIN_MS`] up to the renewal
    /// interval (at least 1 s).
    fn unreachable_now(&mut self, problem: Problem, at: At) -> Vec<Log> {
        self.not_answering(at.wall_ms);
        self.unreachable = true;
        let most = at.renew_every_ms.max(1_000);
        self.backoff_ms = self
            .backoff_ms
            .saturating_mul(2)
            .clamp(BACKOFF_MIN_MS, most);
        self.next_connect_mono_ms = at.mono_ms.saturating_add(self.backoff_ms);
        self.set(problem)
    }

    /// A connection attempt failed (`text` says why).
    pub fn connect_failed(&mut self, text: String, at: At) -> Vec<Log> {
        self.unreachable_now(Problem::new(Cause::Other, text), at)
    }

    /// A session is open and introduced. While a lease call given up
    /// before it is unanswered (a lock or a synchronous standby at the
    /// registry, which accepts new sessions), the registry still does not
    /// answer: that ends when a lease call is answered.
    pub fn connected(&mut self, display: &str) -> Vec<Log> {
        self.backoff_ms = 0;
        self.unreachable = false;
        if self.unanswered.is_none() {
            self.unreachable_since_ms = None;
        }
        self.clear(display)
    }

    /// A round with the registry `display` ended. The glue drops the
    /// session when the error [`CallError::drops_session`].
    pub fn round(&mut self, round: &Round, display: &str, at: At) -> Vec<Log> {
        if round.answered {
            self.answering();
        }
        match &round.error {
            None => match self.current.as_ref().map(|p| p.cause) {
                Some(Cause::Refused | Cause::NoAnswer) => self.clear(display),
                _ => Vec::new(),
            },
            Some(e) if e.drops_session() => {
                let text = format!("the registry {display} did not answer: {}", e.text());
                self.unanswered = Some(text.clone());
                self.unreachable_now(Problem::new(Cause::NoAnswer, text), at)
            }
            // Given up by the registry at its lock_timeout or
            // statement_timeout (a lock held there): no answer, as a call
            // given up here at a deadline, but the session stays.
            Some(CallError::RegistryTimeout { message, .. }) => {
                let text = format!("the registry {display} did not answer in time: {message}");
                self.unanswered = Some(text.clone());
                self.not_answering(at.wall_ms);
                self.set(Problem::new(Cause::NoAnswer, text))
            }
            Some(e) => self.set(Problem::new(
                Cause::Refused,
                format!("the registry {display} refused a call: {}", e.text()),
            )),
        }
    }

    /// Grants are durable again: ends a `NotDurable` problem.
    pub fn durable_again(&mut self, display: &str) -> Vec<Log> {
        if self.current.as_ref().map(|p| p.cause) != Some(Cause::NotDurable) {
            return Vec::new();
        }
        self.current = None;
        vec![Log::Info(format!(
            "grants from the registry {display} are durable again"
        ))]
    }

    /// The Citus metadata was read: ends a `Citus` problem.
    pub fn citus_read(&mut self, display: &str) -> Vec<Log> {
        if self.current.as_ref().map(|p| p.cause) != Some(Cause::Citus) {
            return Vec::new();
        }
        self.clear(display)
    }

    /// Leases come from another registry now: nothing of the old one is
    /// unanswered, and a connection may be attempted at once.
    pub fn target_changed(&mut self) {
        self.answering();
        self.next_connect_mono_ms = 0;
    }
}

/// The clocks and the schedule an event is fed at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct At {
    pub mono_ms: i64,
    pub wall_ms: i64,
    /// The renewal interval (`lease::Timing::renew_every_ms`).
    pub renew_every_ms: i64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::CallEnd;

    const R: &str = "r";

    fn at(mono_ms: i64) -> At {
        At {
            mono_ms,
            wall_ms: 1_000_000 + mono_ms,
            renew_every_ms: 2_000,
        }
    }

    fn no_answer() -> CallError {
        CallError::NoAnswer {
            end: CallEnd::LeaseDeadline,
            text: "no answer before the lease deadline".into(),
        }
    }

    fn lock_timeout() -> CallError {
        CallError::from_registry(Some("55P03".into()), "lock timeout".into(), None)
    }

    fn refused() -> CallError {
        CallError::from_registry(Some("54000".into()), "beyond the limits".into(), None)
    }

    fn round(answered: bool, error: Option<CallError>) -> Round {
        Round { answered, error }
    }

    /// One event of a table row.
    enum Ev {
        Connected,
        ConnectFailed,
        Round(Round),
        Set(Cause),
        DurableAgain,
        CitusRead,
        TargetChanged,
    }

    fn feed(p: &mut Problems, ev: &Ev, t: i64) -> Vec<Log> {
        match ev {
            Ev::Connected => p.connected(R),
            Ev::ConnectFailed => p.connect_failed("could not connect".into(), at(t)),
            Ev::Round(r) => p.round(r, R, at(t)),
            Ev::Set(cause) => p.set(Problem::new(*cause, format!("{cause:?}"))),
            Ev::DurableAgain => p.durable_again(R),
            Ev::CitusRead => p.citus_read(R),
            Ev::TargetChanged => {
                p.target_changed();
                Vec::new()
            }
        }
    }

    /// What the state shows after the events (fed 100 ms apart from 0):
    /// the problem's cause, whether the registry counts as unreachable
    /// since some time, and how many warnings and infos were logged.
    struct Row {
        name: &'static str,
        events: Vec<Ev>,
        cause: Option<Cause>,
        unreachable_since: bool,
        warnings: usize,
        infos: usize,
    }

    #[test]
    fn problems_table() {
        use Ev::*;
        let rows = [
            Row {
                name: "a round without error, nothing to report",
                events: vec![Connected, Round(round(true, None))],
                cause: None,
                unreachable_since: false,
                warnings: 0,
                infos: 0,
            },
            Row {
                name: "no connection, then one: logged once each way",
                events: vec![ConnectFailed, ConnectFailed, Connected],
                cause: None,
                unreachable_since: false,
                warnings: 1,
                infos: 1,
            },
            Row {
                name: "an unanswered call stays the problem over a new session",
                events: vec![Round(round(false, Some(no_answer()))), Connected],
                cause: Some(Cause::NoAnswer),
                unreachable_since: true,
                warnings: 1,
                infos: 0,
            },
            Row {
                name: "until a call is answered",
                events: vec![
                    Round(round(false, Some(no_answer()))),
                    Connected,
                    Round(round(true, None)),
                ],
                cause: None,
                unreachable_since: false,
                warnings: 1,
                infos: 1,
            },
            Row {
                name: "the registry's own timeout is no answer, the session stays",
                events: vec![Round(round(false, Some(lock_timeout())))],
                cause: Some(Cause::NoAnswer),
                unreachable_since: true,
                warnings: 1,
                infos: 0,
            },
            Row {
                name: "a refusal after unanswered calls is an answer",
                events: vec![
                    Round(round(false, Some(lock_timeout()))),
                    Round(round(true, Some(refused()))),
                ],
                cause: Some(Cause::Refused),
                unreachable_since: false,
                warnings: 2,
                infos: 0,
            },
            Row {
                name: "a refusal repeated is logged once, cleared by a round without error",
                events: vec![
                    Round(round(true, Some(refused()))),
                    Round(round(true, Some(refused()))),
                    Round(round(true, None)),
                ],
                cause: None,
                unreachable_since: false,
                warnings: 1,
                infos: 1,
            },
            Row {
                name: "not durable is cleared by durable grants only",
                events: vec![Set(Cause::NotDurable), Round(round(true, None))],
                cause: Some(Cause::NotDurable),
                unreachable_since: false,
                warnings: 1,
                infos: 0,
            },
            Row {
                name: "durable again",
                events: vec![Set(Cause::NotDurable), DurableAgain],
                cause: None,
                unreachable_since: false,
                warnings: 1,
                infos: 1,
            },
            Row {
                name: "durable again ends nothing else",
                events: vec![Set(Cause::Other), DurableAgain],
                cause: Some(Cause::Other),
                unreachable_since: false,
                warnings: 1,
                infos: 0,
            },
            Row {
                name: "the Citus metadata read ends a Citus problem only",
                events: vec![Set(Cause::Citus), CitusRead, Set(Cause::Other), CitusRead],
                cause: Some(Cause::Other),
                unreachable_since: false,
                warnings: 2,
                infos: 1,
            },
            Row {
                name: "another registry: nothing unanswered",
                events: vec![
                    Round(round(false, Some(no_answer()))),
                    TargetChanged,
                    Connected,
                ],
                cause: None,
                unreachable_since: false,
                warnings: 1,
                infos: 1,
            },
        ];
        for row in rows {
            let mut p = Problems::default();
            let (mut warnings, mut infos) = (0, 0);
            for (i, ev) in row.events.iter().enumerate() {
                for log in feed(&mut p, ev, i as i64 * 100) {
                    match log {
                        Log::Warning(_) => warnings += 1,
                        Log::Info(_) => infos += 1,
                    }
                }
            }
            assert_eq!(p.current().map(|c| c.cause), row.cause, "{}", row.name);
            assert_eq!(
                p.unreachable_since_ms().is_some(),
                row.unreachable_since,
                "{}",
                row.name
            );
            assert_eq!((warnings, infos), (row.warnings, row.infos), "{}", row.name);
        }
    }

    #[test]
    fn unreachable_since_is_the_first_unanswered_moment() {
        let mut p = Problems::default();
        p.round(&round(false, Some(no_answer())), R, at(0));
        p.connect_failed("x".into(), at(5_000));
        assert_eq!(p.unreachable_since_ms(), Some(1_000_000));
        assert!(p.unreachable());
        p.connected(R);
        assert!(!p.unreachable());
        assert_eq!(
            p.unreachable_since_ms(),
            Some(1_000_000),
            "still unanswered"
        );
    }

    #[test]
    fn the_backoff_doubles_up_to_the_renewal_interval_and_resets_on_success() {
        let mut p = Problems::default();
        let mut pauses = Vec::new();
        for i in 0..6 {
            p.connect_failed("x".into(), at(i * 10_000));
            pauses.push(p.backoff_ms());
            assert!(!p.may_connect(i * 10_000 + p.backoff_ms() - 1));
            assert!(p.may_connect(i * 10_000 + p.backoff_ms()));
        }
        assert_eq!(pauses, [250, 500, 1_000, 2_000, 2_000, 2_000]);
        p.connected(R);
        p.connect_failed("x".into(), at(100_000));
        assert_eq!(p.backoff_ms(), 250);
        // With a short renewal interval, up to 1 s.
        let mut p = Problems::default();
        for _ in 0..5 {
            p.connect_failed(
                "x".into(),
                At {
                    renew_every_ms: 300,
                    ..at(0)
                },
            );
        }
        assert_eq!(p.backoff_ms(), 1_000);
    }

    #[test]
    fn a_dropped_session_after_an_answer_is_unanswered_from_then() {
        let mut p = Problems::default();
        p.round(&round(true, Some(no_answer())), R, at(700));
        assert_eq!(p.current().map(|c| c.cause), Some(Cause::NoAnswer));
        assert_eq!(p.unreachable_since_ms(), Some(1_000_700));
        assert!(p.text().contains("did not answer"));
    }
}
