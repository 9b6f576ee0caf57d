//! The SQL-language part of the API, in `tools.sql`: `snowflake_decode()`
//! as one composite row over the Rust scalar decoders, IMMUTABLE decoders
//! that take the layout explicitly, `snowflake_convert_column()`,
//! `snowflake_create_partitions()`, and a COMMENT on every function, view and
//! table. It goes last in the extension script, after every Rust function.

pgrx::extension_sql_file!("tools.sql", name = "sql_tools", finalize);
