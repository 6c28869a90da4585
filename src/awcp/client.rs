//! The client commands (`awcp-mount status|done|cancel`), talking to a running `serve`.

use std::time::Duration;

use serde_json::{json, Value};

/// The executor URL `serve` has by default.
pub const DEFAULT_EXECUTOR: &str = "http://127.0.0.1:4101/awcp";

fn block_on<T>(f: impl std::future::Future<Output = Result<T, String>>) -> Result<T, String> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start runtime: {e}"))?
        .block_on(f)
}

fn client() -> Result<reqwest::Client, String> {
    reqwest::Client::builder()
        // A local `serve` answers at once; `status` must not hang on a stuck one.
        .connect_timeout(Duration::from_secs(3))
        .timeout(Duration::from_secs(20))
        .build()
        .map_err(|e| e.to_string())
}

/// `executor` ends in `/awcp` (the executor URL) or is the server's base URL.
fn awcp_url(executor: &str) -> String {
    let e = executor.trim_end_matches('/');
    if e.ends_with("/awcp") {
        e.to_string()
    } else {
        format!("{e}/awcp")
    }
}

async fn call(method: reqwest::Method, url: String, body: Option<Value>) -> Result<Value, String> {
    let mut req = client()?.request(method, &url);
    if let Some(b) = body {
        req = req.json(&b);
    }
    let resp = req
        .send()
        .await
        .map_err(|e| format!("{url}: no awcp-mount serve answers ({e})"))?;
    let status = resp.status();
    let v: Value = resp
        .json()
        .await
        .map_err(|e| format!("{url}: {status}: unreadable answer ({e})"))?;
    if !status.is_success() {
        return Err(format!(
            "{}{}",
            v["error"].as_str().unwrap_or(&v.to_string()),
            v["hint"]
                .as_str()
                .map(|h| format!(" ({h})"))
                .unwrap_or_default()
        ));
    }
    Ok(v)
}

/// `GET /awcp/status`.
pub fn status(executor: &str) -> Result<Value, String> {
    block_on(call(
        reqwest::Method::GET,
        format!("{}/status", awcp_url(executor)),
        None,
    ))
}

/// `POST /awcp/tasks/ID/done`.
pub fn done(
    executor: &str,
    id: &str,
    summary: &str,
    highlights: &[String],
) -> Result<Value, String> {
    let id = crate::awcp::protocol::DelegationId::parse(id)?;
    block_on(call(
        reqwest::Method::POST,
        format!("{}/tasks/{id}/done", awcp_url(executor)),
        Some(json!({"summary": summary, "highlights": highlights})),
    ))
}

/// `POST /awcp/cancel/ID`.
pub fn cancel(executor: &str, id: &str) -> Result<Value, String> {
    let id = crate::awcp::protocol::DelegationId::parse(id)?;
    block_on(call(
        reqwest::Method::POST,
        format!("{}/cancel/{id}", awcp_url(executor)),
        None,
    ))
}

#[cfg(test)]
mod tests {
    #[test]
    fn executor_urls() {
        assert_eq!(super::awcp_url("http://h:1/awcp/"), "http://h:1/awcp");
        assert_eq!(super::awcp_url("http://h:1"), "http://h:1/awcp");
    }
}
