//! `snowflake_to_public()` and `snowflake_from_public()`: the SQL side of
//! public IDs (the cipher and the text form are in `public_id`).
//!
//! Both are STABLE (the answer depends on `snowflake_id.public_key` and the
//! layout), STRICT and PARALLEL SAFE (parallel workers get the leader's
//! settings). They use neither shared memory nor the clock, so they work
//! without preloading. The round keys are derived once per process and key
//! setting, and again only after the setting changes.

use crate::errors;
use crate::gucs;
use crate::layout::PartError;
use crate::public_id::{self, Codec, Token};
use pgrx::callconv::{BoxRet, FcInfo};
use pgrx::datum::Datum;
use pgrx::prelude::*;
use std::cell::{Cell, RefCell};

thread_local! {
    /// The codec for the keys in force, or `None` when no key is set.
    static CODEC: RefCell<Option<Codec>> = const { RefCell::new(None) };
    /// `gucs::public_key_version()` when `CODEC` was built (never 0 once built).
    static CODEC_VERSION: Cell<u64> = const { Cell::new(u64::MAX) };
}

fn with_codec<R>(function: &str, f: impl FnOnce(&Codec) -> R) -> R {
    let version = gucs::public_key_version();
    if CODEC_VERSION.get() != version {
        let keys = gucs::public_keys();
        let codec = (!keys.is_empty()).then(|| Codec::new(&keys, gucs::layout().total_bits));
        CODEC.set(codec);
        CODEC_VERSION.set(version);
    }
    CODEC.with_borrow(|codec| match codec {
        Some(codec) => f(codec),
        None => errors::no_public_key(function),
    })
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
                max: gucs::layout().max_id(),
            }),
        }
    })
}

/// The ID of a token made by `snowflake_to_public()` with one of the keys
/// of `snowflake_id.public_key`: `WHERE id = snowflake_from_public($1)`.
#[pg_extern(stable, strict, parallel_safe)]
fn snowflake_from_public(token: &str) -> i64 {
    with_codec("snowflake_from_public", |codec| {
        match codec.decode(token.as_bytes()) {
            // Below 2^63 by construction (width <= 63).
            Ok(id) => id as i64,
            Err(problem) => errors::bad_public_id(
                token,
                &problem.to_string(),
                public_id::token_len(codec.width()),
            ),
        }
    })
}
