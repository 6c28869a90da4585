//! Unit tests of the core against the local-directory remote (being written).
