//! FUSE integration tests (being written).
