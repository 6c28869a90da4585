//! Helpers shared by the integration tests.
pub mod mapping;
pub mod mount;
pub mod sshd;
