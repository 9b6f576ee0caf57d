-- snowflake_id 0.7.0 -> 0.8.0 (ALTER EXTENSION snowflake_id UPDATE).
--
-- tests/upgrade/test_extension_upgrade.py checks that an updated database
-- has the same objects as a fresh install (0.7.0's install script is kept
-- in tests/upgrade/ for it).
--
-- One section per concern, in this order; each section says what it
-- changes and why.

-- == The registry's decisions in the Rust core (issue 42) ==

-- == Getting it, switching to it and watching it (issue 43) ==

-- == Backfill at migration scale (issue 44) ==
