//! The lease worker's connection to its registry: libpq, as PostgreSQL's
//! own processes talk to other servers (libpqwalreceiver, postgres_fdw).
//! libpq gives everything a connection string can say (TLS and
//! certificates, `passfile` and `~/.pgpass`, service files, several hosts
//! with `target_session_attrs`); this file drives it without blocking:
//! every socket wait is a `WaitLatchOrSocket` on the worker's latch with a
//! deadline, so a stalled registry costs at most [`CALL_TIMEOUT_MS`] per
//! call, and SIGTERM and SIGHUP are handled while waiting.
//!
//! The `pq-sys` crate is the binding (a thin, maintained `-sys` crate over
//! the system's libpq, which is installed wherever PostgreSQL is).

use crate::holder::CallError;
use pgrx::bgworkers::BackgroundWorker;
use pgrx::pg_sys;
use pq_sys as pq;
use std::ffi::{CStr, CString};
use std::os::raw::c_char;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// Set once SIGTERM was seen during a call (pgrx's flag is consumed when
/// read): the worker's loop ends.
static TERMINATING: AtomicBool = AtomicBool::new(false);

/// Whether SIGTERM arrived while a call waited.
pub fn terminating() -> bool {
    TERMINATING.load(Relaxed)
}

/// The longest a connection attempt or a call may take.
pub const CALL_TIMEOUT_MS: u64 = 10_000;

/// The longest single wait, so that signals are seen promptly even if a
/// latch wake-up were missed.
const WAIT_SLICE_MS: i64 = 500;

/// A registry session.
pub struct Connection {
    conn: *mut pq::PGconn,
}

// The worker is single-threaded; the connection never leaves it.

impl Drop for Connection {
    fn drop(&mut self) {
        // SAFETY: `conn` came from PQconnectStartParams and is finished
        // exactly once, here.
        unsafe { pq::PQfinish(self.conn) };
    }
}

/// What a wait needs from the socket.
#[derive(Clone, Copy)]
enum Want {
    Read,
    Write,
}

fn error_message(conn: *const pq::PGconn) -> String {
    // SAFETY: PQerrorMessage returns a string owned by the connection,
    // valid until the next call on it; copied at once.
    let text = unsafe { CStr::from_ptr(pq::PQerrorMessage(conn)) };
    let text = text.to_string_lossy();
    let text = text.trim();
    if text.is_empty() {
        "connection lost".into()
    } else {
        text.replace('\n', " ")
    }
}

/// Handles SIGHUP (reloads the configuration) and SIGTERM (gives up the
/// call, so that the worker exits) while waiting.
fn check_signals() -> Result<(), CallError> {
    if BackgroundWorker::sighup_received() {
        // SAFETY: a plain call, as PostgreSQL's own processes make on SIGHUP.
        unsafe { pg_sys::ProcessConfigFile(pg_sys::GucContext::PGC_SIGHUP) };
    }
    if BackgroundWorker::sigterm_received() {
        TERMINATING.store(true, Relaxed);
    }
    if terminating() {
        return Err(CallError::Unreachable("the server is shutting down".into()));
    }
    Ok(())
}

/// Waits until the socket is ready for `want`, the deadline passes (an
/// error naming `what`), or a signal arrives.
fn wait_socket(
    conn: *mut pq::PGconn,
    want: Want,
    deadline: Instant,
    what: &str,
) -> Result<(), CallError> {
    loop {
        check_signals()?;
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(CallError::Unreachable(format!(
                "no answer within {} s while {what} (the registry is stalled or the network drops packets)",
                CALL_TIMEOUT_MS / 1000
            )));
        }
        // SAFETY: reading the socket of a live connection.
        let socket = unsafe { pq::PQsocket(conn) };
        if socket < 0 {
            return Err(CallError::Unreachable(error_message(conn)));
        }
        let event = match want {
            Want::Read => pg_sys::WL_SOCKET_READABLE,
            Want::Write => pg_sys::WL_SOCKET_WRITEABLE,
        };
        let timeout = (left.as_millis() as i64).clamp(1, WAIT_SLICE_MS);
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
    pub fn connect(
        conninfo: &str,
        application_name: &str,
        options: &str,
    ) -> Result<Connection, CallError> {
        let bad = |_| CallError::Refused("the connection string contains a NUL byte".into());
        let keys = [c"dbname", c"application_name", c"options"];
        let values = [
            CString::new(conninfo).map_err(bad)?,
            CString::new(application_name).map_err(bad)?,
            CString::new(options).map_err(bad)?,
        ];
        let mut key_ptrs: Vec<*const c_char> = keys.iter().map(|k| k.as_ptr()).collect();
        let mut value_ptrs: Vec<*const c_char> = values.iter().map(|v| v.as_ptr()).collect();
        key_ptrs.push(std::ptr::null());
        value_ptrs.push(std::ptr::null());
        // SAFETY: NULL-terminated arrays of NUL-terminated strings that
        // outlive the call; expand_dbname = 1 reads `conninfo` as a
        // connection string, the later keywords override it.
        let conn = unsafe { pq::PQconnectStartParams(key_ptrs.as_ptr(), value_ptrs.as_ptr(), 1) };
        if conn.is_null() {
            return Err(CallError::Unreachable(
                "out of memory starting a connection".into(),
            ));
        }
        let connection = Connection { conn };
        // SAFETY: status of the connection we own.
        if unsafe { pq::PQstatus(conn) } == pq::ConnStatusType::CONNECTION_BAD {
            return Err(CallError::Unreachable(error_message(conn)));
        }
        let deadline = Instant::now() + Duration::from_millis(CALL_TIMEOUT_MS);
        let mut want = Want::Write;
        loop {
            wait_socket(conn, want, deadline, "connecting")?;
            // SAFETY: advancing the connection we own.
            match unsafe { pq::PQconnectPoll(conn) } {
                pq::PostgresPollingStatusType::PGRES_POLLING_OK => break,
                pq::PostgresPollingStatusType::PGRES_POLLING_READING => want = Want::Read,
                pq::PostgresPollingStatusType::PGRES_POLLING_WRITING => want = Want::Write,
                pq::PostgresPollingStatusType::PGRES_POLLING_FAILED => {
                    return Err(CallError::Unreachable(error_message(conn)))
                }
                pq::PostgresPollingStatusType::PGRES_POLLING_ACTIVE => {}
            }
        }
        // SAFETY: switching the connection we own to non-blocking sends.
        if unsafe { pq::PQsetnonblocking(conn, 1) } != 0 {
            return Err(CallError::Unreachable(error_message(conn)));
        }
        Ok(connection)
    }

    /// Runs `sql` with text parameters; returns the rows' text values
    /// (`None` for NULL). A server error is `Refused` with its message.
    pub fn query(
        &mut self,
        sql: &str,
        params: &[&str],
    ) -> Result<Vec<Vec<Option<String>>>, CallError> {
        let conn = self.conn;
        let bad = |_| CallError::Refused("a query or parameter contains a NUL byte".into());
        let sql = CString::new(sql).map_err(bad)?;
        let params: Vec<CString> = params
            .iter()
            .map(|p| CString::new(*p))
            .collect::<Result<_, _>>()
            .map_err(bad)?;
        let ptrs: Vec<*const c_char> = params.iter().map(|p| p.as_ptr()).collect();
        let deadline = Instant::now() + Duration::from_millis(CALL_TIMEOUT_MS);
        // SAFETY: the statement and parameter strings outlive the call;
        // NULL types, lengths and formats mean text parameters.
        let sent = unsafe {
            pq::PQsendQueryParams(
                conn,
                sql.as_ptr(),
                ptrs.len() as i32,
                std::ptr::null(),
                ptrs.as_ptr(),
                std::ptr::null(),
                std::ptr::null(),
                0,
            )
        };
        if sent == 0 {
            return Err(CallError::Unreachable(error_message(conn)));
        }
        // Send everything, then read until the results are complete.
        loop {
            // SAFETY: flushing the connection we own.
            match unsafe { pq::PQflush(conn) } {
                0 => break,
                1 => wait_socket(conn, Want::Write, deadline, "sending a call")?,
                _ => return Err(CallError::Unreachable(error_message(conn))),
            }
        }
        let mut rows = Vec::new();
        let mut refused: Option<String> = None;
        loop {
            // SAFETY: on the connection we own.
            while unsafe { pq::PQisBusy(conn) } != 0 {
                wait_socket(conn, Want::Read, deadline, "waiting for an answer")?;
                // SAFETY: as above.
                if unsafe { pq::PQconsumeInput(conn) } == 0 {
                    return Err(CallError::Unreachable(error_message(conn)));
                }
            }
            // SAFETY: as above; NULL means the call is complete.
            let res = unsafe { pq::PQgetResult(conn) };
            if res.is_null() {
                break;
            }
            let result = PgResult::new(res);
            match result.status() {
                pq::ExecStatusType::PGRES_TUPLES_OK | pq::ExecStatusType::PGRES_COMMAND_OK => {
                    rows = result.rows();
                }
                pq::ExecStatusType::PGRES_FATAL_ERROR
                | pq::ExecStatusType::PGRES_NONFATAL_ERROR => {
                    refused = Some(result.error());
                }
                _ => refused = Some("unexpected answer".into()),
            }
        }
        // SAFETY: status of the connection we own.
        if unsafe { pq::PQstatus(conn) } == pq::ConnStatusType::CONNECTION_BAD {
            return Err(CallError::Unreachable(error_message(conn)));
        }
        match refused {
            Some(message) => Err(CallError::Refused(message)),
            None => Ok(rows),
        }
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

/// A result, cleared when dropped.
struct PgResult(*mut pq::PGresult);

impl PgResult {
    fn new(res: *mut pq::PGresult) -> PgResult {
        PgResult(res)
    }

    fn status(&self) -> pq::ExecStatusType {
        // SAFETY: a live result we own.
        unsafe { pq::PQresultStatus(self.0) }
    }

    fn error(&self) -> String {
        // SAFETY: a field of a live result (NULL when absent).
        let primary = unsafe { pq::PQresultErrorField(self.0, pq::PG_DIAG_MESSAGE_PRIMARY as i32) };
        if primary.is_null() {
            return "the registry reported an error".into();
        }
        // SAFETY: a NUL-terminated string owned by the result, copied now.
        unsafe { CStr::from_ptr(primary) }
            .to_string_lossy()
            .into_owned()
    }

    fn rows(&self) -> Vec<Vec<Option<String>>> {
        // SAFETY: reading the shape and values of a live result; each
        // value is a NUL-terminated string owned by it, copied now.
        unsafe {
            let (n, fields) = (pq::PQntuples(self.0), pq::PQnfields(self.0));
            (0..n)
                .map(|row| {
                    (0..fields)
                        .map(|f| {
                            if pq::PQgetisnull(self.0, row, f) != 0 {
                                None
                            } else {
                                let v = pq::PQgetvalue(self.0, row, f);
                                Some(CStr::from_ptr(v).to_string_lossy().into_owned())
                            }
                        })
                        .collect()
                })
                .collect()
        }
    }
}

impl Drop for PgResult {
    fn drop(&mut self) {
        // SAFETY: cleared exactly once.
        unsafe { pq::PQclear(self.0) };
    }
}

/// The parts of a connection string, as libpq reads it (keyword, value),
/// or libpq's message when it is not one.
pub fn parse_conninfo(conninfo: &str) -> Result<Vec<(String, String)>, String> {
    let text = CString::new(conninfo)
        .map_err(|_| "the connection string contains a NUL byte".to_string())?;
    let mut err: *mut c_char = std::ptr::null_mut();
    // SAFETY: parses a NUL-terminated string; on failure `err` is a
    // libpq-allocated message we free.
    let options = unsafe { pq::PQconninfoParse(text.as_ptr(), &mut err) };
    if options.is_null() {
        let message = if err.is_null() {
            "out of memory".to_string()
        } else {
            // SAFETY: libpq's message, freed after copying.
            let m = unsafe { CStr::from_ptr(err) }
                .to_string_lossy()
                .trim()
                .to_string();
            // SAFETY: freeing libpq's message once, after copying it.
            unsafe { pq::PQfreemem(err.cast()) };
            m
        };
        return Err(message);
    }
    let mut out = Vec::new();
    let mut p = options;
    // SAFETY: the array ends with an entry whose keyword is NULL; every
    // string is owned by it until PQconninfoFree.
    unsafe {
        while !(*p).keyword.is_null() {
            if !(*p).val.is_null() {
                out.push((
                    CStr::from_ptr((*p).keyword).to_string_lossy().into_owned(),
                    CStr::from_ptr((*p).val).to_string_lossy().into_owned(),
                ));
            }
            p = p.add(1);
        }
        pq::PQconninfoFree(options);
    }
    Ok(out)
}
