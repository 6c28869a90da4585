//! SFTP version 3 wire format (draft-ietf-secsh-filexfer-02) plus the OpenSSH extensions we use.
//!
//! Everything here is pure: bytes in, values out. Handles and file names stay raw byte strings
//! (never a lossy UTF-8 conversion), every length read from the wire is bounds-checked, and no
//! input makes the decoder panic or allocate more than the packet it was given.

use std::ffi::OsString;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::Path;

use bytes::{BufMut, Bytes, BytesMut};

use crate::remote::{Attrs, SetAttrs, StatVfs};

/// The protocol version we speak.
pub const SFTP_VERSION: u32 = 3;

/// Largest incoming packet we accept (length field value). OpenSSH never sends more than
/// 256 KiB + a small header; anything past this is a broken or hostile server.
pub const MAX_INCOMING_PACKET: usize = 512 * 1024;

/// Largest handle we accept. The draft says handles are at most 256 bytes.
pub const MAX_HANDLE_LEN: usize = 256;

pub const FXP_INIT: u8 = 1;
pub const FXP_VERSION: u8 = 2;
pub const FXP_OPEN: u8 = 3;
pub const FXP_CLOSE: u8 = 4;
pub const FXP_READ: u8 = 5;
pub const FXP_WRITE: u8 = 6;
pub const FXP_LSTAT: u8 = 7;
pub const FXP_FSTAT: u8 = 8;
pub const FXP_SETSTAT: u8 = 9;
pub const FXP_FSETSTAT: u8 = 10;
pub const FXP_OPENDIR: u8 = 11;
pub const FXP_READDIR: u8 = 12;
pub const FXP_REMOVE: u8 = 13;
pub const FXP_MKDIR: u8 = 14;
pub const FXP_RMDIR: u8 = 15;
pub const FXP_REALPATH: u8 = 16;
pub const FXP_STAT: u8 = 17;
pub const FXP_RENAME: u8 = 18;
pub const FXP_READLINK: u8 = 19;
pub const FXP_SYMLINK: u8 = 20;
pub const FXP_STATUS: u8 = 101;
pub const FXP_HANDLE: u8 = 102;
pub const FXP_DATA: u8 = 103;
pub const FXP_NAME: u8 = 104;
pub const FXP_ATTRS: u8 = 105;
pub const FXP_EXTENDED: u8 = 200;
pub const FXP_EXTENDED_REPLY: u8 = 201;

pub const ATTR_SIZE: u32 = 0x0000_0001;
pub const ATTR_UIDGID: u32 = 0x0000_0002;
pub const ATTR_PERMISSIONS: u32 = 0x0000_0004;
pub const ATTR_ACMODTIME: u32 = 0x0000_0008;
pub const ATTR_EXTENDED: u32 = 0x8000_0000;

pub const PFLAG_READ: u32 = 0x01;
pub const PFLAG_WRITE: u32 = 0x02;
pub const PFLAG_APPEND: u32 = 0x04;
pub const PFLAG_CREAT: u32 = 0x08;
pub const PFLAG_TRUNC: u32 = 0x10;
pub const PFLAG_EXCL: u32 = 0x20;

pub const STATUS_OK: u32 = 0;

pub const EXT_POSIX_RENAME: &str = "posix-rename@openssh.com";
pub const EXT_STATVFS: &str = "statvfs@openssh.com";
pub const EXT_HARDLINK: &str = "hardlink@openssh.com";
pub const EXT_FSYNC: &str = "fsync@openssh.com";
pub const EXT_LSETSTAT: &str = "lsetstat@openssh.com";
pub const EXT_LIMITS: &str = "limits@openssh.com";
pub const EXT_COPY_DATA: &str = "copy-data";

/// A malformed packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CodecError(pub String);

impl std::fmt::Display for CodecError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for CodecError {}

fn err<T>(msg: impl Into<String>) -> Result<T, CodecError> {
    Err(CodecError(msg.into()))
}

// ------------------------------------------------------------------------------------------
// Encoding
// ------------------------------------------------------------------------------------------

/// An encoded packet, ready for the channel: a header (length, type, id, fields) and an
/// optional payload that is sent as-is after it (WRITE data, so it is never copied).
#[derive(Debug, Clone)]
pub struct OutPacket {
    pub head: Bytes,
    pub tail: Option<Bytes>,
}

impl OutPacket {
    pub fn len(&self) -> usize {
        self.head.len() + self.tail.as_ref().map_or(0, Bytes::len)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The whole packet as one buffer (tests, diagnostics).
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = self.head.to_vec();
        if let Some(t) = &self.tail {
            v.extend_from_slice(t);
        }
        v
    }
}

struct Enc {
    buf: BytesMut,
}

impl Enc {
    fn new(kind: u8) -> Enc {
        let mut buf = BytesMut::with_capacity(64);
        buf.put_u32(0); // length, patched in finish
        buf.put_u8(kind);
        Enc { buf }
    }

    fn u32(&mut self, v: u32) -> &mut Self {
        self.buf.put_u32(v);
        self
    }

    fn u64(&mut self, v: u64) -> &mut Self {
        self.buf.put_u64(v);
        self
    }

    fn string(&mut self, s: &[u8]) -> &mut Self {
        // A string longer than u32::MAX cannot be a path or handle; clamp instead of panicking
        // (the server rejects it).
        let len = u32::try_from(s.len()).unwrap_or(u32::MAX);
        self.buf.put_u32(len);
        self.buf.put_slice(&s[..len as usize]);
        self
    }

    fn path(&mut self, p: &Path) -> &mut Self {
        self.string(p.as_os_str().as_bytes())
    }

    fn attrs(&mut self, a: &SetAttrs) -> &mut Self {
        let mut flags = 0;
        if a.size.is_some() {
            flags |= ATTR_SIZE;
        }
        if a.uid_gid.is_some() {
            flags |= ATTR_UIDGID;
        }
        if a.perm.is_some() {
            flags |= ATTR_PERMISSIONS;
        }
        if a.atime_mtime.is_some() {
            flags |= ATTR_ACMODTIME;
        }
        self.u32(flags);
        if let Some(size) = a.size {
            self.u64(size);
        }
        if let Some((uid, gid)) = a.uid_gid {
            self.u32(uid).u32(gid);
        }
        if let Some(perm) = a.perm {
            self.u32(perm & 0o7777);
        }
        if let Some((atime, mtime)) = a.atime_mtime {
            self.u32(atime).u32(mtime);
        }
        self
    }

    fn finish_with(self, tail: Option<Bytes>) -> OutPacket {
        let mut buf = self.buf;
        let total = buf.len() - 4 + tail.as_ref().map_or(0, Bytes::len);
        let total = u32::try_from(total).unwrap_or(u32::MAX);
        buf[..4].copy_from_slice(&total.to_be_bytes());
        OutPacket {
            head: buf.freeze(),
            tail,
        }
    }

    fn finish(self) -> OutPacket {
        self.finish_with(None)
    }
}

/// `SSH_FXP_INIT` with version 3 and no extensions.
pub fn encode_init() -> OutPacket {
    let mut e = Enc::new(FXP_INIT);
    e.u32(SFTP_VERSION);
    e.finish()
}

/// A request the client sends. Paths and handles are borrowed raw bytes.
#[derive(Debug, Clone)]
pub enum Request<'a> {
    Open {
        path: &'a Path,
        pflags: u32,
        attrs: SetAttrs,
    },
    Close {
        handle: &'a [u8],
    },
    Read {
        handle: &'a [u8],
        offset: u64,
        len: u32,
    },
    Write {
        handle: &'a [u8],
        offset: u64,
        data: Bytes,
    },
    Lstat {
        path: &'a Path,
    },
    Fstat {
        handle: &'a [u8],
    },
    Setstat {
        path: &'a Path,
        attrs: SetAttrs,
    },
    Fsetstat {
        handle: &'a [u8],
        attrs: SetAttrs,
    },
    Opendir {
        path: &'a Path,
    },
    Readdir {
        handle: &'a [u8],
    },
    Remove {
        path: &'a Path,
    },
    Mkdir {
        path: &'a Path,
        attrs: SetAttrs,
    },
    Rmdir {
        path: &'a Path,
    },
    Realpath {
        path: &'a Path,
    },
    Stat {
        path: &'a Path,
    },
    Rename {
        from: &'a Path,
        to: &'a Path,
    },
    Readlink {
        path: &'a Path,
    },
    /// Sent in wire order: the caller decides which argument goes first (OpenSSH swaps them).
    Symlink {
        first: &'a Path,
        second: &'a Path,
    },
    PosixRename {
        from: &'a Path,
        to: &'a Path,
    },
    Statvfs {
        path: &'a Path,
    },
    Hardlink {
        existing: &'a Path,
        new: &'a Path,
    },
    Fsync {
        handle: &'a [u8],
    },
    Lsetstat {
        path: &'a Path,
        attrs: SetAttrs,
    },
    Limits,
    /// Server-side copy between two handles of one `sftp-server` process.
    CopyData {
        from: &'a [u8],
        from_offset: u64,
        len: u64,
        to: &'a [u8],
        to_offset: u64,
    },
}

impl Request<'_> {
    /// Short name for logs.
    pub fn name(&self) -> &'static str {
        match self {
            Request::Open { .. } => "OPEN",
            Request::Close { .. } => "CLOSE",
            Request::Read { .. } => "READ",
            Request::Write { .. } => "WRITE",
            Request::Lstat { .. } => "LSTAT",
            Request::Fstat { .. } => "FSTAT",
            Request::Setstat { .. } => "SETSTAT",
            Request::Fsetstat { .. } => "FSETSTAT",
            Request::Opendir { .. } => "OPENDIR",
            Request::Readdir { .. } => "READDIR",
            Request::Remove { .. } => "REMOVE",
            Request::Mkdir { .. } => "MKDIR",
            Request::Rmdir { .. } => "RMDIR",
            Request::Realpath { .. } => "REALPATH",
            Request::Stat { .. } => "STAT",
            Request::Rename { .. } => "RENAME",
            Request::Readlink { .. } => "READLINK",
            Request::Symlink { .. } => "SYMLINK",
            Request::PosixRename { .. } => EXT_POSIX_RENAME,
            Request::Statvfs { .. } => EXT_STATVFS,
            Request::Hardlink { .. } => EXT_HARDLINK,
            Request::Fsync { .. } => EXT_FSYNC,
            Request::Lsetstat { .. } => EXT_LSETSTAT,
            Request::Limits => EXT_LIMITS,
            Request::CopyData { .. } => EXT_COPY_DATA,
        }
    }

    /// Payload bytes this request moves (READ: the reply, WRITE: the request), for the
    /// bytes-in-flight bound.
    pub fn data_cost(&self) -> usize {
        match self {
            Request::Read { len, .. } => *len as usize,
            Request::Write { data, .. } => data.len(),
            _ => 0,
        }
    }
}

fn ext(id: u32, name: &str) -> Enc {
    let mut e = Enc::new(FXP_EXTENDED);
    e.u32(id).string(name.as_bytes());
    e
}

/// Encode `req` with request id `id`.
pub fn encode_request(id: u32, req: &Request<'_>) -> OutPacket {
    let simple = |kind: u8| {
        let mut e = Enc::new(kind);
        e.u32(id);
        e
    };
    match req {
        Request::Open {
            path,
            pflags,
            attrs,
        } => {
            let mut e = simple(FXP_OPEN);
            e.path(path).u32(*pflags).attrs(attrs);
            e.finish()
        }
        Request::Close { handle } => {
            let mut e = simple(FXP_CLOSE);
            e.string(handle);
            e.finish()
        }
        Request::Read {
            handle,
            offset,
            len,
        } => {
            let mut e = simple(FXP_READ);
            e.string(handle).u64(*offset).u32(*len);
            e.finish()
        }
        Request::Write {
            handle,
            offset,
            data,
        } => {
            let mut e = simple(FXP_WRITE);
            let len = u32::try_from(data.len()).unwrap_or(u32::MAX);
            e.string(handle).u64(*offset).u32(len);
            e.finish_with(Some(data.slice(..len as usize)))
        }
        Request::Lstat { path } => {
            let mut e = simple(FXP_LSTAT);
            e.path(path);
            e.finish()
        }
        Request::Fstat { handle } => {
            let mut e = simple(FXP_FSTAT);
            e.string(handle);
            e.finish()
        }
        Request::Setstat { path, attrs } => {
            let mut e = simple(FXP_SETSTAT);
            e.path(path).attrs(attrs);
            e.finish()
        }
        Request::Fsetstat { handle, attrs } => {
            let mut e = simple(FXP_FSETSTAT);
            e.string(handle).attrs(attrs);
            e.finish()
        }
        Request::Opendir { path } => {
            let mut e = simple(FXP_OPENDIR);
            e.path(path);
            e.finish()
        }
        Request::Readdir { handle } => {
            let mut e = simple(FXP_READDIR);
            e.string(handle);
            e.finish()
        }
        Request::Remove { path } => {
            let mut e = simple(FXP_REMOVE);
            e.path(path);
            e.finish()
        }
        Request::Mkdir { path, attrs } => {
            let mut e = simple(FXP_MKDIR);
            e.path(path).attrs(attrs);
            e.finish()
        }
        Request::Rmdir { path } => {
            let mut e = simple(FXP_RMDIR);
            e.path(path);
            e.finish()
        }
        Request::Realpath { path } => {
            let mut e = simple(FXP_REALPATH);
            e.path(path);
            e.finish()
        }
        Request::Stat { path } => {
            let mut e = simple(FXP_STAT);
            e.path(path);
            e.finish()
        }
        Request::Rename { from, to } => {
            let mut e = simple(FXP_RENAME);
            e.path(from).path(to);
            e.finish()
        }
        Request::Readlink { path } => {
            let mut e = simple(FXP_READLINK);
            e.path(path);
            e.finish()
        }
        Request::Symlink { first, second } => {
            let mut e = simple(FXP_SYMLINK);
            e.path(first).path(second);
            e.finish()
        }
        Request::PosixRename { from, to } => {
            let mut e = ext(id, EXT_POSIX_RENAME);
            e.path(from).path(to);
            e.finish()
        }
        Request::Statvfs { path } => {
            let mut e = ext(id, EXT_STATVFS);
            e.path(path);
            e.finish()
        }
        Request::Hardlink { existing, new } => {
            let mut e = ext(id, EXT_HARDLINK);
            e.path(existing).path(new);
            e.finish()
        }
        Request::Fsync { handle } => {
            let mut e = ext(id, EXT_FSYNC);
            e.string(handle);
            e.finish()
        }
        Request::Lsetstat { path, attrs } => {
            let mut e = ext(id, EXT_LSETSTAT);
            e.path(path).attrs(attrs);
            e.finish()
        }
        Request::Limits => ext(id, EXT_LIMITS).finish(),
        Request::CopyData {
            from,
            from_offset,
            len,
            to,
            to_offset,
        } => {
            let mut e = ext(id, EXT_COPY_DATA);
            e.string(from)
                .u64(*from_offset)
                .u64(*len)
                .string(to)
                .u64(*to_offset);
            e.finish()
        }
    }
}

// ------------------------------------------------------------------------------------------
// Decoding
// ------------------------------------------------------------------------------------------

/// A bounds-checked cursor over a packet. String fields are returned as zero-copy slices.
struct Dec {
    buf: Bytes,
    pos: usize,
}

impl Dec {
    fn new(buf: Bytes) -> Dec {
        Dec { buf, pos: 0 }
    }

    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn take(&mut self, n: usize, what: &str) -> Result<Bytes, CodecError> {
        if n > self.remaining() {
            return err(format!(
                "truncated packet: {what} needs {n} bytes, {} left",
                self.remaining()
            ));
        }
        let b = self.buf.slice(self.pos..self.pos + n);
        self.pos += n;
        Ok(b)
    }

    fn u8(&mut self, what: &str) -> Result<u8, CodecError> {
        Ok(self.take(1, what)?[0])
    }

    fn u32(&mut self, what: &str) -> Result<u32, CodecError> {
        let b = self.take(4, what)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64(&mut self, what: &str) -> Result<u64, CodecError> {
        let b = self.take(8, what)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(&b);
        Ok(u64::from_be_bytes(a))
    }

    fn string(&mut self, what: &str) -> Result<Bytes, CodecError> {
        let len = self.u32(what)? as usize;
        self.take(len, what)
    }

    fn rest(&mut self) -> Bytes {
        let b = self.buf.slice(self.pos..);
        self.pos = self.buf.len();
        b
    }

    fn attrs(&mut self) -> Result<Attrs, CodecError> {
        let flags = self.u32("attribute flags")?;
        let mut a = Attrs::default();
        if flags & ATTR_SIZE != 0 {
            a.size = Some(self.u64("size")?);
        }
        if flags & ATTR_UIDGID != 0 {
            a.uid = Some(self.u32("uid")?);
            a.gid = Some(self.u32("gid")?);
        }
        if flags & ATTR_PERMISSIONS != 0 {
            a.mode = Some(self.u32("permissions")?);
        }
        if flags & ATTR_ACMODTIME != 0 {
            a.atime = Some(self.u32("atime")?);
            a.mtime = Some(self.u32("mtime")?);
        }
        if flags & ATTR_EXTENDED != 0 {
            let count = self.u32("extended attribute count")?;
            for _ in 0..count {
                // Each pair is at least 8 bytes, so a lying count runs out of data quickly.
                self.string("extended attribute type")?;
                self.string("extended attribute data")?;
            }
        }
        Ok(a)
    }
}

/// One entry of an `SSH_FXP_NAME` reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NameEntry {
    pub filename: OsString,
    pub longname: Bytes,
    pub attrs: Attrs,
}

impl NameEntry {
    /// The link count from an `ls -l` style long name, if there is one.
    pub fn nlink(&self) -> Option<u32> {
        longname_nlink(&self.longname)
    }
}

/// A reply from the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Response {
    Status { code: u32, message: String },
    Handle(Bytes),
    Data(Bytes),
    Name(Vec<NameEntry>),
    Attrs(Attrs),
    ExtendedReply(Bytes),
}

impl Response {
    pub fn kind_name(&self) -> &'static str {
        match self {
            Response::Status { .. } => "STATUS",
            Response::Handle(_) => "HANDLE",
            Response::Data(_) => "DATA",
            Response::Name(_) => "NAME",
            Response::Attrs(_) => "ATTRS",
            Response::ExtendedReply(_) => "EXTENDED_REPLY",
        }
    }
}

/// The server's `SSH_FXP_VERSION`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Version {
    pub version: u32,
    /// Extension name and data, in the order the server sent them.
    pub extensions: Vec<(String, Bytes)>,
}

impl Version {
    pub fn has_extension(&self, name: &str) -> bool {
        self.extensions.iter().any(|(n, _)| n == name)
    }
}

/// Take one complete packet (without its length field) off the front of `buf`, if there is
/// one. An announced length above [`MAX_INCOMING_PACKET`] or below 5 is an error.
pub fn split_frame(buf: &mut BytesMut) -> Result<Option<Bytes>, CodecError> {
    if buf.len() < 4 {
        return Ok(None);
    }
    let len = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
    if len > MAX_INCOMING_PACKET {
        return err(format!(
            "server announced a {len}-byte packet (limit {MAX_INCOMING_PACKET})"
        ));
    }
    if len < 1 {
        return err("server sent an empty packet");
    }
    if buf.len() < 4 + len {
        // Make room for the rest in one go instead of growing piecemeal.
        buf.reserve(4 + len - buf.len());
        return Ok(None);
    }
    let _ = buf.split_to(4);
    Ok(Some(buf.split_to(len).freeze()))
}

/// Decode `SSH_FXP_VERSION` (the packet without its length field).
pub fn decode_version(packet: Bytes) -> Result<Version, CodecError> {
    let mut d = Dec::new(packet);
    let kind = d.u8("packet type")?;
    if kind != FXP_VERSION {
        return err(format!("expected SSH_FXP_VERSION, got packet type {kind}"));
    }
    let version = d.u32("version")?;
    let mut extensions = Vec::new();
    while d.remaining() > 0 {
        let name = d.string("extension name")?;
        let data = d.string("extension data")?;
        extensions.push((String::from_utf8_lossy(&name).into_owned(), data));
    }
    Ok(Version {
        version,
        extensions,
    })
}

/// Decode a reply (the packet without its length field). Returns the request id and the
/// reply. If the id could be read but the rest is malformed, the error carries the id so the
/// one request can be failed.
pub fn decode_response(packet: Bytes) -> Result<(u32, Response), (Option<u32>, CodecError)> {
    let mut d = Dec::new(packet);
    let kind = d.u8("packet type").map_err(|e| (None, e))?;
    let id = d.u32("request id").map_err(|e| (None, e))?;
    decode_body(kind, &mut d)
        .map(|r| (id, r))
        .map_err(|e| (Some(id), e))
}

fn decode_body(kind: u8, d: &mut Dec) -> Result<Response, CodecError> {
    let r = match kind {
        FXP_STATUS => {
            let code = d.u32("status code")?;
            // Some old servers omit message and language tag.
            let message = if d.remaining() >= 4 {
                String::from_utf8_lossy(&d.string("status message")?).into_owned()
            } else {
                String::new()
            };
            Response::Status { code, message }
        }
        FXP_HANDLE => {
            let h = d.string("handle")?;
            if h.len() > MAX_HANDLE_LEN {
                return err(format!(
                    "server sent a {}-byte handle (limit {MAX_HANDLE_LEN})",
                    h.len()
                ));
            }
            Response::Handle(h)
        }
        FXP_DATA => Response::Data(d.string("data")?),
        FXP_NAME => {
            let count = d.u32("name count")? as usize;
            // Each entry needs at least 12 bytes (two empty strings and attribute flags).
            if count > d.remaining() / 12 {
                return err(format!(
                    "NAME reply claims {count} entries in {} bytes",
                    d.remaining()
                ));
            }
            let mut names = Vec::with_capacity(count);
            for _ in 0..count {
                let filename = OsString::from_vec(d.string("file name")?.to_vec());
                let longname = d.string("long name")?;
                let attrs = d.attrs()?;
                names.push(NameEntry {
                    filename,
                    longname,
                    attrs,
                });
            }
            Response::Name(names)
        }
        FXP_ATTRS => Response::Attrs(d.attrs()?),
        FXP_EXTENDED_REPLY => Response::ExtendedReply(d.rest()),
        other => return err(format!("unexpected packet type {other} from server")),
    };
    Ok(r)
}

/// `limits@openssh.com` reply. Zero means "no limit / unknown".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ServerLimits {
    pub max_packet_len: u64,
    pub max_read_len: u64,
    pub max_write_len: u64,
    pub max_open_handles: u64,
}

pub fn decode_limits(data: Bytes) -> Result<ServerLimits, CodecError> {
    let mut d = Dec::new(data);
    Ok(ServerLimits {
        max_packet_len: d.u64("max packet length")?,
        max_read_len: d.u64("max read length")?,
        max_write_len: d.u64("max write length")?,
        max_open_handles: d.u64("max open handles")?,
    })
}

pub fn decode_statvfs(data: Bytes) -> Result<StatVfs, CodecError> {
    let mut d = Dec::new(data);
    Ok(StatVfs {
        bsize: d.u64("f_bsize")?,
        frsize: d.u64("f_frsize")?,
        blocks: d.u64("f_blocks")?,
        bfree: d.u64("f_bfree")?,
        bavail: d.u64("f_bavail")?,
        files: d.u64("f_files")?,
        ffree: d.u64("f_ffree")?,
        favail: d.u64("f_favail")?,
        fsid: d.u64("f_fsid")?,
        flag: d.u64("f_flag")?,
        namemax: d.u64("f_namemax")?,
    })
}

/// The link count in an OpenSSH `ls -l` style long name (`-rw-r--r--    1 user group ...`):
/// the second whitespace-separated field, if it is a number and the first looks like a mode.
pub fn longname_nlink(longname: &[u8]) -> Option<u32> {
    let mut fields = longname
        .split(|b| b.is_ascii_whitespace())
        .filter(|f| !f.is_empty());
    let mode = fields.next()?;
    if mode.len() < 10 || !b"-dlcbps".contains(&mode[0]) {
        return None;
    }
    let n = fields.next()?;
    if n.is_empty() || n.len() > 10 || !n.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(n).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    /// Build a server packet (length-prefixed).
    fn pkt(kind: u8, body: &[u8]) -> Vec<u8> {
        let mut v = ((body.len() + 1) as u32).to_be_bytes().to_vec();
        v.push(kind);
        v.extend_from_slice(body);
        v
    }

    fn s(b: &[u8]) -> Vec<u8> {
        let mut v = (b.len() as u32).to_be_bytes().to_vec();
        v.extend_from_slice(b);
        v
    }

    fn frame(bytes: &[u8]) -> Bytes {
        let mut b = BytesMut::from(bytes);
        let f = split_frame(&mut b).unwrap().unwrap();
        assert!(b.is_empty());
        f
    }

    #[test]
    fn encode_open_layout() {
        let p = PathBuf::from("/a/b");
        let pk = encode_request(
            7,
            &Request::Open {
                path: &p,
                pflags: PFLAG_READ | PFLAG_CREAT,
                attrs: SetAttrs {
                    perm: Some(0o100644),
                    ..Default::default()
                },
            },
        )
        .to_vec();
        let mut want = Vec::new();
        want.push(FXP_OPEN);
        want.extend_from_slice(&7u32.to_be_bytes());
        want.extend_from_slice(&s(b"/a/b"));
        want.extend_from_slice(&(PFLAG_READ | PFLAG_CREAT).to_be_bytes());
        want.extend_from_slice(&ATTR_PERMISSIONS.to_be_bytes());
        want.extend_from_slice(&0o644u32.to_be_bytes());
        let mut full = (want.len() as u32).to_be_bytes().to_vec();
        full.extend_from_slice(&want);
        assert_eq!(pk, full);
    }

    #[test]
    fn encode_write_keeps_data_separate() {
        let data = Bytes::from(vec![9u8; 1000]);
        let pk = encode_request(
            1,
            &Request::Write {
                handle: b"\x00\x00\x00\xff",
                offset: 5,
                data: data.clone(),
            },
        );
        assert_eq!(pk.tail.as_ref().unwrap(), &data);
        let v = pk.to_vec();
        let len = u32::from_be_bytes([v[0], v[1], v[2], v[3]]) as usize;
        assert_eq!(len + 4, v.len());
        // type, id, handle (4+4), offset, data length, data
        assert_eq!(v.len(), 4 + 1 + 4 + 8 + 8 + 4 + 1000);
    }

    #[test]
    fn encode_setattrs_all_fields_in_order() {
        let p = PathBuf::from("x");
        let pk = encode_request(
            2,
            &Request::Setstat {
                path: &p,
                attrs: SetAttrs {
                    size: Some(10),
                    uid_gid: Some((1, 2)),
                    perm: Some(0o755),
                    atime_mtime: Some((3, 4)),
                },
            },
        )
        .to_vec();
        let tail = &pk[4 + 1 + 4 + 5..];
        let mut want = 0xfu32.to_be_bytes().to_vec();
        want.extend_from_slice(&10u64.to_be_bytes());
        for v in [1u32, 2, 0o755, 3, 4] {
            want.extend_from_slice(&v.to_be_bytes());
        }
        assert_eq!(tail, &want[..]);
    }

    #[test]
    fn encode_extended_names() {
        let p = PathBuf::from("/x");
        let pk = encode_request(3, &Request::Statvfs { path: &p }).to_vec();
        assert_eq!(pk[4], FXP_EXTENDED);
        assert_eq!(&pk[9..13], &(EXT_STATVFS.len() as u32).to_be_bytes());
        assert_eq!(&pk[13..13 + EXT_STATVFS.len()], EXT_STATVFS.as_bytes());
        let pk = encode_request(3, &Request::Limits).to_vec();
        assert_eq!(pk.len(), 4 + 1 + 4 + 4 + EXT_LIMITS.len());
    }

    #[test]
    fn encode_copy_data() {
        let req = Request::CopyData {
            from: b"ab",
            from_offset: 5,
            len: 6,
            to: b"c",
            to_offset: 7,
        };
        let pk = encode_request(9, &req).to_vec();
        let mut want = vec![FXP_EXTENDED];
        want.extend_from_slice(&9u32.to_be_bytes());
        want.extend_from_slice(&(EXT_COPY_DATA.len() as u32).to_be_bytes());
        want.extend_from_slice(EXT_COPY_DATA.as_bytes());
        want.extend_from_slice(&2u32.to_be_bytes());
        want.extend_from_slice(b"ab");
        want.extend_from_slice(&5u64.to_be_bytes());
        want.extend_from_slice(&6u64.to_be_bytes());
        want.extend_from_slice(&1u32.to_be_bytes());
        want.extend_from_slice(b"c");
        want.extend_from_slice(&7u64.to_be_bytes());
        assert_eq!(&pk[4..], &want[..]);
        assert_eq!(&pk[..4], &(want.len() as u32).to_be_bytes());
    }

    #[test]
    fn non_utf8_names_round_trip() {
        let name = OsString::from_vec(vec![b'a', 0xff, 0xfe, b'z']);
        let p = PathBuf::from(name.clone());
        let pk = encode_request(1, &Request::Lstat { path: &p }).to_vec();
        assert!(pk.ends_with(&[b'a', 0xff, 0xfe, b'z']));

        let mut body = 9u32.to_be_bytes().to_vec();
        body.extend_from_slice(&1u32.to_be_bytes());
        body.extend_from_slice(&s(name.as_bytes()));
        body.extend_from_slice(&s(
            b"-rw-r--r--    3 root     root            0 Jan  1 00:00 x",
        ));
        body.extend_from_slice(&(ATTR_SIZE | ATTR_PERMISSIONS).to_be_bytes());
        body.extend_from_slice(&42u64.to_be_bytes());
        body.extend_from_slice(&0o100644u32.to_be_bytes());
        let (id, r) = decode_response(frame(&pkt(FXP_NAME, &body))).unwrap();
        assert_eq!(id, 9);
        let Response::Name(names) = r else { panic!() };
        assert_eq!(names.len(), 1);
        assert_eq!(names[0].filename, name);
        assert_eq!(names[0].nlink(), Some(3));
        assert_eq!(names[0].attrs.size, Some(42));
        assert_eq!(names[0].attrs.mode, Some(0o100644));
        assert_eq!(names[0].attrs.uid, None);
    }

    #[test]
    fn handles_are_raw_bytes() {
        let h = [0u8, 0, 0, 200];
        let mut body = 5u32.to_be_bytes().to_vec();
        body.extend_from_slice(&s(&h));
        let (id, r) = decode_response(frame(&pkt(FXP_HANDLE, &body))).unwrap();
        assert_eq!((id, r), (5, Response::Handle(Bytes::copy_from_slice(&h))));
    }

    #[test]
    fn attrs_with_extended_pairs_and_all_fields() {
        let mut body = 1u32.to_be_bytes().to_vec();
        body.extend_from_slice(
            &(ATTR_SIZE | ATTR_UIDGID | ATTR_PERMISSIONS | ATTR_ACMODTIME | ATTR_EXTENDED)
                .to_be_bytes(),
        );
        body.extend_from_slice(&7u64.to_be_bytes());
        for v in [1000u32, 1001, 0o40755, 11, 12] {
            body.extend_from_slice(&v.to_be_bytes());
        }
        body.extend_from_slice(&2u32.to_be_bytes());
        for x in [&b"a"[..], b"b", b"cc", b""] {
            body.extend_from_slice(&s(x));
        }
        let (_, r) = decode_response(frame(&pkt(FXP_ATTRS, &body))).unwrap();
        assert_eq!(
            r,
            Response::Attrs(Attrs {
                size: Some(7),
                uid: Some(1000),
                gid: Some(1001),
                mode: Some(0o40755),
                atime: Some(11),
                mtime: Some(12),
            })
        );
    }

    #[test]
    fn status_with_and_without_message() {
        let mut body = 3u32.to_be_bytes().to_vec();
        body.extend_from_slice(&4u32.to_be_bytes());
        body.extend_from_slice(&s(b"Failure"));
        body.extend_from_slice(&s(b"en"));
        let (_, r) = decode_response(frame(&pkt(FXP_STATUS, &body))).unwrap();
        assert_eq!(
            r,
            Response::Status {
                code: 4,
                message: "Failure".into()
            }
        );
        let mut body = 3u32.to_be_bytes().to_vec();
        body.extend_from_slice(&1u32.to_be_bytes());
        let (_, r) = decode_response(frame(&pkt(FXP_STATUS, &body))).unwrap();
        assert_eq!(
            r,
            Response::Status {
                code: 1,
                message: String::new()
            }
        );
    }

    #[test]
    fn version_collects_extensions() {
        let mut body = 3u32.to_be_bytes().to_vec();
        body.extend_from_slice(&s(EXT_POSIX_RENAME.as_bytes()));
        body.extend_from_slice(&s(b"1"));
        body.extend_from_slice(&s(EXT_LIMITS.as_bytes()));
        body.extend_from_slice(&s(b"1"));
        let v = decode_version(frame(&pkt(FXP_VERSION, &body))).unwrap();
        assert_eq!(v.version, 3);
        assert!(v.has_extension(EXT_LIMITS));
        assert!(!v.has_extension(EXT_FSYNC));
        // Truncated extension list.
        let mut body = 3u32.to_be_bytes().to_vec();
        body.extend_from_slice(&s(b"abc"));
        body.extend_from_slice(&10u32.to_be_bytes());
        assert!(decode_version(frame(&pkt(FXP_VERSION, &body))).is_err());
        assert!(decode_version(frame(&pkt(FXP_STATUS, &body))).is_err());
    }

    #[test]
    fn limits_and_statvfs() {
        let mut d = Vec::new();
        for v in [262144u64, 261120, 261120, 1019] {
            d.extend_from_slice(&v.to_be_bytes());
        }
        let l = decode_limits(Bytes::from(d.clone())).unwrap();
        assert_eq!(l.max_read_len, 261120);
        assert_eq!(l.max_open_handles, 1019);
        assert!(decode_limits(Bytes::from(d[..31].to_vec())).is_err());
        let mut d = Vec::new();
        for v in 1..=11u64 {
            d.extend_from_slice(&v.to_be_bytes());
        }
        let s = decode_statvfs(Bytes::from(d.clone())).unwrap();
        assert_eq!((s.bsize, s.namemax), (1, 11));
        assert!(decode_statvfs(Bytes::from(d[..80].to_vec())).is_err());
    }

    #[test]
    fn framing_partial_and_multiple() {
        let mut a = pkt(FXP_DATA, &[0, 0, 0, 1, 0, 0, 0, 2, b'h', b'i']);
        let b = pkt(FXP_DATA, &[0, 0, 0, 2, 0, 0, 0, 0]);
        a.extend_from_slice(&b);
        let mut buf = BytesMut::new();
        let mut got = Vec::new();
        for chunk in a.chunks(3) {
            buf.extend_from_slice(chunk);
            while let Some(f) = split_frame(&mut buf).unwrap() {
                got.push(decode_response(f).unwrap());
            }
        }
        assert_eq!(
            got,
            vec![
                (1, Response::Data(Bytes::from_static(b"hi"))),
                (2, Response::Data(Bytes::new()))
            ]
        );
    }

    #[test]
    fn framing_rejects_huge_and_empty() {
        let mut buf = BytesMut::from(&((MAX_INCOMING_PACKET + 1) as u32).to_be_bytes()[..]);
        assert!(split_frame(&mut buf).is_err());
        let mut buf = BytesMut::from(&u32::MAX.to_be_bytes()[..]);
        assert!(split_frame(&mut buf).is_err());
        let mut buf = BytesMut::from(&0u32.to_be_bytes()[..]);
        assert!(split_frame(&mut buf).is_err());
        let mut buf = BytesMut::from(&[0u8, 0][..]);
        assert_eq!(split_frame(&mut buf).unwrap(), None);
    }

    #[test]
    fn malformed_replies_are_errors_not_panics() {
        // Data length beyond packet.
        let mut body = 1u32.to_be_bytes().to_vec();
        body.extend_from_slice(&1000u32.to_be_bytes());
        let e = decode_response(frame(&pkt(FXP_DATA, &body))).unwrap_err();
        assert_eq!(e.0, Some(1));
        // No id.
        assert_eq!(
            decode_response(Bytes::from_static(&[FXP_DATA, 0]))
                .unwrap_err()
                .0,
            None
        );
        assert!(decode_response(Bytes::new()).is_err());
        // Name count far beyond the data.
        let mut body = 1u32.to_be_bytes().to_vec();
        body.extend_from_slice(&u32::MAX.to_be_bytes());
        assert!(decode_response(frame(&pkt(FXP_NAME, &body))).is_err());
        // Extended attribute count lies.
        let mut body = 1u32.to_be_bytes().to_vec();
        body.extend_from_slice(&ATTR_EXTENDED.to_be_bytes());
        body.extend_from_slice(&u32::MAX.to_be_bytes());
        assert!(decode_response(frame(&pkt(FXP_ATTRS, &body))).is_err());
        // Oversized handle.
        let mut body = 1u32.to_be_bytes().to_vec();
        body.extend_from_slice(&s(&[0u8; 300]));
        assert!(decode_response(frame(&pkt(FXP_HANDLE, &body))).is_err());
        // Unknown type.
        let body = 1u32.to_be_bytes().to_vec();
        assert!(decode_response(frame(&pkt(77, &body))).is_err());
    }

    #[test]
    fn decoder_survives_random_garbage() {
        // A small deterministic xorshift fuzz: every prefix and mutation must decode or error.
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for _ in 0..20_000 {
            let len = (next() % 64) as usize;
            let mut v: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            if let Some(first) = v.first_mut() {
                *first = [FXP_STATUS, FXP_HANDLE, FXP_DATA, FXP_NAME, FXP_ATTRS, 201]
                    [(next() % 6) as usize];
            }
            let _ = decode_response(Bytes::from(v.clone()));
            let _ = decode_version(Bytes::from(v.clone()));
            let _ = decode_limits(Bytes::from(v.clone()));
            let _ = decode_statvfs(Bytes::from(v.clone()));
            let mut b = BytesMut::from(&v[..]);
            let _ = split_frame(&mut b);
            let _ = longname_nlink(&v);
        }
    }

    #[test]
    fn nlink_parsing() {
        assert_eq!(
            longname_nlink(b"drwxr-xr-x   12 root root 4096 Jan  1 00:00 dir"),
            Some(12)
        );
        assert_eq!(longname_nlink(b"-rw-r--r-- 1 a b 0 x"), Some(1));
        assert_eq!(longname_nlink(b"name-only"), None);
        assert_eq!(longname_nlink(b""), None);
        assert_eq!(longname_nlink(b"-rw-r--r-- x a b"), None);
        assert_eq!(longname_nlink(b"-rw-r--r-- 99999999999 a"), None);
        assert_eq!(longname_nlink(b"Xrw-r--r-- 1 a"), None);
    }
}
