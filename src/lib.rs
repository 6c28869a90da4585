//! awcp-mount: a policed FUSE mount of an AWCP delegated workspace over SSH/SFTP.
//!
//! Layers, from the kernel down (see `docs/ARCHITECTURE.md`):
//! * [`fuse`]: the thin adapter from fuser's callbacks to the core; never touches the network.
//! * [`core`]: the filesystem (inodes, handles, caches, errno inference); knows nothing of FUSE.
//! * [`remote`]: the remote trait and its SFTP, local-directory and fault-injecting
//!   implementations.

pub mod awcp;
pub mod control;
pub mod core;
pub mod daemon;
pub mod error;
pub mod fuse;
pub mod handoff;
pub mod kernel_mount;
pub mod logging;
pub mod mount;
pub mod mount_helper;
pub mod mountinfo;
pub mod options;
pub mod policy;
pub mod remote;
pub mod unmount;
