//! Logging: `tracing` to stderr, filtered by `AWCP_MOUNT_LOG` (any `tracing` filter) or `-d`.

use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt as _};
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::EnvFilter;

/// Set up logging once for the process: only real problems by default, the mount's debug log
/// with `debug`, or whatever `AWCP_MOUNT_LOG` says.
pub fn init(debug: bool) {
    let (filter, asked) = match std::env::var("AWCP_MOUNT_LOG") {
        Ok(f) if !f.is_empty() => (EnvFilter::new(f), true),
        _ if debug => (EnvFilter::new("awcp_mount=debug,info"), true),
        _ => (EnvFilter::new("warn"), false),
    };
    let _ = tracing_subscriber::registry()
        .with(filter)
        .with(DroppedReplies { show: asked })
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
                .with_target(false),
        )
        .try_init();
}

/// Keeps one message of fuser's out of the default log. fuser logs at ERROR every reply the
/// kernel refuses; ENOENT there is the kernel saying it no longer has the request: the
/// application was interrupted or killed while it waited, or an unmount cut short the reads
/// the kernel had started ahead of a reader that closed the file. Nothing is wrong then, and
/// an ERROR at every such unmount (in the journal of every systemd mount) would teach people
/// to ignore errors. Shown when the log was asked for (`-d`, `AWCP_MOUNT_LOG`); any other
/// refused reply (a malformed one would be a bug) is always shown.
pub struct DroppedReplies {
    pub show: bool,
}

/// fuser's module and message for a reply the kernel refused, and ENOENT's text as
/// `std::io::Error` ends it.
const REPLY_TARGET: &str = "fuser::reply";
const REPLY_FAILED: &str = "Failed to send FUSE reply";
const ENOENT_SUFFIX: &str = "(os error 2)";

/// The target `tracing-log` gives every record of the `log` crate (fuser logs through it);
/// the record's own target is in its `log.target` field.
const LOG_BRIDGE_TARGET: &str = "log";

impl<S: Subscriber> Layer<S> for DroppedReplies {
    fn event_enabled(&self, event: &Event<'_>, _cx: Context<'_, S>) -> bool {
        let target = event.metadata().target();
        if self.show || (target != REPLY_TARGET && target != LOG_BRIDGE_TARGET) {
            return true;
        }
        let mut fields = Fields::default();
        event.record(&mut fields);
        let target = fields.log_target.as_deref().unwrap_or(target);
        !(target == REPLY_TARGET
            && fields.message.starts_with(REPLY_FAILED)
            && fields.message.ends_with(ENOENT_SUFFIX))
    }
}

/// An event's `message` and, for a record of the `log` crate, its `log.target`.
#[derive(Default)]
struct Fields {
    message: String,
    log_target: Option<String>,
}

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        match field.name() {
            "message" => self.message = format!("{value:?}"),
            "log.target" => self.log_target = Some(format!("{value:?}")),
            _ => {}
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        match field.name() {
            "message" => self.message = value.to_string(),
            "log.target" => self.log_target = Some(value.to_string()),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    /// Counts the events that reach it.
    struct Count(Arc<AtomicUsize>);

    impl<S: Subscriber> Layer<S> for Count {
        fn on_event(&self, _: &Event<'_>, _: Context<'_, S>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// How many of fuser's reply errors (ENOENT, EINVAL; as `tracing` events and as records of
    /// the `log` crate come through `tracing-log`: target "log", the real one in a field) and
    /// of our own errors get through.
    fn shown(show: bool) -> usize {
        let n = Arc::new(AtomicUsize::new(0));
        let subscriber = tracing_subscriber::registry()
            .with(DroppedReplies { show })
            .with(Count(n.clone()));
        tracing::subscriber::with_default(subscriber, || {
            let enoent = std::io::Error::from_raw_os_error(libc::ENOENT);
            let einval = std::io::Error::from_raw_os_error(libc::EINVAL);
            tracing::error!(target: "fuser::reply", "Failed to send FUSE reply: {enoent}");
            tracing::error!(target: "fuser::reply", "Failed to send FUSE reply: {einval}");
            tracing::warn!(target: "fuser::reply", "Reply not sent for operation 7, replying with I/O error");
            tracing::error!(target: "awcp_mount::mount", "something of ours: {enoent}");
            tracing::error!(target: "log", { log.target = "fuser::reply" }, "Failed to send FUSE reply: {enoent}");
            tracing::error!(target: "log", { log.target = "fuser::reply" }, "Failed to send FUSE reply: {einval}");
            tracing::error!(target: "log", { log.target = "other::crate" }, "Failed to send FUSE reply: {enoent}");
        });
        n.load(Ordering::Relaxed)
    }

    #[test]
    fn only_replies_the_kernel_no_longer_wanted_are_kept_out_unless_asked_for() {
        assert_eq!(
            shown(false),
            5,
            "only fuser's ENOENT reply errors are kept out"
        );
        assert_eq!(
            shown(true),
            7,
            "everything shows when the log was asked for"
        );
    }
}
