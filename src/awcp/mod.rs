//! The AWCP control plane: what lets an executor machine take part in AWCP with
//! `awcp-mount` alone.
//!
//! * [`protocol`]: the messages, SSE events, error codes and state machines (HTTP + SSE
//!   binding, camelCase), with strict validation.
//! * [`a2a`]: the v1 spec's A2A binding (JSON-RPC `message/send`, snake_case).
//! * [`serve`]: `awcp-mount serve`, the executor endpoint.
//! * [`client`]: `awcp-mount status|done|cancel` talking to a running `serve`.
//!
//! The control plane never touches the filesystem code directly: it runs the `awcp-mount`
//! binary itself for each mount, so a mount is policed exactly as a hand-made one is.

pub mod a2a;
pub mod client;
pub mod protocol;
pub mod serve;
