//! libpq itself, for the registry client: the functions it calls, loaded
//! with `dlopen` on first use (see `mod.rs` for why never linked), libpq's
//! constants, a result that clears itself, and connection-string parsing.

use snowflake_core::holder::CallError;
use std::ffi::{CStr, CString};
use std::os::raw::{c_char, c_int};
use std::sync::OnceLock;

/// The libpq functions the lease worker calls, from `libpq.so.5`.
#[allow(non_snake_case)]
pub(super) struct Libpq {
    _lib: libloading::Library,
    pub(super) PQconnectStartParams:
        unsafe extern "C" fn(*const *const c_char, *const *const c_char, c_int) -> *mut PGconn,
    pub(super) PQconnectPoll: unsafe extern "C" fn(*mut PGconn) -> c_int,
    pub(super) PQstatus: unsafe extern "C" fn(*const PGconn) -> c_int,
    pub(super) PQsocket: unsafe extern "C" fn(*const PGconn) -> c_int,
    pub(super) PQerrorMessage: unsafe extern "C" fn(*const PGconn) -> *const c_char,
    pub(super) PQfinish: unsafe extern "C" fn(*mut PGconn),
    pub(super) PQsetnonblocking: unsafe extern "C" fn(*mut PGconn, c_int) -> c_int,
    pub(super) PQsendQueryParams: unsafe extern "C" fn(
        *mut PGconn,
        *const c_char,
        c_int,
        *const u32,
        *const *const c_char,
        *const c_int,
        *const c_int,
        c_int,
    ) -> c_int,
    pub(super) PQflush: unsafe extern "C" fn(*mut PGconn) -> c_int,
    pub(super) PQisBusy: unsafe extern "C" fn(*mut PGconn) -> c_int,
    pub(super) PQconsumeInput: unsafe extern "C" fn(*mut PGconn) -> c_int,
    pub(super) PQgetResult: unsafe extern "C" fn(*mut PGconn) -> *mut PGresult,
    pub(super) PQresultStatus: unsafe extern "C" fn(*const PGresult) -> c_int,
    pub(super) PQresultErrorField: unsafe extern "C" fn(*const PGresult, c_int) -> *const c_char,
    pub(super) PQntuples: unsafe extern "C" fn(*const PGresult) -> c_int,
    pub(super) PQnfields: unsafe extern "C" fn(*const PGresult) -> c_int,
    pub(super) PQgetisnull: unsafe extern "C" fn(*const PGresult, c_int, c_int) -> c_int,
    pub(super) PQgetvalue: unsafe extern "C" fn(*const PGresult, c_int, c_int) -> *const c_char,
    pub(super) PQclear: unsafe extern "C" fn(*mut PGresult),
    PQconninfoParse: unsafe extern "C" fn(*const c_char, *mut *mut c_char) -> *mut ConninfoOption,
    PQconninfoFree: unsafe extern "C" fn(*mut ConninfoOption),
    PQfreemem: unsafe extern "C" fn(*mut std::ffi::c_void),
}

/// libpq's opaque connection and result.
#[repr(C)]
pub(super) struct PGconn {
    _private: [u8; 0],
}
#[repr(C)]
pub(super) struct PGresult {
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
pub(super) const CONNECTION_BAD: c_int = 1;
pub(super) const PGRES_POLLING_FAILED: c_int = 0;
pub(super) const PGRES_POLLING_READING: c_int = 1;
pub(super) const PGRES_POLLING_WRITING: c_int = 2;
pub(super) const PGRES_POLLING_OK: c_int = 3;
pub(super) const PGRES_COMMAND_OK: c_int = 1;
pub(super) const PGRES_TUPLES_OK: c_int = 2;
pub(super) const PG_DIAG_MESSAGE_PRIMARY: c_int = b'M' as c_int;
pub(super) const PG_DIAG_SQLSTATE: c_int = b'C' as c_int;
pub(super) const PG_DIAG_MESSAGE_DETAIL: c_int = b'D' as c_int;
pub(super) const PG_DIAG_MESSAGE_HINT: c_int = b'H' as c_int;

/// libpq, loaded on first use in this process (`Err`: why it cannot be).
static LIBPQ: OnceLock<Result<Libpq, String>> = OnceLock::new();

pub(super) fn libpq() -> Result<&'static Libpq, CallError> {
    LIBPQ
        .get_or_init(load_libpq)
        .as_ref()
        .map_err(|e| CallError::unusable(e.clone()))
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

pub(super) fn error_message(pq: &Libpq, conn: *const PGconn) -> String {
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

/// A result, cleared when dropped.
pub(super) struct PgResult(&'static Libpq, *mut PGresult);

impl PgResult {
    pub(super) fn new(pq: &'static Libpq, res: *mut PGresult) -> PgResult {
        PgResult(pq, res)
    }

    pub(super) fn status(&self) -> c_int {
        // SAFETY: a live result we own.
        unsafe { (self.0.PQresultStatus)(self.1) }
    }

    /// The error's message, with its detail and hint when the server sent
    /// them: the registry's refusals say there what to change (a limit, a
    /// setting of this server), and the holder's log is where a DBA reads.
    pub(super) fn error(&self) -> String {
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
    pub(super) fn sqlstate(&self) -> Option<String> {
        self.field(PG_DIAG_SQLSTATE)
    }

    /// The error's hint, when the server sent one.
    pub(super) fn hint(&self) -> Option<String> {
        self.field(PG_DIAG_MESSAGE_HINT)
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

    pub(super) fn rows(&self) -> Vec<Vec<Option<String>>> {
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
    let pq = libpq().map_err(|e| e.text().to_string())?;
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
