//! Name changes through the mount, for opening a live file again by its path.
//!
//! SFTP has no handle by inode: a file the mount must open again (after a reconnect, for
//! striping lanes, or to give a descriptor reading from a fetched-ahead copy a server handle)
//! is opened by the path the inode table knows it by. A rename or unlink through the mount
//! that the server carries out between the path lookup and the OPEN would have the OPEN land
//! on whatever has the name then: an editor's atomic save (`rename("f.tmp", "f")`) during an
//! outage made the writes a drop took, sent again, land in the new file. So every open of a
//! live file by its path ([`super::Fs::open_by_name`]) looks its path up only while no such
//! change is on its way, and keeps the handle only if none started before the OPEN was
//! answered; otherwise it opens again under the new name, or fails if the file has none.
//!
//! Changes made on the server by others are outside what the mount can see (SFTP v3 has no
//! inode numbers to check against): that risk stays, and SEMANTICS.md says so.

use tokio::sync::watch;

/// Counts the renames and unlinks through the mount that started and that finished.
#[derive(Debug)]
pub struct NameChanges {
    /// (started, finished).
    counts: watch::Sender<(u64, u64)>,
}

impl Default for NameChanges {
    fn default() -> Self {
        NameChanges {
            counts: watch::Sender::new((0, 0)),
        }
    }
}

/// A name change on its way to the server: finished when dropped, which must be after the
/// inode table shows its outcome (or after it failed).
#[must_use = "the change counts as on its way until the guard is dropped"]
pub struct NameChange<'a>(&'a NameChanges);

impl Drop for NameChange<'_> {
    fn drop(&mut self) {
        self.0.counts.send_modify(|(_, finished)| *finished += 1);
    }
}

impl NameChanges {
    /// A change is about to be sent; call before the request goes out.
    pub fn start(&self) -> NameChange<'_> {
        self.counts.send_modify(|(started, _)| *started += 1);
        NameChange(self)
    }

    /// A change whose outcome the inode table already shows (an unlink answered before its
    /// REMOVE is sent): an open of a name looked up before it must not be kept.
    pub fn bump(&self) {
        self.counts.send_modify(|(started, finished)| {
            *started += 1;
            *finished += 1;
        });
    }

    /// Wait until no change is on its way; the number started so far, for [`Self::since`].
    pub async fn quiet(&self) -> u64 {
        let mut rx = self.counts.subscribe();
        // The sender lives in `self`: wait_for cannot see it closed.
        let counts = *rx
            .wait_for(|(started, finished)| started == finished)
            .await
            .expect("the sender lives as long as self");
        counts.0
    }

    /// Whether a change started since [`Self::quiet`] returned `mark`.
    pub fn since(&self, mark: u64) -> bool {
        self.counts.borrow().0 != mark
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn quiet_waits_for_changes_on_their_way_and_since_sees_new_ones() {
        let n = NameChanges::default();
        let mark = n.quiet().await;
        assert!(!n.since(mark));
        let change = n.start();
        assert!(n.since(mark), "a change started after the mark");
        // quiet() does not return while the change is on its way.
        let waiting = tokio::time::timeout(Duration::from_millis(50), n.quiet()).await;
        assert!(waiting.is_err(), "quiet returned with a change on its way");
        drop(change);
        let mark = n.quiet().await;
        assert!(!n.since(mark));
        n.bump();
        assert!(n.since(mark), "a change already done counts too");
        assert_eq!(n.quiet().await, mark + 1);
    }
}
