//! The v1 spec's A2A binding: each AWCP message travels in an A2A JSON-RPC `message/send`,
//! in the `awcp` field of a data part, with snake_case fields and a few structural names of
//! its own (`workspace.export_name`, `remote_mount.mount_point`, `remote_constraints`,
//! `mount`). Messages are translated to and from the HTTP binding's form, so both bindings
//! share one validation and one executor.
//!
//! The executor is also an A2A *client*: when the INVITE's `params.metadata.awcp_reply_url`
//! names the host's A2A endpoint (on the same address the INVITE came from, so it cannot be
//! used to make us call third parties), DONE and ERROR are sent there with `message/send`.

use std::net::SocketAddr;
use std::sync::Arc;

use serde_json::{json, Map, Value};

use super::serve::executor::Executor;

/// The extension URI declared in the agent card.
pub const EXTENSION_URI: &str = "https://awcp-protocol.org/v1";

fn rename_keys(v: &Value, f: &dyn Fn(&str) -> String) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .map(|(k, v)| {
                    // Opaque string maps keep their keys.
                    let inner = if matches!(k.as_str(), "options" | "mount_options" | "metadata") {
                        v.clone()
                    } else {
                        rename_keys(v, f)
                    };
                    (f(k), inner)
                })
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(|x| rename_keys(x, f)).collect()),
        other => other.clone(),
    }
}

fn snake_to_camel(k: &str) -> String {
    let mut out = String::new();
    let mut up = false;
    for c in k.chars() {
        if c == '_' {
            up = true;
        } else if up {
            out.extend(c.to_uppercase());
            up = false;
        } else {
            out.push(c);
        }
    }
    out
}

fn camel_to_snake(k: &str) -> String {
    let mut out = String::new();
    for c in k.chars() {
        if c.is_ascii_uppercase() {
            out.push('_');
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

/// Spec (snake_case) form -> HTTP binding (camelCase) form.
pub fn to_http(spec: &Value) -> Value {
    let mut v = rename_keys(spec, &snake_to_camel);
    let Some(m) = v.as_object_mut() else {
        return v;
    };
    // `workspace.export_name` -> one resource of the environment.
    if let Some(ws) = m.remove("workspace") {
        let mode = m
            .get("lease")
            .and_then(|l| l.get("accessMode"))
            .cloned()
            .unwrap_or(json!("ro"));
        let name = ws.get("exportName").cloned().unwrap_or(json!("workspace"));
        m.insert(
            "environment".into(),
            json!({"resources": [{"name": name, "type": "fs", "mode": mode}]}),
        );
    }
    // `mount` -> `transportHandle` (`export_locator`, `mount_options`).
    if let Some(Value::Object(mut mount)) = m.remove("mount") {
        if let Some(o) = mount.remove("mountOptions") {
            mount.insert("options".into(), o);
        }
        m.insert("transportHandle".into(), Value::Object(mount));
    }
    if let Some(fs) = m.remove("finalSummary") {
        m.insert("finalSummary".into(), fs);
    }
    v
}

/// HTTP binding form of an executor's message (ACCEPT, DONE, ERROR) -> spec form.
pub fn to_spec(http: &Value) -> Value {
    let kind = http["type"].as_str().unwrap_or("");
    if kind == "ACCEPT" {
        let c = &http["executorConstraints"];
        let p = &c["sandboxProfile"];
        let mut out = Map::new();
        out.insert("version".into(), http["version"].clone());
        out.insert("type".into(), json!("ACCEPT"));
        out.insert("delegation_id".into(), http["delegationId"].clone());
        out.insert(
            "remote_mount".into(),
            json!({"mount_point": http["executorWorkDir"]["path"]}),
        );
        if c.is_object() {
            let mut rc = Map::new();
            for (from, to) in [
                ("acceptedAccessMode", "accepted_access_mode"),
                ("maxTtlSeconds", "max_ttl_seconds"),
            ] {
                if !c[from].is_null() {
                    rc.insert(to.into(), c[from].clone());
                }
            }
            if p.is_object() {
                rc.insert("sandbox_profile".into(), rename_keys(p, &camel_to_snake));
            }
            out.insert("remote_constraints".into(), Value::Object(rc));
        }
        return Value::Object(out);
    }
    rename_keys(http, &camel_to_snake)
}

fn rpc_error(id: Value, code: i64, message: String) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
}

fn message_id() -> String {
    use std::time::{SystemTime, UNIX_EPOCH};
    let n = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    format!("awcp-{n:x}-{}", std::process::id())
}

/// An A2A agent message carrying `awcp` in a data part.
pub fn agent_message(awcp: Value) -> Value {
    json!({
        "kind": "message",
        "role": "agent",
        "messageId": message_id(),
        "parts": [{"kind": "data", "data": {"awcp": awcp}}],
    })
}

/// Handle one JSON-RPC request; the answer is always a JSON-RPC response.
pub fn handle(exec: &Arc<Executor>, body: &[u8], peer: SocketAddr) -> Value {
    let req: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => return rpc_error(Value::Null, -32700, format!("Parse error: {e}")),
    };
    let id = req.get("id").cloned().unwrap_or(Value::Null);
    if req["jsonrpc"] != "2.0" {
        return rpc_error(
            id,
            -32600,
            "Invalid Request: jsonrpc must be \"2.0\"".into(),
        );
    }
    if req["method"] != "message/send" {
        return rpc_error(id, -32601, format!("Method not found: {}", req["method"]));
    }
    let parts = req["params"]["message"]["parts"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let Some(awcp) = parts
        .iter()
        .find(|p| p["kind"] == "data" && p["data"]["awcp"].is_object())
        .map(|p| p["data"]["awcp"].clone())
    else {
        return rpc_error(
            id,
            -32602,
            "Invalid params: no data part with an `awcp` message".into(),
        );
    };
    let http = to_http(&awcp);
    let raw_id = http["delegationId"].as_str().unwrap_or("").to_string();
    let answer = match super::serve::http::handle_message(exec, http.to_string().as_bytes(), peer) {
        Ok(v) if v.get("type").is_some() => to_spec(&v),
        Ok(_) => json!({"version": "1", "type": "ACK", "delegation_id": raw_id}),
        Err(r) => json!({
            "version": "1", "type": "ERROR", "delegation_id": raw_id,
            "code": r.code.map(|c| c.to_string()).unwrap_or_else(|| "DECLINED".into()),
            "message": r.error,
            "hint": r.hint.unwrap_or_else(|| "fix the message and send it again".into()),
        }),
    };
    if awcp["type"] == "INVITE" && answer["type"] == "ACCEPT" {
        if let Some(url) = req["params"]["metadata"]["awcp_reply_url"].as_str() {
            match reply_url_allowed(url, peer) {
                Ok(()) => exec.set_reply_url(&raw_id, url),
                Err(e) => tracing::warn!("awcp_reply_url ignored: {e}"),
            }
        }
    }
    json!({"jsonrpc": "2.0", "id": id, "result": agent_message(answer)})
}

/// The reply URL must be http(s) on the address the INVITE came from.
fn reply_url_allowed(url: &str, peer: SocketAddr) -> Result<(), String> {
    let u = reqwest::Url::parse(url).map_err(|e| format!("{url}: {e}"))?;
    if !matches!(u.scheme(), "http" | "https") {
        return Err(format!("{url}: not http(s)"));
    }
    let host = u.host_str().unwrap_or("");
    let host_ip: std::net::IpAddr = if host == "localhost" {
        std::net::Ipv4Addr::LOCALHOST.into()
    } else {
        host.trim_start_matches('[')
            .trim_end_matches(']')
            .parse()
            .map_err(|_| format!("{url}: the host must be an IP address"))?
    };
    let same = host_ip == peer.ip() || (host_ip.is_loopback() && peer.ip().is_loopback());
    if !same {
        return Err(format!("{url}: not on the INVITE's address {}", peer.ip()));
    }
    Ok(())
}

/// The most of a host's answer to DONE/ERROR that is read.
const MAX_ANSWER_BYTES: usize = 1 << 20;

/// Send an AWCP message (spec form) to a host's A2A endpoint with `message/send`.
pub async fn send(url: &str, awcp: Value) -> Result<Value, String> {
    let body = json!({
        "jsonrpc": "2.0",
        "id": message_id(),
        "method": "message/send",
        "params": {"message": agent_message(awcp)},
    });
    // No redirects: the URL was checked to be on the INVITE's address, and a 307 would send
    // the POST, body and all, wherever the delegator's endpoint pointed it.
    let client = reqwest::Client::builder()
        .timeout(std::time::Duration::from_secs(30))
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|e| e.to_string())?;
    let mut resp = client
        .post(url)
        .json(&body)
        .send()
        .await
        .map_err(|e| format!("{url}: {e}"))?;
    let status = resp.status();
    // The answer is read up to a bound: the host's endpoint is the delegator's.
    let mut text = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(|e| format!("{url}: {e}"))? {
        text.extend_from_slice(&chunk);
        if text.len() > MAX_ANSWER_BYTES {
            return Err(format!(
                "{url}: {status}: an answer of more than {MAX_ANSWER_BYTES} bytes"
            ));
        }
    }
    let v: Value = serde_json::from_slice(&text).map_err(|e| format!("{url}: {status}: {e}"))?;
    if !status.is_success() || v.get("error").is_some() {
        return Err(format!("{url}: {status}: {}", v["error"]));
    }
    Ok(v)
}

/// The agent card, declaring the AWCP extension.
pub fn agent_card(base: &str) -> Value {
    json!({
        "name": "awcp-mount executor",
        "description": "An AWCP executor: mounts delegated workspaces over SSH/SFTP under its own policy and runs the configured task in them.",
        "url": format!("{base}/a2a"),
        "version": env!("CARGO_PKG_VERSION"),
        "protocolVersion": "0.3.0",
        "preferredTransport": "JSONRPC",
        "capabilities": {
            "streaming": false,
            "pushNotifications": false,
            "extensions": [{"uri": EXTENSION_URI, "required": false, "description": "Agent Workspace Collaboration Protocol v1 (INVITE/ACCEPT/START/DONE/ERROR in data parts)"}],
        },
        "defaultInputModes": ["application/json"],
        "defaultOutputModes": ["application/json"],
        "skills": [{
            "id": "awcp-executor",
            "name": "Work in a delegated workspace",
            "description": "Accepts AWCP delegations (transport sshfs) and works on the delegator's files.",
            "tags": ["awcp", "workspace"],
        }],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const ACCEPT_SPEC: &str = r#"{"version":"1","type":"ACCEPT","delegation_id":"dlg_1","remote_mount":{"mount_point":"/AWCP/mounts/dlg_1"},"remote_constraints":{"accepted_access_mode":"ro","max_ttl_seconds":600,"sandbox_profile":{"cwd_only":true,"allow_network":false,"allow_exec":true}}}"#;

    #[test]
    fn accept_translates_to_the_spec_example_and_back() {
        let http: Value = serde_json::to_value(crate::awcp::protocol::Message::decode(
            serde_json::from_str(r#"{"version":"1","type":"ACCEPT","delegationId":"dlg_1","executorWorkDir":{"path":"/AWCP/mounts/dlg_1"},"executorConstraints":{"acceptedAccessMode":"ro","maxTtlSeconds":600,"sandboxProfile":{"cwdOnly":true,"allowNetwork":false,"allowExec":true}}}"#).unwrap(),
        ).unwrap()).unwrap();
        assert_eq!(to_spec(&http).to_string(), ACCEPT_SPEC);
    }

    #[test]
    fn spec_invite_and_start_become_valid_http_messages() {
        let invite = json!({"version":"1","type":"INVITE","delegation_id":"dlg_2",
            "task":{"description":"d","prompt":"p"},"lease":{"ttl_seconds":60,"access_mode":"rw"},
            "workspace":{"export_name":"awcp/dlg_2"},"requirements":{"transport":"sshfs"}});
        let m =
            crate::awcp::protocol::Message::parse(to_http(&invite).to_string().as_bytes()).unwrap();
        let crate::awcp::protocol::Message::Invite(i) = m else {
            panic!()
        };
        assert_eq!(i.environment.unwrap().resources[0].name, "awcp/dlg_2");
        assert_eq!(i.lease.ttl_seconds, 60);
        let start = json!({"version":"1","type":"START","delegation_id":"dlg_2",
            "lease":{"expires_at":"2026-11-22T12:22:29.696Z","access_mode":"rw"},
            "mount":{"transport":"sshfs","endpoint":{"host":"127.0.0.1","port":22,"user":"u"},
                "export_locator":"/x","credential":{"private_key":"k","certificate":"c"},
                "mount_options":{"Some_Option":"1"}}});
        let h = to_http(&start);
        assert_eq!(h["transportHandle"]["exportLocator"], "/x");
        assert_eq!(h["transportHandle"]["credential"]["privateKey"], "k");
        assert_eq!(h["transportHandle"]["options"]["Some_Option"], "1");
        let e = crate::awcp::protocol::Message::parse(h.to_string().as_bytes()).unwrap_err();
        assert_eq!(e.field, "transportHandle.credential.privateKey");
    }

    #[test]
    fn done_and_error_translate_to_snake_case() {
        let done = json!({"version":"1","type":"DONE","delegationId":"d","finalSummary":"s","highlights":["a"]});
        assert_eq!(
            to_spec(&done).to_string(),
            r#"{"version":"1","type":"DONE","delegation_id":"d","final_summary":"s","highlights":["a"]}"#
        );
    }

    #[test]
    fn reply_urls_must_point_back_at_the_sender() {
        let peer: SocketAddr = "127.0.0.1:5000".parse().unwrap();
        assert!(reply_url_allowed("http://127.0.0.1:9/a2a", peer).is_ok());
        assert!(reply_url_allowed("http://localhost:9/a2a", peer).is_ok());
        assert!(reply_url_allowed("http://10.0.0.1/a2a", peer).is_err());
        assert!(reply_url_allowed("file:///etc/passwd", peer).is_err());
        assert!(reply_url_allowed("http://example.com/a2a", peer).is_err());
    }
}
