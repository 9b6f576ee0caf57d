//! The lease worker's connection to its registry: libpq, as PostgreSQL's
//! own processes talk to other servers (libpqwalreceiver, postgres_fdw).
//! libpq gives everything a connection string can say (TLS and
//! certificates, `passfile` and `~/.pgpass`, service files, several hosts
//! with `target_session_attrs`); this file drives it without blocking:
//! every socket wait is a `WaitLatchOrSocket` on the worker's latch with a
//! deadline, so a stalled registry costs at most [`CALL_TIMEOUT_MS`] per
//! call, and SIGTERM and SIGHUP are handled while waiting. While blocks
//! are in use, no wait (a call, a connection attempt, any host of it)
//! lasts past the earliest of their deadlines, and an answer that came at
//! or after it is not used ([`AnswerBy`], `snowflake_core::lease::CallLimit`):
//! the worker is back in its loop to revoke them at their deadline, as the
//! holder's contract says, however long the registry stalls.
//!
//! libpq is loaded with `dlopen` (the `libloading` crate) by the lease
//! worker only, never linked: a library preloaded into every server
//! process that linked the system's libpq would stand in for the server's
//! own libpq in its replication connections (same soname), and an older
//! one refuses newer options (`sslcertmode` on PostgreSQL 16). libpq is
//! installed wherever PostgreSQL is (`libpq5` on Debian).

mod libpq;

pub use libpq::parse_conninfo;

use libpq::{
    error_message, libpq, Libpq, PGconn, PgResult, CONNECTION_BAD, PGRES_COMMAND_OK,
    PGRES_POLLING_FAILED, PGRES_POLLING_OK, PGRES_POLLING_READING, PGRES_POLLING_WRITING,
    PGRES_TUPLES_OK,
};
use pgrx::bgworkers::BackgroundWorker;
use pgrx::pg_sys;
use snowflake_core::conninfo;
use snowflake_core::holder::{settle, CallError};
use snowflake_core::lease::{CallEnd, CallLimit};
use std::ffi::{CStr, CString};
use std::os::raw::c_char;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::Instant;

/// Set once SIGTERM was seen during a call (pgrx's flag is consumed when
/// read): the worker's loop ends.
static TERMINATING: AtomicBool = AtomicBool::new(false);

/// Whether SIGTERM arrived while a call waited.
pub fn terminating() -> bool {
    TERMINATING.load(Relaxed)
}

/// The longest a connection attempt or a call may take.
pub const CALL_TIMEOUT_MS: u64 = 10_000;

/// By when calls must be over, on the lease worker's monotonic clock (ms
/// since `origin`): the earliest deadline of the blocks in use
/// (`snowflake_core::lease::in_use_deadline`), `None` when none is.
#[derive(Clone, Copy, Debug)]
pub struct AnswerBy {
    pub origin: Instant,
    pub deadline_mono_ms: Option<i64>,
}

impl AnswerBy {
    fn now_mono_ms(&self) -> i64 {
        i64::try_from(self.origin.elapsed().as_millis()).unwrap_or(i64::MAX)
    }

    /// The limit of a call (or connection attempt) starting now.
    fn limit(&self) -> CallLimit {
        CallLimit::new(
            self.now_mono_ms(),
            CALL_TIMEOUT_MS as i64,
            self.deadline_mono_ms,
        )
    }

    /// The lease deadline has come: no call may start.
    fn deadline_passed(&self) -> bool {
        self.deadline_mono_ms
            .is_some_and(|d| self.now_mono_ms() >= d)
    }
}

/// The longest single wait, so that signals are seen promptly even if a
/// latch wake-up were missed.
const WAIT_SLICE_MS: i64 = 500;

/// A call's statement and text parameters, as libpq takes them.
struct Request {
    sql: CString,
    params: Vec<CString>,
}

impl Request {
    fn new(sql: &str, params: &[&str]) -> Result<Request, CallError> {
        let bad = |_| CallError::unusable("a query or parameter contains a NUL byte");
        Ok(Request {
            sql: CString::new(sql).map_err(bad)?,
            params: params
                .iter()
                .map(|p| CString::new(*p))
                .collect::<Result<_, _>>()
                .map_err(bad)?,
        })
    }
}

/// What a complete call got: its rows or the registry's error, and when
/// it was complete (the worker's monotonic ms).
struct Answer {
    result: Result<Vec<Vec<Option<String>>>, CallError>,
    at_mono_ms: i64,
}

/// A registry session.
pub struct Connection {
    pq: &'static Libpq,
    conn: *mut PGconn,
    /// By when calls must be over.
    answer_by: AnswerBy,
}

// The worker is single-threaded; the connection never leaves it.

impl Drop for Connection {
    fn drop(&mut self) {
        // SAFETY: `conn` came from PQconnectStartParams and is finished
        // exactly once, here.
        unsafe { (self.pq.PQfinish)(self.conn) };
    }
}

/// What a wait needs from the socket.
#[derive(Clone, Copy)]
enum Want {
    Read,
    Write,
}

/// Handles SIGHUP (reloads the configuration) and SIGTERM (gives up the
/// call, so that the worker exits) while waiting; in a session backend,
/// gives the call up on a pending interrupt.
fn check_signals() -> Result<(), CallError> {
    // SAFETY: a plain read of this process's type (IsBackgroundWorker is
    // gone in PostgreSQL 18).
    if unsafe { pg_sys::MyBackendType } != pg_sys::BackendType::B_BG_WORKER {
        // A session backend (backfill's grant calls) gives the call up on
        // a cancel or a termination; its caller serves the interrupt once
        // the connection is closed.
        // SAFETY: a plain read of PostgreSQL's interrupt flag.
        if unsafe { pg_sys::InterruptPending } != 0 {
            return Err(CallError::Lost("interrupted".into()));
        }
        return Ok(());
    }
    if BackgroundWorker::sighup_received() {
        // SAFETY: a plain call, as PostgreSQL's own processes make on SIGHUP.
        unsafe { pg_sys::ProcessConfigFile(pg_sys::GucContext::PGC_SIGHUP) };
    }
    if BackgroundWorker::sigterm_received() {
        TERMINATING.store(true, Relaxed);
    }
    if terminating() {
        return Err(CallError::Lost("the server is shutting down".into()));
    }
    Ok(())
}

/// Why a wait that reached its limit gave up, naming `what`.
fn no_answer(limit: &CallLimit, clock: &AnswerBy, what: &str) -> CallError {
    let text = match limit.end {
        CallEnd::Timeout => format!(
            "no answer within {} s while {what} (the registry is stalled or the network drops packets)",
            CALL_TIMEOUT_MS / 1000
        ),
        CallEnd::LeaseDeadline => format!(
            "no answer before the lease deadline of this server's blocks while {what} (given up {} ms past it; the registry is stalled, the call waits there for a lock or a synchronous standby: see pg_stat_activity on it, or the network drops packets): the blocks are not used past their deadline",
            clock.now_mono_ms().saturating_sub(limit.until_mono_ms)
        ),
    };
    CallError::NoAnswer {
        end: limit.end,
        text,
    }
}

/// Waits until the socket is ready for `want`, the limit passes (an error
/// naming `what`), or a signal arrives.
fn wait_socket(
    pq: &Libpq,
    conn: *mut PGconn,
    want: Want,
    limit: &CallLimit,
    clock: &AnswerBy,
    what: &str,
) -> Result<(), CallError> {
    loop {
        check_signals()?;
        let left = limit.left_ms(clock.now_mono_ms());
        if left == 0 {
            return Err(no_answer(limit, clock, what));
        }
        // SAFETY: reading the socket of a live connection.
        let socket = unsafe { (pq.PQsocket)(conn) };
        if socket < 0 {
            return Err(CallError::Lost(error_message(pq, conn)));
        }
        let event = match want {
            Want::Read => pg_sys::WL_SOCKET_READABLE,
            Want::Write => pg_sys::WL_SOCKET_WRITEABLE,
        };
        let timeout = left.clamp(1, WAIT_SLICE_MS);
        // SAFETY: MyLatch is this process's latch; the socket is open for
        // the duration of the wait.
        let rc = unsafe {
            pg_sys::WaitLatchOrSocket(
                pg_sys::MyLatch,
                (pg_sys::WL_LATCH_SET | pg_sys::WL_TIMEOUT | pg_sys::WL_EXIT_ON_PM_DEATH | event)
                    as i32,
                socket,
                timeout,
                pg_sys::PG_WAIT_EXTENSION,
            )
        };
        if rc & pg_sys::WL_LATCH_SET as i32 != 0 {
            // SAFETY: resetting our own latch, then looking at the flags.
            unsafe { pg_sys::ResetLatch(pg_sys::MyLatch) };
        }
        if rc & event as i32 != 0 {
            return Ok(());
        }
    }
}

impl Connection {
    /// Connects with `conninfo` (any libpq connection string), overriding
    /// the application name and the session's `options`.
    /// Connects to the registry. A connection string with several hosts
    /// is tried one host at a time, from host `first` on (wrapping), each
    /// with its own [`CALL_TIMEOUT_MS`]: libpq's own move to the next host
    /// happens only on a refused connection (its `connect_timeout` does
    /// not apply to a non-blocking connect), so a first host that accepts
    /// connections and never answers (a frozen VM) would otherwise stall
    /// every attempt. No attempt waits past `answer_by`'s lease deadline,
    /// and none starts after it. Returns the connection and the index of
    /// its host.
    pub fn connect(
        conninfo: &str,
        application_name: &str,
        options: &str,
        first: usize,
        answer_by: AnswerBy,
    ) -> Result<(Connection, usize), CallError> {
        let parsed = parse_conninfo(conninfo).map_err(CallError::unusable)?;
        let value = |key: &str| {
            parsed
                .iter()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.as_str())
        };
        let hosts = conninfo::hosts(value("host"), value("hostaddr"), value("port"));
        if hosts.is_empty() {
            return Self::connect_to(conninfo, application_name, options, None, answer_by)
                .map(|c| (c, 0));
        }
        let mut errors = Vec::with_capacity(hosts.len());
        for k in 0..hosts.len() {
            let i = (first + k) % hosts.len();
            match Self::connect_to(
                conninfo,
                application_name,
                options,
                Some(&hosts[i]),
                answer_by,
            ) {
                Ok(c) => return Ok((c, i)),
                Err(e) => errors.push(format!("host {}: {}", i + 1, e.text())),
            }
            // Shutting down, or the lease deadline came: no other host.
            if terminating() || answer_by.deadline_passed() {
                break;
            }
        }
        Err(CallError::Lost(errors.join("; ")))
    }

    /// One connection attempt: to the connection string as it is, or to
    /// one of its hosts (`host`, `hostaddr`, `port` override its lists).
    fn connect_to(
        conninfo: &str,
        application_name: &str,
        options: &str,
        host: Option<&conninfo::HostChoice>,
        answer_by: AnswerBy,
    ) -> Result<Connection, CallError> {
        let pq = libpq()?;
        let bad = |_| CallError::unusable("the connection string contains a NUL byte");
        let mut pairs: Vec<(&CStr, &str)> = vec![
            (c"dbname", conninfo),
            (c"application_name", application_name),
            (c"options", options),
        ];
        if let Some(h) = host {
            // Later keywords override what `dbname` expanded to; an empty
            // value would not, and none is given.
            for (key, v) in [
                (c"host", &h.host),
                (c"hostaddr", &h.hostaddr),
                (c"port", &h.port),
            ] {
                if let Some(v) = v.as_deref().filter(|v| !v.is_empty()) {
                    pairs.push((key, v));
                }
            }
        }
        let values = pairs
            .iter()
            .map(|(_, v)| CString::new(*v).map_err(bad))
            .collect::<Result<Vec<_>, _>>()?;
        let mut key_ptrs: Vec<*const c_char> = pairs.iter().map(|(k, _)| k.as_ptr()).collect();
        let mut value_ptrs: Vec<*const c_char> = values.iter().map(|v| v.as_ptr()).collect();
        key_ptrs.push(std::ptr::null());
        value_ptrs.push(std::ptr::null());
        // SAFETY: NULL-terminated arrays of NUL-terminated strings that
        // outlive the call; expand_dbname = 1 reads `conninfo` as a
        // connection string, the later keywords override it.
        let conn = unsafe { (pq.PQconnectStartParams)(key_ptrs.as_ptr(), value_ptrs.as_ptr(), 1) };
        if conn.is_null() {
            return Err(CallError::Lost(
                "out of memory starting a connection".into(),
            ));
        }
        let connection = Connection {
            pq,
            conn,
            answer_by,
        };
        // SAFETY: status of the connection we own.
        if unsafe { (pq.PQstatus)(conn) } == CONNECTION_BAD {
            return Err(CallError::Lost(error_message(pq, conn)));
        }
        let limit = answer_by.limit();
        let mut want = Want::Write;
        loop {
            wait_socket(pq, conn, want, &limit, &answer_by, "connecting")?;
            // SAFETY: advancing the connection we own.
            match unsafe { (pq.PQconnectPoll)(conn) } {
                PGRES_POLLING_OK => break,
                PGRES_POLLING_READING => want = Want::Read,
                PGRES_POLLING_WRITING => want = Want::Write,
                PGRES_POLLING_FAILED => return Err(CallError::Lost(error_message(pq, conn))),
                _ => {}
            }
        }
        if !limit.answer_usable(answer_by.now_mono_ms()) {
            return Err(no_answer(&limit, &answer_by, "connecting"));
        }
        // SAFETY: switching the connection we own to non-blocking sends.
        if unsafe { (pq.PQsetnonblocking)(conn, 1) } != 0 {
            return Err(CallError::Lost(error_message(pq, conn)));
        }
        Ok(connection)
    }

    /// Sets by when the calls that follow must be over (the earliest
    /// deadline of the blocks in use, on the lease worker's monotonic
    /// clock; `None`: the call timeout alone).
    pub fn set_answer_by(&mut self, deadline_mono_ms: Option<i64>) {
        self.answer_by.deadline_mono_ms = deadline_mono_ms;
    }

    /// Runs `sql` with text parameters; returns the rows' text values
    /// (`None` for NULL). A server error is [`CallError::from_registry`]:
    /// its SQLSTATE, message and hint. The request, the call, then the
    /// pure step that settles what came back ([`settle`]).
    pub fn query(
        &mut self,
        sql: &str,
        params: &[&str],
    ) -> Result<Vec<Vec<Option<String>>>, CallError> {
        let request = Request::new(sql, params)?;
        let clock = self.answer_by;
        let limit = clock.limit();
        // The deadline came before the call: nothing is sent (the host did
        // not stall; the worker revokes the blocks and reconnects).
        if limit.left_ms(clock.now_mono_ms()) == 0 {
            return Err(no_answer(&limit, &clock, "sending a call"));
        }
        let answer = self.call(&request, &limit)?;
        settle(&limit, answer.at_mono_ms, answer.result)
    }

    /// Sends `request` and reads its results until they are complete,
    /// within `limit`.
    fn call(&mut self, request: &Request, limit: &CallLimit) -> Result<Answer, CallError> {
        let (pq, conn, clock) = (self.pq, self.conn, self.answer_by);
        let ptrs: Vec<*const c_char> = request.params.iter().map(|p| p.as_ptr()).collect();
        // SAFETY: the statement and parameter strings outlive the call;
        // NULL types, lengths and formats mean text parameters.
        let sent = unsafe {
            (pq.PQsendQueryParams)(
                conn,
                request.sql.as_ptr(),
                ptrs.len() as i32,
                std::ptr::null(),
                ptrs.as_ptr(),
                std::ptr::null(),
                std::ptr::null(),
                0,
            )
        };
        if sent == 0 {
            return Err(CallError::Lost(error_message(pq, conn)));
        }
        // Send everything, then read until the results are complete.
        loop {
            // SAFETY: flushing the connection we own.
            match unsafe { (pq.PQflush)(conn) } {
                0 => break,
                1 => wait_socket(pq, conn, Want::Write, limit, &clock, "sending a call")?,
                _ => return Err(CallError::Lost(error_message(pq, conn))),
            }
        }
        let mut rows = Vec::new();
        let mut refused: Option<CallError> = None;
        loop {
            // SAFETY: on the connection we own.
            while unsafe { (pq.PQisBusy)(conn) } != 0 {
                wait_socket(pq, conn, Want::Read, limit, &clock, "waiting for an answer")?;
                // SAFETY: as above.
                if unsafe { (pq.PQconsumeInput)(conn) } == 0 {
                    return Err(CallError::Lost(error_message(pq, conn)));
                }
            }
            // SAFETY: as above; NULL means the call is complete.
            let res = unsafe { (pq.PQgetResult)(conn) };
            if res.is_null() {
                break;
            }
            let result = PgResult::new(pq, res);
            match result.status() {
                PGRES_TUPLES_OK | PGRES_COMMAND_OK => {
                    rows = result.rows();
                }
                _ => {
                    refused = Some(CallError::from_registry(
                        result.sqlstate(),
                        result.error(),
                        result.hint(),
                    ));
                }
            }
        }
        // SAFETY: status of the connection we own.
        if unsafe { (pq.PQstatus)(conn) } == CONNECTION_BAD {
            return Err(CallError::Lost(error_message(pq, conn)));
        }
        Ok(Answer {
            result: refused.map_or(Ok(rows), Err),
            at_mono_ms: clock.now_mono_ms(),
        })
    }

    /// The one value of a one-row, one-column answer.
    pub fn value(&mut self, sql: &str, params: &[&str]) -> Result<Option<String>, CallError> {
        let rows = self.query(sql, params)?;
        Ok(rows
            .into_iter()
            .next()
            .and_then(|r| r.into_iter().next())
            .flatten())
    }
}
