use super::*;

/// The wire examples of `shared/awcp-protocol.md`, compacted (as the reference sends them).
const INVITE: &str = r#"{"version":"1","type":"INVITE","delegationId":"dlg_708a1b37395d4eeba716dd113309865a","task":{"description":"short","prompt":"full instructions"},"lease":{"ttlSeconds":600,"accessMode":"rw"},"retentionMs":604800000,"environment":{"resources":[{"name":"workspace","type":"fs","mode":"rw"}]},"requirements":{"transport":"sshfs"}}"#;
const INVITE_AUTH: &str = r#"{"version":"1","type":"INVITE","delegationId":"dlg_1","task":{"description":"d","prompt":"p"},"lease":{"ttlSeconds":60,"accessMode":"ro"},"environment":{"resources":[]},"auth":{"type":"bearer","credential":"s3cret"}}"#;
const ACCEPT: &str = r#"{"version":"1","type":"ACCEPT","delegationId":"dlg_…","retentionMs":604800000,"executorWorkDir":{"path":"/var/lib/awcp/mounts/dlg_…"},"executorConstraints":{"acceptedAccessMode":"ro","maxTtlSeconds":600,"sandboxProfile":{"cwdOnly":true,"allowNetwork":false,"allowExec":true}}}"#;
const START: &str = r#"{"version":"1","type":"START","delegationId":"dlg_…","lease":{"expiresAt":"2026-11-22T12:22:29.696Z","accessMode":"rw"},"transportHandle":{"transport":"sshfs","endpoint":{"host":"127.0.0.1","port":2232,"user":"awcp"},"exportLocator":"/home/awcp/.awcp/environments/dlg_…/","credential":{"privateKey":"-----BEGIN OPENSSH PRIVATE KEY-----\n…\n-----END OPENSSH PRIVATE KEY-----\n","certificate":"ssh-ed25519-cert-v01@openssh.com AAAA… awcp-dlg_…\n"}}}"#;
const ERROR: &str = r#"{"version":"1","type":"ERROR","delegationId":"dlg_…","code":"DECLINED","message":"Requested TTL (99999s) exceeds maximum (3600s)","hint":"Request a shorter TTL (max: 3600s)"}"#;
const DONE: &str = r#"{"version":"1","type":"DONE","delegationId":"dlg_1","finalSummary":"what was done","highlights":["a.txt"],"notes":"n"}"#;
const EV_STATUS: &str = r#"{"delegationId":"dlg_…","type":"status","timestamp":"2026-11-22T12:12:29.700Z","status":"running","message":"Task execution started"}"#;
const EV_DONE: &str = r#"{"delegationId":"dlg_…","type":"done","timestamp":"…","summary":"what was done","highlights":["path/changed.txt"]}"#;
const EV_ERROR: &str = r#"{"delegationId":"dlg_…","type":"error","timestamp":"…","code":"TASK_FAILED","message":"…","hint":"…"}"#;
const EV_SNAPSHOT: &str = r#"{"delegationId":"dlg_1","type":"snapshot","timestamp":"t","snapshotId":"s1","summary":"x","snapshotBase64":"UEsD","recommended":true}"#;

#[test]
fn wire_examples_round_trip_byte_for_byte() {
    for ex in [INVITE, INVITE_AUTH, ACCEPT, START, ERROR, DONE] {
        let m = Message::decode(serde_json::from_str(ex).unwrap())
            .unwrap_or_else(|e| panic!("{ex}: {e}"));
        assert_eq!(serde_json::to_string(&m).unwrap(), ex);
    }
    for ex in [EV_STATUS, EV_DONE, EV_ERROR, EV_SNAPSHOT] {
        let e: TaskEvent = serde_json::from_str(ex).unwrap();
        assert_eq!(serde_json::to_string(&e).unwrap(), ex);
    }
}

#[test]
fn decoded_fields_are_typed() {
    let Message::Invite(i) = Message::parse(INVITE.as_bytes()).unwrap() else {
        panic!()
    };
    assert_eq!(i.lease.access_mode, Access::Rw);
    assert_eq!(i.lease.ttl_seconds, 600);
    assert_eq!(i.requirements.unwrap().transport.as_deref(), Some("sshfs"));
    let Message::Start(s) = Message::decode(serde_json::from_str(START).unwrap()).unwrap() else {
        panic!()
    };
    let TransportHandle::Sshfs(h) = &s.transport_handle else {
        panic!()
    };
    assert_eq!((h.endpoint.port, h.endpoint.user.as_str()), (2232, "awcp"));
    assert!(
        !format!("{s:?}").contains("PRIVATE KEY"),
        "Debug must not show the key"
    );
    let Message::Error(e) = Message::decode(serde_json::from_str(ERROR).unwrap()).unwrap() else {
        panic!()
    };
    assert_eq!(e.code, ErrorCode::Declined);
    assert!(!format!("{:?}", Message::parse(INVITE_AUTH.as_bytes()).unwrap()).contains("s3cret"));
}

#[test]
fn unknown_fields_are_ignored_and_unknown_transports_kept() {
    let with_extra = INVITE.replacen("\"task\"", "\"futureField\":{\"x\":1},\"task\"", 1);
    assert!(Message::parse(with_extra.as_bytes()).is_ok());
    let archive = r#"{"version":"1","type":"START","delegationId":"d","lease":{"expiresAt":"2026-11-22T12:22:29.696Z","accessMode":"ro"},"transportHandle":{"transport":"archive","workspaceBase64":"UEs=","checksum":"abc"}}"#;
    let Message::Start(s) = Message::parse(archive.as_bytes()).unwrap() else {
        panic!()
    };
    assert_eq!(s.transport_handle.transport(), "archive");
    assert_eq!(serde_json::to_string(&s).unwrap(), archive);
    // The reference's older name for the handle.
    let old = archive.replace("transportHandle", "workDir");
    assert!(Message::parse(old.as_bytes()).is_ok());
}

#[track_caller]
fn refused(body: &str, field: &str, why: &str) -> ProtocolError {
    let e = Message::parse(body.as_bytes()).expect_err(body);
    assert_eq!(e.field, field, "{e}");
    assert!(e.reason.contains(why), "{e}");
    e
}

#[test]
fn validation_names_the_field() {
    refused("{not json", "(body)", "not valid JSON");
    refused("[1,2]", "(body)", "JSON object");
    refused(r#"{"version":"1"}"#, "type", "missing");
    refused(
        r#"{"version":"1","type":"HELLO"}"#,
        "type",
        "unknown message type",
    );
    refused(
        &INVITE.replace(r#""version":"1""#, r#""version":"2""#),
        "version",
        "unsupported",
    );
    refused(
        &INVITE.replace(r#""version":"1","#, ""),
        "version",
        "missing",
    );
    for bad in ["../x", "a/b", "", ".", "dlg 1", "-", "ü"] {
        let body = INVITE.replace("dlg_708a1b37395d4eeba716dd113309865a", bad);
        let e = refused(&body, "delegationId", "");
        assert!(e.delegation_id.is_none());
    }
    let long = "a".repeat(MAX_ID_LEN + 1);
    refused(
        &INVITE.replace("dlg_708a1b37395d4eeba716dd113309865a", &long),
        "delegationId",
        "longer",
    );
    assert!(Message::parse(
        INVITE
            .replace(
                "dlg_708a1b37395d4eeba716dd113309865a",
                &"a".repeat(MAX_ID_LEN)
            )
            .as_bytes()
    )
    .is_ok());
    refused(
        &INVITE.replace(r#""accessMode":"rw""#, r#""accessMode":"rwx""#),
        "lease.accessMode",
        "unknown variant",
    );
    let e = refused(&INVITE.replace("600", "0"), "lease.ttlSeconds", "outside");
    assert_eq!(
        e.delegation_id.unwrap().as_str(),
        "dlg_708a1b37395d4eeba716dd113309865a"
    );
    refused(&INVITE.replace("600", "-5"), "lease.ttlSeconds", "");
    refused(
        &INVITE.replace("\"short\"", "\"a\\u0000b\""),
        "task.description",
        "NUL",
    );
    refused(
        &INVITE.replace(r#","prompt":"full instructions""#, ""),
        "task",
        "missing field `prompt`",
    );
}

fn start_with(f: impl FnOnce(&mut serde_json::Value)) -> String {
    let mut v: serde_json::Value = serde_json::from_str(START).unwrap();
    v["delegationId"] = "dlg_1".into();
    v["transportHandle"]["exportLocator"] = "/home/awcp/x/".into();
    f(&mut v);
    v.to_string()
}

#[test]
fn start_values_are_checked() {
    refused(
        &start_with(|v| v["lease"]["expiresAt"] = "tomorrow".into()),
        "lease.expiresAt",
        "RFC 3339",
    );
    refused(
        &start_with(|v| v["transportHandle"]["endpoint"]["user"] = "-oProxyCommand=x".into()),
        "transportHandle.endpoint.user",
        "starts with '-'",
    );
    refused(
        &start_with(|v| v["transportHandle"]["endpoint"]["user"] = "a b".into()),
        "transportHandle.endpoint.user",
        "may only contain",
    );
    refused(
        &start_with(|v| v["transportHandle"]["endpoint"]["host"] = "-oX".into()),
        "transportHandle.endpoint.host",
        "",
    );
    refused(
        &start_with(|v| v["transportHandle"]["endpoint"]["host"] = "a;b".into()),
        "transportHandle.endpoint.host",
        "",
    );
    refused(
        &start_with(|v| v["transportHandle"]["endpoint"]["port"] = 0.into()),
        "transportHandle.endpoint.port",
        "",
    );
    refused(
        &start_with(|v| v["transportHandle"]["endpoint"]["port"] = 70000.into()),
        "transportHandle.endpoint.port",
        "",
    );
    refused(
        &start_with(|v| v["transportHandle"]["exportLocator"] = "relative/x".into()),
        "transportHandle.exportLocator",
        "absolute",
    );
    refused(
        &start_with(|v| v["transportHandle"]["exportLocator"] = "/a/../etc".into()),
        "transportHandle.exportLocator",
        "..",
    );
    let e = refused(
        &start_with(|_| {}),
        "transportHandle.credential.privateKey",
        "OpenSSH private key",
    );
    assert_eq!(e.code, ErrorCode::AuthFailed);
    refused(
        &start_with(|v| v["transportHandle"]["transport"] = 5.into()),
        "transportHandle",
        "string",
    );
}

#[test]
fn a_real_key_and_certificate_pass_and_a_foreign_certificate_does_not() {
    let dir = tempfile::tempdir().unwrap();
    let keygen = |args: &[&str]| {
        std::process::Command::new("ssh-keygen")
            .args(args)
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false)
    };
    let p = |n: &str| dir.path().join(n).to_str().unwrap().to_string();
    if !keygen(&["-q", "-t", "ed25519", "-N", "", "-f", &p("ca")]) {
        eprintln!("ssh-keygen not available; skipped");
        return;
    }
    assert!(keygen(&["-q", "-t", "ed25519", "-N", "", "-f", &p("k")]));
    assert!(keygen(&[
        "-q",
        "-t",
        "ed25519",
        "-N",
        "",
        "-f",
        &p("other")
    ]));
    assert!(keygen(&[
        "-q",
        "-s",
        &p("ca"),
        "-I",
        "id",
        "-n",
        "awcp",
        "-V",
        "+1h",
        &p("k.pub")
    ]));
    assert!(keygen(&[
        "-q",
        "-s",
        &p("ca"),
        "-I",
        "id",
        "-n",
        "awcp",
        "-V",
        "+1h",
        &p("other.pub")
    ]));
    let key = std::fs::read_to_string(p("k")).unwrap();
    let cert = std::fs::read_to_string(p("k-cert.pub")).unwrap();
    let other = std::fs::read_to_string(p("other-cert.pub")).unwrap();
    let ok = start_with(|v| {
        v["transportHandle"]["credential"]["privateKey"] = key.clone().into();
        v["transportHandle"]["credential"]["certificate"] = cert.clone().into();
    });
    Message::parse(ok.as_bytes()).unwrap();
    refused(
        &start_with(|v| {
            v["transportHandle"]["credential"]["privateKey"] = key.clone().into();
            v["transportHandle"]["credential"]["certificate"] = other.into();
        }),
        "transportHandle.credential.certificate",
        "another key",
    );
}

#[test]
fn error_codes_round_trip_and_unknown_codes_are_kept() {
    for (c, s) in CODES {
        assert_eq!(ErrorCode::parse(s), *c);
        assert_eq!(c.as_str(), *s);
    }
    assert_eq!(ErrorCode::parse("NEW_CODE").as_str(), "NEW_CODE");
}

#[test]
fn state_machines_follow_the_reference() {
    use AssignmentEvent as AE;
    use AssignmentState as A;
    use DelegationEvent as E;
    use DelegationState as S;
    let mut s = S::Created;
    for ev in [
        E::SendInvite,
        E::ReceiveAccept,
        E::SendStart,
        E::SetupComplete,
        E::ReceiveDone,
    ] {
        s = s.on(ev).unwrap();
    }
    assert_eq!(s, S::Completed);
    assert!(S::Completed.on(E::Cancel).is_err());
    assert_eq!(S::Started.on(E::Cancel).unwrap(), S::Cancelled);
    assert!(S::Started.on(E::Expire).is_err());
    assert_eq!(S::Running.on(E::Expire).unwrap(), S::Expired);
    assert_eq!(S::Invited.on(E::ReceiveError).unwrap(), S::Error);
    assert!(S::Created.on(E::ReceiveDone).is_err());

    assert_eq!(A::Pending.on(AE::ReceiveStart).unwrap(), A::Active);
    assert_eq!(A::Active.on(AE::TaskComplete).unwrap(), A::Completed);
    assert_eq!(A::Active.on(AE::TaskFail).unwrap(), A::Error);
    assert_eq!(A::Pending.on(AE::Cancel).unwrap(), A::Error);
    assert!(A::Pending.on(AE::TaskComplete).is_err());
    assert!(A::Completed.on(AE::Cancel).is_err());
    let e = A::Active.on(AE::ReceiveStart).unwrap_err();
    assert_eq!(e.to_string(), "ReceiveStart is not valid in state active");
    assert_eq!(
        serde_json::to_string(&S::Cancelled).unwrap(),
        "\"cancelled\""
    );
}
