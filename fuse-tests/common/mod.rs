//! Helpers shared by the integration tests.
pub mod mount;
pub mod sshd;
