//! `#[pg_test]`s: run inside a server that preloads the extension.
use pgrx::prelude::*;
