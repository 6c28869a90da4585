//! SFTP remote (being written).
