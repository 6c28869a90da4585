//! Fault-injecting remote (being written).
