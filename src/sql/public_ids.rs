//! `snowflake_to_public()` and `snowflake_from_public()`: the SQL side of
//! public IDs (the cipher and the text form are in `public_id`).
//!
//! Both are STABLE (the answer depends on the keys of
//! `snowflake_id.public_key_file` and the layout), STRICT and PARALLEL SAFE
//! (parallel workers get the leader's settings and read the same file).
//! They use neither shared memory nor the clock, so they work without
//! preloading. The keys are read and the round keys derived once per
//! process, and again only after a reload.

use crate::errors;
use crate::settings;
use parking_lot::{const_mutex, Mutex};
use pgrx::callconv::{Arg, ArgAbi, BoxRet, FcInfo};
use pgrx::datum::Datum;
use pgrx::prelude::*;
use snowflake_core::layout::PartError;
use snowflake_core::public_id::{self, Codec, Token};

/// This process's codec, as built from the key file.
struct CachedCodec {
    /// `settings::public_key_stamp()` when it was built.
    stamp: (u64, i64),
    /// The codec for the keys in force (`None` when no key file is named).
    codec: Option<Codec>,
}

/// This process's codec: `None` until first used, and after a failed read.
static CODEC: Mutex<Option<CachedCodec>> = const_mutex(None);

/// Runs `f` with the codec of the keys in force. The key file is read
/// again only after this process reloaded its configuration or the
/// setting changed (a process-local stamp, checked on every call, no
/// system call); a file that cannot be used is an error on every call
/// until it is fixed (58P01, 42501, 22023), never old keys.
fn with_codec<R>(function: &str, f: impl FnOnce(&Codec) -> R) -> R {
    let stamp = settings::public_key_stamp();
    let mut cached = CODEC.lock();
    if cached.as_ref().map(|built| built.stamp) != Some(stamp) {
        *cached = None;
        match settings::public_keys() {
            Ok(keys) => {
                let width = settings::layout().total_bits;
                *cached = Some(CachedCodec {
                    stamp,
                    codec: keys.map(|keys| Codec::new(&keys, width)),
                });
            }
            Err((path, err)) => {
                drop(cached);
                let shown = settings::may_read_hidden_settings().then_some(path.as_str());
                errors::public_key_file(shown, &err)
            }
        }
    }
    match cached.as_ref().and_then(|built| built.codec.as_ref()) {
        Some(codec) => f(codec),
        None => {
            drop(cached);
            errors::no_public_key(function)
        }
    }
}

/// A token returned as SQL `text` straight from its stack bytes: one
/// palloc'd copy, with no Rust heap `String` and no UTF-8 re-check in
/// between (together about a tenth of a call's cost).
struct TokenText(Token);

impl_sql_translatable!(TokenText, "text");

// SAFETY: `box_into` returns a `text` Datum, as the SQL mapping above
// declares.
unsafe impl BoxRet for TokenText {
    unsafe fn box_into<'fcx>(self, fcinfo: &mut FcInfo<'fcx>) -> Datum<'fcx> {
        let bytes = self.0.as_bytes();
        // SAFETY: `bytes` is valid for its length (at most MAX_TOKEN_LEN, so
        // the cast cannot truncate) and holds only ASCII; PostgreSQL copies
        // it into a new text value in the current memory context.
        let text =
            unsafe { pg_sys::cstring_to_text_with_len(bytes.as_ptr().cast(), bytes.len() as i32) };
        // SAFETY: a valid varlena Datum of the declared return type.
        unsafe { fcinfo.return_raw_datum(pg_sys::Datum::from(text)) }
    }
}

/// The public form of an ID: a fixed-length Crockford base32 token that
/// hides the ID's time, worker and sequence. Reversed by
/// `snowflake_from_public()`.
#[pg_extern(stable, strict, parallel_safe)]
fn snowflake_to_public(id: i64) -> TokenText {
    with_codec("snowflake_to_public", |codec| {
        let token = u64::try_from(id).ok().and_then(|v| codec.encode(v));
        match token {
            Some(token) => TokenText(token),
            None => errors::part_out_of_range(PartError::Id {
                value: id,
                max: settings::layout().max_id(),
            }),
        }
    })
}

/// A token argument as the bytes of its `text` value, in the database's
/// encoding, unconverted: decoding needs only ASCII, and a Rust `&str`
/// cannot hold other bytes of a LATIN1 or SQL_ASCII database (pgrx's
/// conversion fails there with XX000).
struct TokenBytes<'fcx>(&'fcx [u8]);

impl_sql_translatable!(TokenBytes<'_>, "text");

// SAFETY: declared `text`, a varlena, which the `&[u8]` conversion reads
// (detoasted) without looking at its encoding.
unsafe impl<'fcx> ArgAbi<'fcx> for TokenBytes<'fcx> {
    unsafe fn unbox_arg_unchecked(arg: Arg<'_, 'fcx>) -> Self {
        // SAFETY: a non-null varlena argument (the function is STRICT).
        TokenBytes(unsafe { arg.unbox_arg_using_from_datum::<&'fcx [u8]>() }.unwrap_or_default())
    }
}

/// Characters (in the database's encoding) in the first `len` bytes of
/// `bytes`.
fn chars_in(bytes: &[u8], len: usize) -> usize {
    let len = len.min(bytes.len()).min(i32::MAX as usize);
    // SAFETY: `bytes` is valid for `len` bytes of a text value, which
    // PostgreSQL has verified to be in the database's encoding.
    let n = unsafe { pg_sys::pg_mbstrlen_with_len(bytes.as_ptr().cast(), len as i32) };
    usize::try_from(n).unwrap_or(0)
}

/// At most the first 41 characters of a bad token, for its error message:
/// as written in a UTF-8 database, with `?` for every byte that is not
/// ASCII in others.
fn shown_token(bytes: &[u8]) -> String {
    let head = &bytes[..bytes.len().min(41 * 4)];
    // SAFETY: reads the database's encoding, fixed for the session.
    let utf8 = unsafe { pg_sys::GetDatabaseEncoding() } == pg_sys::pg_enc::PG_UTF8 as i32;
    if utf8 {
        String::from_utf8_lossy(head).chars().take(41).collect()
    } else {
        head.iter()
            .take(41)
            .map(|&b| if b.is_ascii() { b as char } else { '?' })
            .collect()
    }
}

/// The ID of a token made by `snowflake_to_public()` with one of the keys
/// in `snowflake_id.public_key_file`: `WHERE id = snowflake_from_public($1)`.
#[pg_extern(stable, strict, parallel_safe)]
fn snowflake_from_public(token: TokenBytes<'_>) -> i64 {
    let token = token.0;
    with_codec("snowflake_from_public", |codec| {
        let want = public_id::token_len(codec.width());
        // Every character of a token is ASCII (one byte in any encoding):
        // with any other, say so in characters, not bytes.
        let decoded = match token.iter().position(|b| !b.is_ascii()) {
            None => codec.decode(token),
            Some(at) => match chars_in(token, token.len()) {
                got if got != want => Err(public_id::TokenError::Length { got, want }),
                _ => Err(public_id::TokenError::Character {
                    position: chars_in(token, at) + 1,
                }),
            },
        };
        match decoded {
            // Below 2^63 by construction (width <= 63).
            Ok(id) => id as i64,
            Err(problem) => errors::bad_public_id(
                &shown_token(token),
                &problem.to_string(),
                public_id::token_len(codec.width()),
            ),
        }
    })
}
