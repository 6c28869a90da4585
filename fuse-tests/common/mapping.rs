//! A shared memory mapping of part of an open file, for the tests that write back or read
//! through `mmap` (git reads packs this way; editors and databases write this way).

#![allow(dead_code)] // each test binary uses a different subset

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

/// `len` bytes of a file from `offset` (a page multiple), mapped `MAP_SHARED`, unmapped on drop.
pub struct Mapping {
    ptr: *mut libc::c_void,
    len: usize,
}

impl Mapping {
    /// Maps the range readable, and writable when `writable`; panics with the errno if the
    /// kernel refuses, because every caller's test depends on the mapping.
    pub fn new(file: &File, offset: usize, len: usize, writable: bool) -> Mapping {
        let prot = if writable {
            libc::PROT_READ | libc::PROT_WRITE
        } else {
            libc::PROT_READ
        };
        // SAFETY: a fresh mapping the kernel places; the pointer is only used through the
        // slices below, which stay inside `len`, and it is unmapped once, on drop.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                prot,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                offset as libc::off_t,
            )
        };
        assert_ne!(
            ptr,
            libc::MAP_FAILED,
            "mmap: {}",
            io::Error::last_os_error()
        );
        Mapping { ptr, len }
    }

    pub fn bytes(&self) -> &[u8] {
        // SAFETY: the mapping is `len` bytes long and lives as long as `self`.
        unsafe { std::slice::from_raw_parts(self.ptr as *const u8, self.len) }
    }

    /// The mapped bytes to write; only for a mapping made `writable`.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`; `&mut self` makes this the only view.
        unsafe { std::slice::from_raw_parts_mut(self.ptr as *mut u8, self.len) }
    }

    /// `msync(MS_SYNC)`: writes the dirty pages back through the filesystem and waits.
    pub fn sync(&self) -> io::Result<()> {
        // SAFETY: the whole live mapping.
        if unsafe { libc::msync(self.ptr, self.len, libc::MS_SYNC) } == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmaps the mapping made in `new`, once; no slice outlives `self`.
        unsafe { libc::munmap(self.ptr, self.len) };
    }
}
