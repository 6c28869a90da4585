//! AWCP v1 on the wire (HTTP + SSE binding, camelCase): the five messages, the four SSE task
//! events, the error codes and both state machines, with strict validation.
//!
//! Parsing is in two steps so every refusal names what is wrong: the JSON is decoded with the
//! path of a bad field (`lease.accessMode: unknown variant ...`), then [`Message::validate`]
//! checks values serde cannot (id alphabet and length, TTL bounds, timestamps, host, user,
//! export locator, key and certificate). Unknown fields are ignored, as the reference
//! implementation and JSON-based A2A peers do, so a newer delegator's additions do not break
//! us; unknown *transports* are kept as raw JSON and refused at admission with `DEP_MISSING`.
//!
//! Field order in the structs is the order of the wire examples, so serialising a parsed
//! message gives the same bytes back (see the round-trip tests).

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The protocol version this executor speaks.
pub const PROTOCOL_VERSION: &str = "1";
/// Longest delegation id accepted. The reference mints `dlg_` + 32 hex digits (36 chars).
pub const MAX_ID_LEN: usize = 128;
/// Longest lease accepted from any delegator (30 days); the policy narrows it further.
pub const MAX_TTL_SECONDS: u64 = 30 * 86_400;
/// Bounds on free text, so a message cannot make us hold or forward unbounded data.
pub const MAX_DESCRIPTION: usize = 4 * 1024;
pub const MAX_PROMPT: usize = 512 * 1024;
pub const MAX_TEXT: usize = 64 * 1024;
pub const MAX_KEY_TEXT: usize = 16 * 1024;
pub const MAX_PATH_TEXT: usize = 4096;

/// A string field fixed to one value (`"version":"1"`, `"type":"INVITE"`): serialises as that
/// value and refuses any other, so a message can never be read as another kind.
macro_rules! tag {
    ($name:ident, $text:literal) => {
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
        pub struct $name;
        impl $name {
            pub const TEXT: &'static str = $text;
        }
        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str($text)
            }
        }
        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let v = String::deserialize(d)?;
                if v == $text {
                    Ok($name)
                } else {
                    Err(serde::de::Error::custom(format!(
                        "expected \"{}\", found \"{}\"",
                        $text, v
                    )))
                }
            }
        }
    };
}

tag!(V1, "1");
tag!(InviteTag, "INVITE");
tag!(AcceptTag, "ACCEPT");
tag!(StartTag, "START");
tag!(DoneTag, "DONE");
tag!(ErrorTag, "ERROR");
tag!(SshfsTag, "sshfs");
tag!(StatusTag, "status");
tag!(SnapshotTag, "snapshot");
tag!(DoneEventTag, "done");
tag!(ErrorEventTag, "error");

// ------------------------------------------------------------------ small value types

/// Access to the lent workspace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum Access {
    Ro,
    Rw,
}

impl fmt::Display for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Access::Ro => "ro",
            Access::Rw => "rw",
        })
    }
}

impl From<crate::policy::AccessMode> for Access {
    fn from(m: crate::policy::AccessMode) -> Self {
        match m {
            crate::policy::AccessMode::Ro => Access::Ro,
            crate::policy::AccessMode::Rw => Access::Rw,
        }
    }
}

impl From<Access> for crate::policy::AccessMode {
    fn from(a: Access) -> Self {
        match a {
            Access::Ro => crate::policy::AccessMode::Ro,
            Access::Rw => crate::policy::AccessMode::Rw,
        }
    }
}

/// A delegation id that passed [`DelegationId::parse`]: 1 to [`MAX_ID_LEN`] characters of
/// `[A-Za-z0-9_-]`. Only this type is ever joined to a path (`../x`, `/etc`, `.` and empty
/// names cannot be built from that alphabet).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(transparent)]
pub struct DelegationId(String);

impl DelegationId {
    pub fn parse(s: &str) -> Result<DelegationId, String> {
        if s.is_empty() {
            return Err("empty delegation id".into());
        }
        if s.len() > MAX_ID_LEN {
            return Err(format!(
                "delegation id of {} bytes is longer than the {MAX_ID_LEN} allowed",
                s.len()
            ));
        }
        if s.starts_with('-') {
            return Err(format!(
                "delegation id {:?} starts with '-' (it could be read as an option)",
                truncate(s, 80)
            ));
        }
        if let Some(c) = s
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || *c == '_' || *c == '-'))
        {
            return Err(format!(
                "delegation id {:?} contains {c:?}: only letters, digits, '_' and '-' are allowed",
                truncate(s, 80)
            ));
        }
        Ok(DelegationId(s.to_string()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// `dir/<id>`: safe because the alphabet has no `/` and the id is never `.` or `..`.
    pub fn path_in(&self, dir: &std::path::Path) -> std::path::PathBuf {
        dir.join(&self.0)
    }
}

impl<'de> Deserialize<'de> for DelegationId {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        DelegationId::parse(&s).map_err(serde::de::Error::custom)
    }
}

impl fmt::Display for DelegationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The error codes of the protocol (spec table, reference implementation, and `NOT_FOUND`
/// for unknown ids). A code we do not know (from a newer peer) is kept as it came.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ErrorCode {
    Declined,
    DepMissing,
    WorkspaceTooLarge,
    WorkspaceNotFound,
    WorkspaceInvalid,
    SensitiveFiles,
    WorkdirDenied,
    MountpointDenied,
    StartExpired,
    Expired,
    AuthFailed,
    SetupFailed,
    MountFailed,
    TaskFailed,
    Cancelled,
    TransportError,
    ChecksumMismatch,
    NotFound,
    Other(String),
}

const CODES: &[(ErrorCode, &str)] = &[
    (ErrorCode::Declined, "DECLINED"),
    (ErrorCode::DepMissing, "DEP_MISSING"),
    (ErrorCode::WorkspaceTooLarge, "WORKSPACE_TOO_LARGE"),
    (ErrorCode::WorkspaceNotFound, "WORKSPACE_NOT_FOUND"),
    (ErrorCode::WorkspaceInvalid, "WORKSPACE_INVALID"),
    (ErrorCode::SensitiveFiles, "SENSITIVE_FILES"),
    (ErrorCode::WorkdirDenied, "WORKDIR_DENIED"),
    (ErrorCode::MountpointDenied, "MOUNTPOINT_DENIED"),
    (ErrorCode::StartExpired, "START_EXPIRED"),
    (ErrorCode::Expired, "EXPIRED"),
    (ErrorCode::AuthFailed, "AUTH_FAILED"),
    (ErrorCode::SetupFailed, "SETUP_FAILED"),
    (ErrorCode::MountFailed, "MOUNT_FAILED"),
    (ErrorCode::TaskFailed, "TASK_FAILED"),
    (ErrorCode::Cancelled, "CANCELLED"),
    (ErrorCode::TransportError, "TRANSPORT_ERROR"),
    (ErrorCode::ChecksumMismatch, "CHECKSUM_MISMATCH"),
    (ErrorCode::NotFound, "NOT_FOUND"),
];

impl ErrorCode {
    pub fn as_str(&self) -> &str {
        match self {
            ErrorCode::Other(s) => s,
            known => CODES
                .iter()
                .find(|(c, _)| c == known)
                .map(|(_, s)| *s)
                .unwrap_or("UNKNOWN"),
        }
    }

    pub fn parse(s: &str) -> ErrorCode {
        CODES
            .iter()
            .find(|(_, t)| *t == s)
            .map(|(c, _)| c.clone())
            .unwrap_or_else(|| ErrorCode::Other(s.to_string()))
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for ErrorCode {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for ErrorCode {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(ErrorCode::parse(&String::deserialize(d)?))
    }
}

// ------------------------------------------------------------------ messages

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskSpec {
    pub description: String,
    pub prompt: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LeaseConfig {
    pub ttl_seconds: u64,
    pub access_mode: Access,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResourceDecl {
    pub name: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub mode: Access,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EnvironmentDecl {
    pub resources: Vec<ResourceDecl>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct Requirements {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transport: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AuthType {
    Bearer,
    ApiKey,
    Oauth2,
    Custom,
}

#[derive(Clone, PartialEq, Serialize, Deserialize)]
pub struct AuthCredential {
    #[serde(rename = "type")]
    pub kind: AuthType,
    pub credential: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<BTreeMap<String, String>>,
}

impl fmt::Debug for AuthCredential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AuthCredential")
            .field("kind", &self.kind)
            .field("credential", &"<redacted>")
            .finish()
    }
}

/// INVITE: delegator -> executor.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Invite {
    pub version: V1,
    #[serde(rename = "type")]
    pub kind: InviteTag,
    pub delegation_id: String,
    pub task: TaskSpec,
    pub lease: LeaseConfig,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub environment: Option<EnvironmentDecl>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requirements: Option<Requirements>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<AuthCredential>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkDir {
    pub path: String,
}

/// What the executor promises to enforce on the task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct SandboxProfile {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd_only: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_network: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_exec: Option<bool>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct ExecutorConstraints {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accepted_access_mode: Option<Access>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_ttl_seconds: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox_profile: Option<SandboxProfile>,
}

/// ACCEPT: executor -> delegator (the INVITE's HTTP response).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Accept {
    pub version: V1,
    #[serde(rename = "type")]
    pub kind: AcceptTag,
    pub delegation_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention_ms: Option<u64>,
    pub executor_work_dir: WorkDir,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub executor_constraints: Option<ExecutorConstraints>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ActiveLease {
    pub expires_at: String,
    pub access_mode: Access,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Endpoint {
    pub host: String,
    pub port: u16,
    pub user: String,
}

#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SshCredential {
    pub private_key: String,
    pub certificate: String,
}

impl fmt::Debug for SshCredential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SshCredential(<redacted>)")
    }
}

/// The `sshfs` transport handle of START.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SshfsHandle {
    pub transport: SshfsTag,
    pub endpoint: Endpoint,
    pub export_locator: String,
    pub credential: SshCredential,
    /// Suggested mount options. Never passed to anything: the executor's policy decides.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub options: Option<BTreeMap<String, String>>,
}

/// START's `transportHandle`: `sshfs` typed, any other transport kept as it came (and
/// refused with `DEP_MISSING`). Its Debug never shows the raw form, which may hold secrets.
#[derive(Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum TransportHandle {
    Sshfs(SshfsHandle),
    Other(serde_json::Value),
}

impl TransportHandle {
    pub fn transport(&self) -> &str {
        match self {
            TransportHandle::Sshfs(_) => SshfsTag::TEXT,
            TransportHandle::Other(v) => v["transport"].as_str().unwrap_or("?"),
        }
    }
}

impl fmt::Debug for TransportHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TransportHandle::Sshfs(h) => h.fmt(f),
            TransportHandle::Other(_) => write!(f, "TransportHandle({})", self.transport()),
        }
    }
}

impl<'de> Deserialize<'de> for TransportHandle {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let v = serde_json::Value::deserialize(d)?;
        match v.get("transport").map(|t| t.as_str()) {
            None => Err(D::Error::custom("missing field `transport`")),
            Some(None) => Err(D::Error::custom("`transport` must be a string")),
            Some(Some("sshfs")) => serde_path_to_error::deserialize(v)
                .map(TransportHandle::Sshfs)
                // The inner path travels in the message, split off again by `typed`.
                .map_err(|e| D::Error::custom(format!("{}{PATH_SEP}{}", e.path(), e.inner()))),
            Some(Some(_)) => Ok(TransportHandle::Other(v)),
        }
    }
}

/// START: delegator -> executor. Older reference versions called the handle `workDir`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Start {
    pub version: V1,
    #[serde(rename = "type")]
    pub kind: StartTag,
    pub delegation_id: String,
    pub lease: ActiveLease,
    #[serde(alias = "workDir")]
    pub transport_handle: TransportHandle,
}

/// DONE: executor -> delegator (carried by the SSE `done` event in the HTTP binding).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Done {
    pub version: V1,
    #[serde(rename = "type")]
    pub kind: DoneTag,
    pub delegation_id: String,
    pub final_summary: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub highlights: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notes: Option<String>,
}

/// ERROR: either side.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ErrorMessage {
    pub version: V1,
    #[serde(rename = "type")]
    pub kind: ErrorTag,
    pub delegation_id: String,
    pub code: ErrorCode,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hint: Option<String>,
}

impl ErrorMessage {
    pub fn new(
        id: &str,
        code: ErrorCode,
        message: impl Into<String>,
        hint: Option<String>,
    ) -> Self {
        ErrorMessage {
            version: V1,
            kind: ErrorTag,
            delegation_id: id.to_string(),
            code,
            message: message.into(),
            hint,
        }
    }
}

/// Any AWCP message.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Message {
    Invite(Invite),
    Accept(Accept),
    Start(Start),
    Done(Done),
    Error(ErrorMessage),
}

/// Why a message was refused: the field (a JSON path) and the reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct ProtocolError {
    pub field: String,
    pub reason: String,
    /// The message's delegation id, when it had a valid one (to address an ERROR reply).
    pub delegation_id: Option<DelegationId>,
    /// The protocol code this refusal maps to when it is reported as an ERROR or event.
    pub code: ErrorCode,
}

fn perr(field: &str, reason: impl Into<String>) -> ProtocolError {
    ProtocolError {
        field: field.to_string(),
        reason: reason.into(),
        delegation_id: None,
        code: ErrorCode::Declined,
    }
}

/// Separates a nested field path from the reason in errors of hand-written deserializers.
const PATH_SEP: char = '\u{1f}';

fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

impl Message {
    pub fn kind(&self) -> &'static str {
        match self {
            Message::Invite(_) => InviteTag::TEXT,
            Message::Accept(_) => AcceptTag::TEXT,
            Message::Start(_) => StartTag::TEXT,
            Message::Done(_) => DoneTag::TEXT,
            Message::Error(_) => ErrorTag::TEXT,
        }
    }

    pub fn delegation_id(&self) -> &str {
        match self {
            Message::Invite(m) => &m.delegation_id,
            Message::Accept(m) => &m.delegation_id,
            Message::Start(m) => &m.delegation_id,
            Message::Done(m) => &m.delegation_id,
            Message::Error(m) => &m.delegation_id,
        }
    }

    /// Decode a message without checking values (round trips, messages we produced).
    pub fn decode(value: serde_json::Value) -> Result<Message, ProtocolError> {
        let obj = value
            .as_object()
            .ok_or_else(|| perr("(body)", "an AWCP message must be a JSON object"))?;
        let kind = match obj.get("type") {
            None => {
                return Err(perr(
                    "type",
                    "missing (expected INVITE, ACCEPT, START, DONE or ERROR)",
                ))
            }
            Some(serde_json::Value::String(s)) => s.clone(),
            Some(other) => return Err(perr("type", format!("must be a string, found {other}"))),
        };
        match obj.get("version") {
            None => {
                return Err(perr(
                    "version",
                    "missing (this executor speaks version \"1\")",
                ))
            }
            Some(serde_json::Value::String(v)) if v == PROTOCOL_VERSION => {}
            Some(v) => {
                return Err(perr(
                    "version",
                    format!("unsupported protocol version {v} (this executor speaks \"1\")"),
                ))
            }
        }
        fn typed<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> Result<T, ProtocolError> {
            serde_path_to_error::deserialize(v).map_err(|e| {
                let mut path = e.path().to_string();
                let mut reason = e.inner().to_string();
                if let Some((inner, why)) = reason.clone().split_once(PATH_SEP) {
                    path = format!("{path}.{inner}");
                    reason = why.to_string();
                }
                perr(if path == "." { "(message)" } else { &path }, reason)
            })
        }
        Ok(match kind.as_str() {
            "INVITE" => Message::Invite(typed(value)?),
            "ACCEPT" => Message::Accept(typed(value)?),
            "START" => Message::Start(typed(value)?),
            "DONE" => Message::Done(typed(value)?),
            "ERROR" => Message::Error(typed(value)?),
            other => {
                return Err(perr(
                    "type",
                    format!(
                        "unknown message type {:?} (expected INVITE, ACCEPT, START, DONE or ERROR)",
                        truncate(other, 40)
                    ),
                ))
            }
        })
    }

    /// Parse and validate a message received from a peer.
    pub fn parse(body: &[u8]) -> Result<Message, ProtocolError> {
        let value: serde_json::Value = serde_json::from_slice(body)
            .map_err(|e| perr("(body)", format!("not valid JSON: {e}")))?;
        let id = value
            .get("delegationId")
            .and_then(|v| v.as_str())
            .and_then(|s| DelegationId::parse(s).ok());
        let m = Message::decode(value).map_err(|mut e| {
            e.delegation_id = id.clone();
            e
        })?;
        m.validate().map_err(|mut e| {
            e.delegation_id = id;
            e
        })?;
        Ok(m)
    }

    /// Check every value serde cannot.
    pub fn validate(&self) -> Result<(), ProtocolError> {
        DelegationId::parse(self.delegation_id()).map_err(|r| perr("delegationId", r))?;
        match self {
            Message::Invite(m) => validate_invite(m),
            Message::Accept(m) => {
                text(
                    "executorWorkDir.path",
                    &m.executor_work_dir.path,
                    MAX_PATH_TEXT,
                )?;
                if !m.executor_work_dir.path.starts_with('/') {
                    return Err(perr("executorWorkDir.path", "must be an absolute path"));
                }
                Ok(())
            }
            Message::Start(m) => validate_start(m),
            Message::Done(m) => {
                text("finalSummary", &m.final_summary, MAX_TEXT)?;
                for (i, h) in m.highlights.iter().flatten().enumerate() {
                    text(&format!("highlights[{i}]"), h, MAX_PATH_TEXT)?;
                }
                if let Some(n) = &m.notes {
                    text("notes", n, MAX_TEXT)?;
                }
                Ok(())
            }
            Message::Error(m) => {
                text("code", m.code.as_str(), 64)?;
                text("message", &m.message, MAX_TEXT)?;
                if let Some(h) = &m.hint {
                    text("hint", h, MAX_TEXT)?;
                }
                Ok(())
            }
        }
    }
}

/// Free text: bounded, and without NUL (it ends up in environment variables and files).
fn text(field: &str, s: &str, max: usize) -> Result<(), ProtocolError> {
    if s.len() > max {
        return Err(perr(
            field,
            format!("{} bytes, more than the {max} allowed", s.len()),
        ));
    }
    if s.contains('\0') {
        return Err(perr(field, "contains a NUL character"));
    }
    Ok(())
}

fn validate_invite(m: &Invite) -> Result<(), ProtocolError> {
    text("task.description", &m.task.description, MAX_DESCRIPTION)?;
    text("task.prompt", &m.task.prompt, MAX_PROMPT)?;
    let ttl = m.lease.ttl_seconds;
    if ttl == 0 || ttl > MAX_TTL_SECONDS {
        return Err(perr(
            "lease.ttlSeconds",
            format!("{ttl} is outside 1..={MAX_TTL_SECONDS}"),
        ));
    }
    if let Some(env) = &m.environment {
        if env.resources.len() > 64 {
            return Err(perr("environment.resources", "more than 64 resources"));
        }
        for (i, r) in env.resources.iter().enumerate() {
            text(&format!("environment.resources[{i}].name"), &r.name, 256)?;
        }
    }
    if let Some(t) = m.requirements.as_ref().and_then(|r| r.transport.as_ref()) {
        text("requirements.transport", t, 64)?;
    }
    if let Some(a) = &m.auth {
        text("auth.credential", &a.credential, MAX_KEY_TEXT)?;
    }
    Ok(())
}

fn validate_start(m: &Start) -> Result<(), ProtocolError> {
    crate::policy::lease::parse_rfc3339(&m.lease.expires_at)
        .map_err(|e| perr("lease.expiresAt", e))?;
    let TransportHandle::Sshfs(h) = &m.transport_handle else {
        // Refused at admission with DEP_MISSING, naming the transport.
        return Ok(());
    };
    validate_host(&h.endpoint.host).map_err(|r| perr("transportHandle.endpoint.host", r))?;
    if h.endpoint.port == 0 {
        return Err(perr("transportHandle.endpoint.port", "0 is not a port"));
    }
    crate::options::validate_user(&h.endpoint.user)
        .map_err(|r| perr("transportHandle.endpoint.user", r))?;
    validate_export(&h.export_locator).map_err(|r| perr("transportHandle.exportLocator", r))?;
    if let Some(o) = &h.options {
        if o.len() > 64 {
            return Err(perr("transportHandle.options", "more than 64 entries"));
        }
    }
    validate_credential(&h.credential).map_err(|mut e| {
        e.code = ErrorCode::AuthFailed;
        e
    })
}

/// A host name or IP address: never empty, never option-like, nothing a shell, ssh or our
/// `USER@HOST:DIR` syntax would read specially.
pub fn validate_host(host: &str) -> Result<(), String> {
    if host.is_empty() || host.len() > 253 {
        return Err("must be 1 to 253 characters".into());
    }
    if host.parse::<std::net::IpAddr>().is_ok() {
        return Ok(());
    }
    if host.starts_with('-') || host.starts_with('.') {
        return Err(format!(
            "{:?} is not a host name (it starts with '-' or '.')",
            truncate(host, 80)
        ));
    }
    if !host
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.' || c == '_')
    {
        return Err(format!(
            "{:?} is not a host name or IP address (letters, digits, '-', '.' only)",
            truncate(host, 80)
        ));
    }
    Ok(())
}

/// The export locator: an absolute path on the delegator, without `..` or control characters.
pub fn validate_export(p: &str) -> Result<(), String> {
    if !p.starts_with('/') {
        return Err(format!("{:?} is not an absolute path", truncate(p, 80)));
    }
    if p.len() > MAX_PATH_TEXT {
        return Err(format!("{} bytes, more than {MAX_PATH_TEXT}", p.len()));
    }
    if p.chars().any(|c| c.is_control()) {
        return Err("contains control characters".into());
    }
    if p.split('/').any(|c| c == "..") {
        return Err(format!("{:?} contains a '..' component", truncate(p, 80)));
    }
    Ok(())
}

/// The key must be an unencrypted OpenSSH private key, the certificate an OpenSSH
/// certificate of that very key.
fn validate_credential(c: &SshCredential) -> Result<(), ProtocolError> {
    const F: &str = "transportHandle.credential";
    text(&format!("{F}.privateKey"), &c.private_key, MAX_KEY_TEXT)?;
    text(&format!("{F}.certificate"), &c.certificate, MAX_KEY_TEXT)?;
    let key = russh::keys::decode_secret_key(&c.private_key, None).map_err(|e| {
        perr(
            &format!("{F}.privateKey"),
            format!("not an unencrypted OpenSSH private key ({e})"),
        )
    })?;
    let cert = russh::keys::Certificate::from_openssh(c.certificate.trim()).map_err(|e| {
        perr(
            &format!("{F}.certificate"),
            format!("not an OpenSSH certificate ({e})"),
        )
    })?;
    if cert.public_key() != key.public_key().key_data() {
        return Err(perr(
            &format!("{F}.certificate"),
            "certifies another key than privateKey",
        ));
    }
    Ok(())
}

// ------------------------------------------------------------------ SSE task events

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RunStatus {
    Running,
    Progress,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusEvent {
    pub delegation_id: String,
    #[serde(rename = "type")]
    pub kind: StatusTag,
    pub timestamp: String,
    pub status: RunStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotEvent {
    pub delegation_id: String,
    #[serde(rename = "type")]
    pub kind: SnapshotTag,
    pub timestamp: String,
    pub snapshot_id: String,
    pub summary: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub highlights: Option<Vec<String>>,
    pub snapshot_base64: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recommended: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<serde_json::Value>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DoneEvent {
    pub delegation_id: String,
    #[serde(rename = "type")]
    pub kind: DoneEventTag,
    pub timestamp: String,
    pub summary: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub highlights: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_ids: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recommended_snapshot_id: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ErrorEvent {
    pub delegation_id: String,
    #[serde(rename = "type")]
    pub kind: ErrorEventTag,
    pub timestamp: String,
    pub code: ErrorCode,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hint: Option<String>,
}

/// One SSE event (`data: <json>`).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum TaskEvent {
    Status(StatusEvent),
    Snapshot(SnapshotEvent),
    Done(DoneEvent),
    Error(ErrorEvent),
}

impl<'de> Deserialize<'de> for TaskEvent {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let v = serde_json::Value::deserialize(d)?;
        let kind = v
            .get("type")
            .and_then(|t| t.as_str())
            .unwrap_or("")
            .to_string();
        let r = match kind.as_str() {
            "status" => serde_json::from_value(v).map(TaskEvent::Status),
            "snapshot" => serde_json::from_value(v).map(TaskEvent::Snapshot),
            "done" => serde_json::from_value(v).map(TaskEvent::Done),
            "error" => serde_json::from_value(v).map(TaskEvent::Error),
            other => return Err(D::Error::custom(format!("unknown event type {other:?}"))),
        };
        r.map_err(D::Error::custom)
    }
}

impl TaskEvent {
    pub fn now() -> String {
        crate::policy::lease::format_rfc3339(std::time::SystemTime::now())
    }

    pub fn status(id: &str, message: &str) -> TaskEvent {
        TaskEvent::Status(StatusEvent {
            delegation_id: id.to_string(),
            kind: StatusTag,
            timestamp: Self::now(),
            status: RunStatus::Running,
            message: Some(message.to_string()),
            progress: None,
        })
    }

    pub fn done(id: &str, summary: String, highlights: Vec<String>) -> TaskEvent {
        TaskEvent::Done(DoneEvent {
            delegation_id: id.to_string(),
            kind: DoneEventTag,
            timestamp: Self::now(),
            summary,
            highlights: Some(highlights),
            snapshot_ids: None,
            recommended_snapshot_id: None,
        })
    }

    pub fn error(id: &str, code: ErrorCode, message: String, hint: Option<String>) -> TaskEvent {
        TaskEvent::Error(ErrorEvent {
            delegation_id: id.to_string(),
            kind: ErrorEventTag,
            timestamp: Self::now(),
            code,
            message,
            hint,
        })
    }

    /// `done` and `error` end a stream.
    pub fn is_terminal(&self) -> bool {
        matches!(self, TaskEvent::Done(_) | TaskEvent::Error(_))
    }
}

// ------------------------------------------------------------------ state machines

/// The delegator's view of a delegation (nine states).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DelegationState {
    Created,
    Invited,
    Accepted,
    Started,
    Running,
    Completed,
    Error,
    Cancelled,
    Expired,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DelegationEvent {
    SendInvite,
    ReceiveAccept,
    SendStart,
    SetupComplete,
    ReceiveDone,
    ReceiveError,
    SendError,
    Cancel,
    Expire,
}

/// A transition the machine does not allow.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{event} is not valid in state {state}")]
pub struct TransitionError {
    pub state: String,
    pub event: String,
}

impl DelegationState {
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            Self::Completed | Self::Error | Self::Cancelled | Self::Expired
        )
    }

    pub fn on(self, ev: DelegationEvent) -> Result<DelegationState, TransitionError> {
        use DelegationEvent as E;
        use DelegationState as S;
        let next = match (self, ev) {
            (S::Created, E::SendInvite) => Some(S::Invited),
            (S::Invited, E::ReceiveAccept) => Some(S::Accepted),
            (S::Accepted, E::SendStart) => Some(S::Started),
            (S::Started, E::SetupComplete) => Some(S::Running),
            (S::Running, E::ReceiveDone) => Some(S::Completed),
            (s, E::ReceiveError | E::SendError) if !s.is_terminal() => Some(S::Error),
            (s, E::Cancel) if !s.is_terminal() => Some(S::Cancelled),
            (S::Invited | S::Accepted | S::Running, E::Expire) => Some(S::Expired),
            _ => None,
        };
        next.ok_or_else(|| TransitionError {
            state: format!("{self:?}").to_lowercase(),
            event: format!("{ev:?}"),
        })
    }
}

/// The executor's view (the reference's AssignmentStateMachine).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AssignmentState {
    Pending,
    Active,
    Completed,
    Error,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AssignmentEvent {
    ReceiveStart,
    TaskComplete,
    TaskFail,
    ReceiveError,
    Cancel,
}

impl AssignmentState {
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Completed | Self::Error)
    }

    pub fn on(self, ev: AssignmentEvent) -> Result<AssignmentState, TransitionError> {
        use AssignmentEvent as E;
        use AssignmentState as S;
        let next = match (self, ev) {
            (S::Pending, E::ReceiveStart) => Some(S::Active),
            (S::Active, E::TaskComplete) => Some(S::Completed),
            (S::Active, E::TaskFail) => Some(S::Error),
            (s, E::ReceiveError | E::Cancel) if !s.is_terminal() => Some(S::Error),
            _ => None,
        };
        next.ok_or_else(|| TransitionError {
            state: self.as_str().to_string(),
            event: format!("{ev:?}"),
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Active => "active",
            Self::Completed => "completed",
            Self::Error => "error",
        }
    }
}

#[cfg(test)]
mod tests;
