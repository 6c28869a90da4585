//! Local-directory remote (being written).
