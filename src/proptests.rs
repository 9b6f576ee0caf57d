//! Property-based tests of the pure core (layout, generator, ranges).
