//! The lease worker's connection to its registry: libpq, as PostgreSQL's
//! own processes talk to other servers (libpqwalreceiver, postgres_fdw).
//! libpq gives everything a connection string can say (TLS and
//! certificates, `passfile` and `~/.pgpass`, service files, several hosts
//! with `target_session_attrs`); this file drives it without blocking:
//! every socket wait is a `WaitLatchOrSocket` on the worker's latch with a
//! deadline, so a stalled registry costs at most [`CALL_TIMEOUT_MS`] per
//! call, and SIGTERM and SIGHUP are handled while waiting.
//!
//! libpq is loaded with `dlopen` (the `libloading` crate) by the lease
//! worker only, never linked: a library preloaded into every server
//! process that linked the system's libpq would stand in for the server's
//! own libpq in its replication connections (same soname), and an older
//! one refuses newer options (`sslcertmode` on PostgreSQL 16). libpq is
//! installed wherever PostgreSQL is (`libpq5` on Debian).

use pgrx::bgworkers::BackgroundWorker;
use pgrx::pg_sys;
use snowflake_core::conninfo;
use snowflake_core::holder::CallError;
use std::ffi::{CStr, CString};
use std::os::raw::{c_char, c_int};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Set once SIGTERM was seen during a call (pgrx's flag is consumed when
/// read): the worker's loop ends.
static TERMINATING: AtomicBool = AtomicBool::new(false);

/// Whether SIGTERM arrived while a call waited.
pub fn terminating() -> bool {
    TERMINATING.load(Relaxed)
}

/// The libpq functions the lease worker calls, from `libpq.so.5`.
#[allow(non_snake_case)]
struct Libpq {
    _lib: libloading::Library,
    PQconnectStartParams:
        unsafe extern "C" fn(*const *const c_char, *const *const c_char, c_int) -> *mut PGconn,
    PQconnectPoll: unsafe extern "C" fn(*mut PGconn) -> c_int,
    PQstatus: unsafe extern "C" fn(*const PGconn) -> c_int,
    PQsocket: unsafe extern "C" fn(*const PGconn) -> c_int,
    PQerrorMessage: unsafe extern "C" fn(*const PGconn) -> *const c_char,
    PQfinish: unsafe extern "C" fn(*mut PGconn),
    PQsetnonblocking: unsafe extern "C" fn(*mut PGconn, c_int) -> c_int,
    PQsendQueryParams: unsafe extern "C" fn(
        *mut PGconn,
        *const c_char,
        c_int,
        *const u32,
        *const *const c_char,
        *const c_int,
        *const c_int,
        c_int,
    ) -> c_int,
    PQflush: unsafe extern "C" fn(*mut PGconn) -> c_int,
    PQisBusy: unsafe extern "C" fn(*mut PGconn) -> c_int,
    PQconsumeInput: unsafe extern "C" fn(*mut PGconn) -> c_int,
    PQgetResult: unsafe extern "C" fn(*mut PGconn) -> *mut PGresult,
    PQresultStatus: unsafe extern "C" fn(*const PGresult) -> c_int,
    PQresultErrorField: unsafe extern "C" fn(*const PGresult, c_int) -> *const c_char,
    PQntuples: unsafe extern "C" fn(*const PGresult) -> c_int,
    PQnfields: unsafe extern "C" fn(*const PGresult) -> c_int,
    PQgetisnull: unsafe extern "C" fn(*const PGresult, c_int, c_int) -> c_int,
    PQgetvalue: unsafe extern "C" fn(*const PGresult, c_int, c_int) -> *const c_char,
    PQclear: unsafe extern "C" fn(*mut PGresult),
    PQconninfoParse: unsafe extern "C" fn(*const c_char, *mut *mut c_char) -> *mut ConninfoOption,
    PQconninfoFree: unsafe extern "C" fn(*mut ConninfoOption),
    PQfreemem: unsafe extern "C" fn(*mut std::ffi::c_void),
}

/// libpq's opaque connection and result.
#[repr(C)]
struct PGconn {
    _private: [u8; 0],
}
#[repr(C)]
struct PGresult {
    _private: [u8; 0],
}

/// `PQconninfoOption`.
#[repr(C)]
struct ConninfoOption {
    keyword: *mut c_char,
    envvar: *mut c_char,
    compiled: *mut c_char,
    val: *mut c_char,
    label: *mut c_char,
    dispchar: *mut c_char,
    dispsize: c_int,
}

// libpq's enum values (libpq-fe.h, stable across releases).
const CONNECTION_BAD: c_int = 1;
const PGRES_POLLING_FAILED: c_int = 0;
const PGRES_POLLING_READING: c_int = 1;
const PGRES_POLLING_WRITING: c_int = 2;
const PGRES_POLLING_OK: c_int = 3;
const PGRES_COMMAND_OK: c_int = 1;
const PGRES_TUPLES_OK: c_int = 2;
const PG_DIAG_MESSAGE_PRIMARY: c_int = b'M' as c_int;
const PG_DIAG_SQLSTATE: c_int = b'C' as c_int;
const PG_DIAG_MESSAGE_DETAIL: c_int = b'D' as c_int;
const PG_DIAG_MESSAGE_HINT: c_int = b'H' as c_int;

/// libpq, loaded on first use in this process (`Err`: why it cannot be).
static LIBPQ: OnceLock<Result<Libpq, String>> = OnceLock::new();

fn libpq() -> Result<&'static Libpq, CallError> {
    LIBPQ
        .get_or_init(load_libpq)
        .as_ref()
        .map_err(|e| CallError::Refused(e.clone()))
}

fn load_libpq() -> Result<Libpq, String> {
    // SAFETY: loading the system's libpq, whose initialisers are safe to
    // run in a single-threaded process.
    let lib = unsafe { libloading::Library::new("libpq.so.5") }.map_err(|e| {
        format!("libpq (libpq.so.5) could not be loaded: {e}; install it (Debian: libpq5)")
    })?;
    macro_rules! sym {
        ($name:ident) => {
            // SAFETY: the symbol's type is libpq's declared signature.
            *unsafe { lib.get(concat!(stringify!($name), "\0").as_bytes()) }
                .map_err(|e| format!("libpq has no {}: {e}", stringify!($name)))?
        };
    }
    Ok(Libpq {
        PQconnectStartParams: sym!(PQconnectStartParams),
        PQconnectPoll: sym!(PQconnectPoll),
        PQstatus: sym!(PQstatus),
        PQsocket: sym!(PQsocket),
        PQerrorMessage: sym!(PQerrorMessage),
        PQfinish: sym!(PQfinish),
        PQsetnonblocking: sym!(PQsetnonblocking),
        PQsendQueryParams: sym!(PQsendQueryParams),
        PQflush: sym!(PQflush),
        PQisBusy: sym!(PQisBusy),
        PQconsumeInput: sym!(PQconsumeInput),
        PQgetResult: sym!(PQgetResult),
        PQresultStatus: sym!(PQresultStatus),
        PQresultErrorField: sym!(PQresultErrorField),
        PQntuples: sym!(PQntuples),
        PQnfields: sym!(PQnfields),
        PQgetisnull: sym!(PQgetisnull),
        PQgetvalue: sym!(PQgetvalue),
        PQclear: sym!(PQclear),
        PQconninfoParse: sym!(PQconninfoParse),
        PQconninfoFree: sym!(PQconninfoFree),
        PQfreemem: sym!(PQfreemem),
        _lib: lib,
    })
}

/// The longest a connection attempt or a call may take.
pub const CALL_TIMEOUT_MS: u64 = 10_000;

/// The longest single wait, so that signals are seen promptly even if a
/// latch wake-up were missed.
const WAIT_SLICE_MS: i64 = 500;

/// A registry session.
pub struct Connection {
    pq: &'static Libpq,
    conn: *mut PGconn,
    /// The SQLSTATE of the last call's error, if it failed on the server.
    last_sqlstate: Option<String>,
    /// A call found no answer within [`CALL_TIMEOUT_MS`]: the host stalled.
    stalled: bool,
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

fn error_message(pq: &Libpq, conn: *const PGconn) -> String {
    // SAFETY: PQerrorMessage returns a string owned by the connection,
    // valid until the next call on it; copied at once.
    let text = unsafe { CStr::from_ptr((pq.PQerrorMessage)(conn)) };
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
    pq: &Libpq,
    conn: *mut PGconn,
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
        let socket = unsafe { (pq.PQsocket)(conn) };
        if socket < 0 {
            return Err(CallError::Unreachable(error_message(pq, conn)));
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
    /// Connects to the registry. A connection string with several hosts
    /// is tried one host at a time, from host `first` on (wrapping), each
    /// with its own [`CALL_TIMEOUT_MS`]: libpq's own move to the next host
    /// happens only on a refused connection (its `connect_timeout` does
    /// not apply to a non-blocking connect), so a first host that accepts
    /// connections and never answers (a frozen VM) would otherwise stall
    /// every attempt. Returns the connection and the index of its host.
    pub fn connect(
        conninfo: &str,
        application_name: &str,
        options: &str,
        first: usize,
    ) -> Result<(Connection, usize), CallError> {
        let parsed = parse_conninfo(conninfo).map_err(CallError::Refused)?;
        let value = |key: &str| {
            parsed
                .iter()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.as_str())
        };
        let hosts = conninfo::hosts(value("host"), value("hostaddr"), value("port"));
        if hosts.is_empty() {
            return Self::connect_to(conninfo, application_name, options, None).map(|c| (c, 0));
        }
        let mut errors = Vec::with_capacity(hosts.len());
        for k in 0..hosts.len() {
            let i = (first + k) % hosts.len();
            match Self::connect_to(conninfo, application_name, options, Some(&hosts[i])) {
                Ok(c) => return Ok((c, i)),
                // Shutting down: no other host.
                Err(e) if terminating() => return Err(e),
                Err(CallError::Unreachable(e) | CallError::Refused(e)) => {
                    errors.push(format!("host {}: {e}", i + 1))
                }
            }
        }
        Err(CallError::Unreachable(errors.join("; ")))
    }

    /// One connection attempt: to the connection string as it is, or to
    /// one of its hosts (`host`, `hostaddr`, `port` override its lists).
    fn connect_to(
        conninfo: &str,
        application_name: &str,
        options: &str,
        host: Option<&conninfo::HostChoice>,
    ) -> Result<Connection, CallError> {
        let pq = libpq()?;
        let bad = |_| CallError::Refused("the connection string contains a NUL byte".into());
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
            return Err(CallError::Unreachable(
                "out of memory starting a connection".into(),
            ));
        }
        let connection = Connection {
            pq,
            conn,
            last_sqlstate: None,
            stalled: false,
        };
        // SAFETY: status of the connection we own.
        if unsafe { (pq.PQstatus)(conn) } == CONNECTION_BAD {
            return Err(CallError::Unreachable(error_message(pq, conn)));
        }
        let deadline = Instant::now() + Duration::from_millis(CALL_TIMEOUT_MS);
        let mut want = Want::Write;
        loop {
            wait_socket(pq, conn, want, deadline, "connecting")?;
            // SAFETY: advancing the connection we own.
            match unsafe { (pq.PQconnectPoll)(conn) } {
                PGRES_POLLING_OK => break,
                PGRES_POLLING_READING => want = Want::Read,
                PGRES_POLLING_WRITING => want = Want::Write,
                PGRES_POLLING_FAILED => {
                    return Err(CallError::Unreachable(error_message(pq, conn)))
                }
                _ => {}
            }
        }
        // SAFETY: switching the connection we own to non-blocking sends.
        if unsafe { (pq.PQsetnonblocking)(conn, 1) } != 0 {
            return Err(CallError::Unreachable(error_message(pq, conn)));
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
        let (pq, conn) = (self.pq, self.conn);
        self.last_sqlstate = None;
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
            (pq.PQsendQueryParams)(
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
            return Err(CallError::Unreachable(error_message(pq, conn)));
        }
        // Send everything, then read until the results are complete.
        loop {
            // SAFETY: flushing the connection we own.
            match unsafe { (pq.PQflush)(conn) } {
                0 => break,
                1 => wait_socket(pq, conn, Want::Write, deadline, "sending a call")
                    .inspect_err(|_| self.stalled = Instant::now() >= deadline)?,
                _ => return Err(CallError::Unreachable(error_message(pq, conn))),
            }
        }
        let mut rows = Vec::new();
        let mut refused: Option<String> = None;
        loop {
            // SAFETY: on the connection we own.
            while unsafe { (pq.PQisBusy)(conn) } != 0 {
                wait_socket(pq, conn, Want::Read, deadline, "waiting for an answer")
                    .inspect_err(|_| self.stalled = Instant::now() >= deadline)?;
                // SAFETY: as above.
                if unsafe { (pq.PQconsumeInput)(conn) } == 0 {
                    return Err(CallError::Unreachable(error_message(pq, conn)));
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
                    refused = Some(result.error());
                    self.last_sqlstate = result.sqlstate();
                }
            }
        }
        // SAFETY: status of the connection we own.
        if unsafe { (pq.PQstatus)(conn) } == CONNECTION_BAD {
            return Err(CallError::Unreachable(error_message(pq, conn)));
        }
        match refused {
            Some(message) => Err(CallError::Refused(message)),
            None => Ok(rows),
        }
    }

    /// The SQLSTATE of the last call's error when the server refused it
    /// (`None` after a success, or when no answer came).
    /// Whether a call on this connection got no answer in time (the host
    /// stalled, as opposed to a broken or refused connection).
    pub fn stalled(&self) -> bool {
        self.stalled
    }

    pub fn last_sqlstate(&self) -> Option<&str> {
        self.last_sqlstate.as_deref()
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
struct PgResult(&'static Libpq, *mut PGresult);

impl PgResult {
    fn new(pq: &'static Libpq, res: *mut PGresult) -> PgResult {
        PgResult(pq, res)
    }

    fn status(&self) -> c_int {
        // SAFETY: a live result we own.
        unsafe { (self.0.PQresultStatus)(self.1) }
    }

    /// The error's message, with its detail and hint when the server sent
    /// them: the registry's refusals say there what to change (a limit, a
    /// setting of this server), and the holder's log is where a DBA reads.
    fn error(&self) -> String {
        let Some(primary) = self.field(PG_DIAG_MESSAGE_PRIMARY) else {
            return "the registry reported an error".into();
        };
        let mut text = primary;
        for (label, code) in [
            ("detail", PG_DIAG_MESSAGE_DETAIL),
            ("hint", PG_DIAG_MESSAGE_HINT),
        ] {
            if let Some(more) = self.field(code) {
                text.push_str(&format!(" ({label}: {more})"));
            }
        }
        text
    }

    /// The error's SQLSTATE, when the server sent one.
    fn sqlstate(&self) -> Option<String> {
        self.field(PG_DIAG_SQLSTATE)
    }

    /// A field of the error, when the server sent it.
    fn field(&self, code: c_int) -> Option<String> {
        // SAFETY: a field of a live result (NULL when absent).
        let value = unsafe { (self.0.PQresultErrorField)(self.1, code) };
        if value.is_null() {
            return None;
        }
        // SAFETY: a NUL-terminated string owned by the result, copied now.
        Some(
            unsafe { CStr::from_ptr(value) }
                .to_string_lossy()
                .into_owned(),
        )
    }

    fn rows(&self) -> Vec<Vec<Option<String>>> {
        // SAFETY: reading the shape and values of a live result; each
        // value is a NUL-terminated string owned by it, copied now.
        unsafe {
            let (n, fields) = ((self.0.PQntuples)(self.1), (self.0.PQnfields)(self.1));
            (0..n)
                .map(|row| {
                    (0..fields)
                        .map(|f| {
                            if (self.0.PQgetisnull)(self.1, row, f) != 0 {
                                None
                            } else {
                                let v = (self.0.PQgetvalue)(self.1, row, f);
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
        unsafe { (self.0.PQclear)(self.1) };
    }
}

/// The parts of a connection string, as libpq reads it (keyword, value),
/// or libpq's message when it is not one.
pub fn parse_conninfo(conninfo: &str) -> Result<Vec<(String, String)>, String> {
    let pq = libpq().map_err(|e| match e {
        CallError::Refused(text) | CallError::Unreachable(text) => text,
    })?;
    let text = CString::new(conninfo)
        .map_err(|_| "the connection string contains a NUL byte".to_string())?;
    let mut err: *mut c_char = std::ptr::null_mut();
    // SAFETY: parses a NUL-terminated string; on failure `err` is a
    // libpq-allocated message we free.
    let options = unsafe { (pq.PQconninfoParse)(text.as_ptr(), &mut err) };
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
            unsafe { (pq.PQfreemem)(err.cast()) };
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
        (pq.PQconninfoFree)(options);
    }
    Ok(out)
}
