//! Which handle the server will give the next OPEN on a channel.
//!
//! Opening a small file and reading it costs two round trips in a row: the READ needs the
//! handle the OPEN answers with. OpenSSH's sftp-server, however, hands out handles in a way
//! the client can follow: a handle is the 4-byte big-endian index of a slot in the server
//! process's handle table, an OPEN or OPENDIR takes the slot freed last (the free slots are a
//! stack) or else a new slot at the end, and a CLOSE of a handle in use frees its slot (even
//! if the close(2) under it failed). One channel is one server process, serving its requests
//! in the order they come. So a channel that tracks its OPEN/OPENDIR/CLOSE traffic in that
//! order knows the handle its next OPEN will get, and can send a READ on that handle right
//! behind the OPEN: open and first read in one round trip.
//!
//! The forecast is only ever a guess that is checked: the READ's answer is used only if the
//! OPEN's answer is the forecast handle, and then the READ, served right after that OPEN by
//! the same process, read the file just opened. A wrong guess costs one READ that is thrown
//! away (on a handle that does not exist, or one of ours, where a READ changes nothing). A
//! server that gives a handle the model did not expect (another implementation, or a model
//! out of step) turns forecasting off for the channel for good.

use std::collections::{HashSet, VecDeque};

use bytes::Bytes;

/// A request that changes the server's handle table, as sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Change {
    /// OPEN or OPENDIR: takes a slot if it succeeds.
    Open,
    /// CLOSE of the handle with this index (a handle of another shape changes nothing the
    /// model knows of).
    Close(u32),
}

/// The handle table of one sftp-server process, as its answers so far show it, plus the
/// changes sent and not yet answered.
#[derive(Debug)]
pub(crate) struct HandleForecast {
    /// False once the server gave a handle the model did not expect.
    usable: bool,
    /// Slots in the table (the next new one has this index).
    slots: u32,
    /// Free slots, the one freed last on top.
    free: Vec<u32>,
    /// Slots in use.
    live: HashSet<u32>,
    /// Changes sent and not yet answered, by request id, in the order sent.
    in_flight: VecDeque<(u32, Change)>,
}

impl Default for HandleForecast {
    fn default() -> Self {
        HandleForecast {
            usable: true,
            slots: 0,
            free: Vec::new(),
            live: HashSet::new(),
            in_flight: VecDeque::new(),
        }
    }
}

/// The index a handle of OpenSSH's shape stands for.
pub(crate) fn index_of(handle: &[u8]) -> Option<u32> {
    <[u8; 4]>::try_from(handle).ok().map(u32::from_be_bytes)
}

impl HandleForecast {
    /// Request `id`, which makes `change`, was sent. For an OPEN, the handle it will get
    /// (see [`HandleForecast::handle_for`]), told now: its answer may come before its sender
    /// asks, and an answered request is no longer in flight.
    pub(crate) fn sent(&mut self, id: u32, change: Change) -> Option<Bytes> {
        if !self.usable {
            return None;
        }
        self.in_flight.push_back((id, change));
        match change {
            Change::Open => self.handle_for(id),
            Change::Close(_) => None,
        }
    }

    /// Request `id` was answered: an OPEN with `handle` (None: it failed), a CLOSE whatever
    /// the answer. Answers come in the order the server served the requests, which is what
    /// the table follows.
    pub(crate) fn answered(&mut self, id: u32, handle: Option<&[u8]>) {
        if !self.usable {
            return;
        }
        let Some(at) = self.in_flight.iter().position(|(i, _)| *i == id) else {
            return;
        };
        let (_, change) = self.in_flight.remove(at).expect("position found");
        match change {
            Change::Open => {
                let Some(handle) = handle else { return };
                let expected = take_slot(&mut self.free, &mut self.slots);
                if index_of(handle) != Some(expected) {
                    self.turn_off();
                    return;
                }
                self.live.insert(expected);
            }
            Change::Close(index) => {
                if self.live.remove(&index) {
                    self.free.push(index);
                }
            }
        }
    }

    /// The handle the OPEN sent as request `id` will get if it succeeds and every change
    /// sent before it does what it asks; None if forecasting is off or `id` is not an
    /// OPEN in flight.
    pub(crate) fn handle_for(&self, id: u32) -> Option<Bytes> {
        if !self.usable {
            return None;
        }
        let mut free = self.free.clone();
        let mut slots = self.slots;
        let mut closed = HashSet::new();
        for (i, change) in &self.in_flight {
            match *change {
                Change::Open if *i == id => {
                    let index = take_slot(&mut free, &mut slots);
                    return Some(Bytes::copy_from_slice(&index.to_be_bytes()));
                }
                Change::Open => {
                    take_slot(&mut free, &mut slots);
                }
                Change::Close(index) => {
                    if self.live.contains(&index) && closed.insert(index) {
                        free.push(index);
                    }
                }
            }
        }
        None
    }

    fn turn_off(&mut self) {
        tracing::debug!("SFTP handles do not follow OpenSSH's table: no open-and-read");
        self.usable = false;
        self.in_flight.clear();
        self.free.clear();
        self.live.clear();
    }

    #[cfg(test)]
    fn is_usable(&self) -> bool {
        self.usable
    }
}

/// The slot an OPEN takes: the one freed last, else a new one.
fn take_slot(free: &mut Vec<u32>, slots: &mut u32) -> u32 {
    free.pop().unwrap_or_else(|| {
        *slots += 1;
        *slots - 1
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(i: u32) -> Vec<u8> {
        i.to_be_bytes().to_vec()
    }

    /// A stand-in for sftp-server's table (sftp-server.c: handle_new, handle_unused).
    #[derive(Default)]
    struct Server {
        slots: u32,
        free: Vec<u32>,
        used: HashSet<u32>,
    }

    impl Server {
        fn open(&mut self) -> u32 {
            let i = take_slot(&mut self.free, &mut self.slots);
            self.used.insert(i);
            i
        }
        fn close(&mut self, i: u32) {
            if self.used.remove(&i) {
                self.free.push(i);
            }
        }
    }

    #[test]
    fn follows_the_servers_table_with_requests_in_flight() {
        let mut f = HandleForecast::default();
        let mut server = Server::default();
        let mut id = 0;
        let mut next = || {
            id += 1;
            id
        };
        // Three opens answered: 0, 1, 2.
        for want in 0..3 {
            let i = next();
            assert_eq!(f.sent(i, Change::Open).unwrap(), h(want));
            assert_eq!(f.handle_for(i).unwrap(), h(want));
            f.answered(i, Some(&h(server.open())));
        }
        // Close 1 and 0 in flight, an open behind them takes 0 (freed last), the next 1,
        // the next a new slot.
        let c1 = next();
        f.sent(c1, Change::Close(1));
        let c0 = next();
        f.sent(c0, Change::Close(0));
        let (o1, o2, o3) = (next(), next(), next());
        for o in [o1, o2, o3] {
            f.sent(o, Change::Open);
        }
        assert_eq!(f.handle_for(o1).unwrap(), h(0));
        assert_eq!(f.handle_for(o2).unwrap(), h(1));
        assert_eq!(f.handle_for(o3).unwrap(), h(3));
        assert_eq!(f.handle_for(c1), None, "not an open");
        // Served in order.
        server.close(1);
        f.answered(c1, None);
        server.close(0);
        f.answered(c0, None);
        // The first open fails: the forecast for the others moves down.
        f.answered(o1, None);
        assert_eq!(f.handle_for(o2).unwrap(), h(0));
        assert_eq!(f.handle_for(o3).unwrap(), h(1));
        f.answered(o2, Some(&h(server.open())));
        f.answered(o3, Some(&h(server.open())));
        assert!(f.is_usable());
        // A close of a handle not in use frees nothing; nor does a second close.
        let (c9, c2, c2b, o) = (next(), next(), next(), next());
        f.sent(c9, Change::Close(9));
        f.sent(c2, Change::Close(2));
        f.sent(c2b, Change::Close(2));
        f.sent(o, Change::Open);
        assert_eq!(f.handle_for(o).unwrap(), h(2));
        for c in [9, 2, 2] {
            server.close(c);
        }
        f.answered(c9, None);
        f.answered(c2, None);
        f.answered(c2b, None);
        f.answered(o, Some(&h(server.open())));
        let o = next();
        f.sent(o, Change::Open);
        assert_eq!(f.handle_for(o).unwrap(), h(server.open()));
    }

    #[test]
    fn a_handle_the_model_did_not_expect_turns_it_off() {
        let mut f = HandleForecast::default();
        assert_eq!(f.sent(1, Change::Open).unwrap(), h(0));
        f.answered(1, Some(b"some-other-server-handle"));
        assert!(!f.is_usable());
        assert_eq!(f.sent(2, Change::Open), None);
        assert_eq!(f.handle_for(2), None);

        let mut f = HandleForecast::default();
        f.sent(1, Change::Open);
        f.answered(1, Some(&h(5)));
        assert!(!f.is_usable(), "index 5 where 0 was due");
    }
}
