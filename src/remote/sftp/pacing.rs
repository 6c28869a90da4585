//! How much READ and WRITE data one channel may have in flight: enough for the link, no more.
//!
//! **Why.** Write data the server has received but its sftp-server has not yet taken sits in
//! sshd's channel buffer, and OpenSSH grows that buffer by reallocating it (`sshbuf` growth
//! goes through `recallocarray`: a fresh allocation, a copy of everything queued, zeroing and
//! freeing the old one). So every 32 KiB SSH packet appended to a 1 MiB backlog costs sshd a
//! copy of the megabyte and page faults on new memory: its CPU per byte grows with the backlog,
//! and on loopback sshd is what limits a sequential write. With the channel's whole 8 MiB byte
//! bound open to writes (4 lanes x sshd's 2 MiB window queued), sshd's connection process took
//! 0.46-0.52 s CPU and 72,000-81,000 minor faults per 256 MiB written; with 1 MiB per channel,
//! 0.27-0.33 s and 10,000-12,000, and a 256 MiB `dd conv=fsync` on loopback took 0.51-0.67 s
//! instead of 0.69-0.75 s (docs/PERFORMANCE.md, "Sequential writes").
//!
//! Reads pile up the other way: the sftp-server answers READs as fast as its disk does, and
//! what sshd has not yet encrypted and sent waits in its buffers (growing them costs page
//! faults, as with writes: that is what the budget took away). One reader on one channel
//! stays below the point where that costs much; four channels busy at once (8 readers of one
//! file on loopback) each with the whole 8 MiB of READs in flight cost sshd 0.67 s CPU and
//! 34,000 minor faults per 256 MiB, against 0.54 s and 3,000 with [`MIN_READ_BUDGET`] per
//! channel (see there).
//!
//! **How much.** On a long link the data in flight is mostly on the wire, not queued at the
//! server, and it must cover the bandwidth-delay product. So the budget follows the round
//! trip: [`write_budget`] and [`read_budget`] are the channel's recent minimum reply time
//! times [`PACING_RATE`], between a floor ([`MIN_WRITE_BUDGET`], [`MIN_READ_BUDGET`]) and the
//! channel's byte bound. The minimum reply time is the round trip plus the server's quickest
//! answer, as TCP's min-RTT filters use; it is taken over two windows of [`RTT_WINDOW`], so a
//! link that got slower is noticed within 20 s.
//!
//! A budget is applied by charging the request's bytes more of the channel's byte semaphore
//! ([`write_cost`], [`read_cost`]) rather than by a semaphore of its own, so reads and writes
//! still share one bound and nothing has to be resized while permits are held.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Smallest write budget per channel: four 255 KiB WRITEs, enough to keep one sftp-server
/// busy on loopback. Measured with 256 MiB `dd conv=fsync`, 4 lanes: 768 KiB 0.62-0.67 s,
/// 1 MiB 0.51-0.57 s (one run 0.75 s), 2 MiB (the same as no budget: sshd's window)
/// 0.64-0.93 s.
pub const MIN_WRITE_BUDGET: usize = 1024 * 1024;

/// Smallest read budget per channel: twelve 255 KiB READs. 8 `dd` readers of 32 MiB slices of
/// one 256 MiB file at once (4 channels) on loopback, alternating rounds on fresh mounts,
/// medians of 9: no budget (the channel's 8 MiB) 0.674 s, sshd 0.67 s CPU and 34,000 minor
/// faults; 3 MiB 0.569 s, 0.54 s and 3,000; 2 MiB 0.611 s, 0.57 s and 3,000. One `dd` of the
/// whole file: 0.480, 0.485 and 0.551 s. 1 MiB was slower for that single reader (0.645 s
/// against 0.578 s, 7 rounds), and 4 MiB already let the faults back (10,000-25,000).
pub const MIN_READ_BUDGET: usize = 3 * 1024 * 1024;

/// Throughput one channel's budget is sized for: budget = min reply time x this. 1 GiB/s is
/// well above what one sftp-server moves, so the budget never limits a link that is not
/// limited by the server anyway; for writes, at 2 ms it reaches sshd's 2 MiB window, which is
/// then the bound (a 20 ms link gets the channel's whole byte bound, for reads and writes).
pub const PACING_RATE: u64 = 1 << 30;

/// Length of each of the two windows the minimum reply time is taken over.
pub const RTT_WINDOW: Duration = Duration::from_secs(10);

/// Bytes of WRITE data a channel whose minimum reply time is `min_rtt` may have in flight, at
/// most `max` (the channel's byte bound). `None` (nothing measured yet): `max`.
pub fn write_budget(min_rtt: Option<Duration>, max: usize) -> usize {
    budget(min_rtt, MIN_WRITE_BUDGET, max)
}

/// Bytes of READs a channel whose minimum reply time is `min_rtt` may have in flight, at most
/// `max` (the channel's byte bound). `None` (nothing measured yet): `max`.
pub fn read_budget(min_rtt: Option<Duration>, max: usize) -> usize {
    budget(min_rtt, MIN_READ_BUDGET, max)
}

/// `min_rtt` x [`PACING_RATE`], between `floor` and `max` (`max` wins over `floor`).
fn budget(min_rtt: Option<Duration>, floor: usize, max: usize) -> usize {
    let Some(rtt) = min_rtt else { return max };
    let bdp = rtt.as_nanos().saturating_mul(PACING_RATE as u128) / 1_000_000_000;
    (bdp.min(max as u128) as usize).clamp(floor.min(max), max)
}

/// The least a WRITE counts against the budget, however small: so the budget also bounds
/// how many small WRITEs are in flight, by the round trip like their bytes. On loopback (the
/// 1 MiB floor) that is 64, what a channel allowed of any request before it allowed 256:
/// 5,000 random 4 KiB `pwrite`s took 0.23-0.37 s with 64 in flight, 0.32-0.60 s with 256
/// and 0.52-0.55 s with 448 (sshfs 0.34-0.43 s); at 20 ms 256 are needed (64: 1.8 s).
pub const MIN_WRITE_CHARGE: usize = 16 * 1024;

/// Permits of a `max`-permit byte semaphore a WRITE of `len` bytes takes when writes may
/// have `budget` bytes in flight: `len * max / budget` (`len` at least [`MIN_WRITE_CHARGE`]),
/// so `budget` bytes of writes fill it. Never more than `max`, so one WRITE larger than the
/// budget still goes, alone.
pub fn write_cost(len: usize, budget: usize, max: usize) -> usize {
    if len == 0 {
        return 0;
    }
    scaled_cost(len.max(MIN_WRITE_CHARGE), budget, max)
}

/// Permits of a `max`-permit byte semaphore a READ of `len` bytes takes when reads may have
/// `budget` bytes in flight: `len * max / budget`, never more than `max`. No least charge as
/// for writes, which was measured for thousands of small WRITEs queued at once: small READs
/// come a few at a time (a random reader waits for each; small files are read ahead at most
/// 32 at once).
pub fn read_cost(len: usize, budget: usize, max: usize) -> usize {
    scaled_cost(len, budget, max)
}

/// `len * max / budget` (rounded up), at most `max`.
fn scaled_cost(len: usize, budget: usize, max: usize) -> usize {
    let budget = budget.clamp(1, max.max(1));
    let scaled = (len as u128 * max as u128).div_ceil(budget as u128);
    scaled.min(max as u128) as usize
}

/// The minimum reply time of one channel over the last one to two [`RTT_WINDOW`]s.
#[derive(Debug, Default)]
pub struct MinRtt {
    state: Mutex<Windows>,
}

#[derive(Debug, Default)]
struct Windows {
    /// Minimum of the window that started at `started`, if any sample came in it.
    current: Option<(Instant, Duration)>,
    /// Minimum of the window before it.
    previous: Option<Duration>,
}

impl MinRtt {
    /// Record one reply that took `rtt`, received at `now`.
    pub fn sample(&self, now: Instant, rtt: Duration) {
        let mut w = self.state.lock().unwrap_or_else(|e| e.into_inner());
        match w.current {
            Some((started, min)) if now.saturating_duration_since(started) < RTT_WINDOW => {
                w.current = Some((started, min.min(rtt)));
            }
            Some((started, min)) => {
                // A window with no sample at all in between leaves nothing to remember.
                let adjacent = now.saturating_duration_since(started) < 2 * RTT_WINDOW;
                w.previous = adjacent.then_some(min);
                w.current = Some((now, rtt));
            }
            None => w.current = Some((now, rtt)),
        }
    }

    /// The smallest reply time of the current and the previous window; `None` before any.
    pub fn get(&self) -> Option<Duration> {
        let w = self.state.lock().unwrap_or_else(|e| e.into_inner());
        match (w.current.map(|(_, m)| m), w.previous) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAX: usize = 8 * 1024 * 1024;
    const MIB: usize = 1024 * 1024;

    /// A measured minimum reply time of `u` microseconds / `m` milliseconds.
    fn us(u: u64) -> Option<Duration> {
        Some(Duration::from_micros(u))
    }
    fn ms(m: u64) -> Option<Duration> {
        us(m * 1000)
    }

    #[test]
    fn the_budget_follows_the_round_trip_between_its_bounds() {
        // Loopback and LAN: the floor.
        assert_eq!(write_budget(us(80), MAX), MIN_WRITE_BUDGET);
        assert_eq!(write_budget(us(900), MAX), MIN_WRITE_BUDGET);
        // In between: round trip x 1 GiB/s.
        assert_eq!(write_budget(ms(1), MAX), 1_073_741);
        assert_eq!(write_budget(ms(2), MAX), 2_147_483);
        assert_eq!(write_budget(ms(4), MAX), 4_294_967);
        // A long link, or nothing measured yet: the channel's whole bound.
        assert_eq!(write_budget(ms(20), MAX), MAX);
        assert_eq!(write_budget(None, MAX), MAX);
        // A bound below the floor wins.
        assert_eq!(write_budget(ms(1), MIB / 2), MIB / 2);
    }

    #[test]
    fn the_read_budget_has_its_own_floor() {
        assert_eq!(read_budget(us(80), MAX), MIN_READ_BUDGET);
        assert_eq!(read_budget(ms(2), MAX), MIN_READ_BUDGET);
        assert_eq!(read_budget(ms(4), MAX), 4_294_967);
        assert_eq!(read_budget(ms(20), MAX), MAX);
        assert_eq!(read_budget(None, MAX), MAX);
        assert_eq!(read_budget(ms(1), 2 * MIB), 2 * MIB);
    }

    #[test]
    fn reads_fill_the_semaphore_at_the_budget_whatever_their_size() {
        // 3 MiB budget on an 8 MiB semaphore: twelve 255 KiB reads fit, a thirteenth does not.
        let r = read_cost(255 * 1024, 3 * MIB, MAX);
        assert!(12 * r <= MAX && 13 * r > MAX, "cost {r}");
        // Small reads count their bytes only (scaled), unlike small writes.
        assert_eq!(read_cost(4096, MAX, MAX), 4096);
        assert_eq!(read_cost(3072, 3 * MIB, MAX), 8192);
        // Larger than the budget: the whole semaphore, alone. Nothing costs nothing.
        assert_eq!(read_cost(4 * MIB, 3 * MIB, MAX), MAX);
        assert_eq!(read_cost(0, 3 * MIB, MAX), 0);
    }

    #[test]
    fn writes_fill_the_semaphore_at_the_budget() {
        // 1 MiB budget on an 8 MiB semaphore: each write byte counts 8.
        assert_eq!(write_cost(255 * 1024, MIB, MAX), 8 * 255 * 1024);
        // Four 255 KiB writes fit, a fifth does not.
        assert!(4 * write_cost(255 * 1024, MIB, MAX) <= MAX);
        assert!(5 * write_cost(255 * 1024, MIB, MAX) > MAX);
        // The whole bound as budget: bytes are bytes, small writes count 16 KiB.
        assert_eq!(write_cost(64 * 1024, MAX, MAX), 64 * 1024);
        assert_eq!(write_cost(4096, MAX, MAX), MIN_WRITE_CHARGE);
        // So small writes in flight follow the round trip too: 64 on loopback's 1 MiB
        // budget, 512 on a long link's 8 MiB (where the channel's request bound is lower).
        assert_eq!(MAX / write_cost(512, MIB, MAX), 64);
        assert_eq!(MAX / write_cost(512, MAX, MAX), 512);
        // A write larger than the budget still fits the semaphore, alone.
        assert_eq!(write_cost(2 * MIB, MIB, MAX), MAX);
        // Nothing to write costs nothing.
        assert_eq!(write_cost(0, MIB, MAX), 0);
    }

    #[test]
    fn the_minimum_is_kept_for_one_to_two_windows() {
        let rtt = MinRtt::default();
        assert_eq!(rtt.get(), None);
        let t0 = Instant::now();
        let us = Duration::from_micros;
        rtt.sample(t0, us(500));
        rtt.sample(t0 + Duration::from_secs(1), us(100));
        rtt.sample(t0 + Duration::from_secs(2), us(900));
        assert_eq!(rtt.get(), Some(us(100)));
        // Next window: the old minimum still counts.
        rtt.sample(t0 + RTT_WINDOW + Duration::from_secs(1), us(20_000));
        assert_eq!(rtt.get(), Some(us(100)));
        // The window after: only the 20 ms one is left.
        rtt.sample(t0 + 2 * RTT_WINDOW + Duration::from_secs(2), us(25_000));
        assert_eq!(rtt.get(), Some(us(20_000)));
    }

    #[test]
    fn a_window_without_samples_forgets_what_came_before_it() {
        let rtt = MinRtt::default();
        let t0 = Instant::now();
        rtt.sample(t0, Duration::from_micros(100));
        // The next sample comes three windows later: the link may have changed meanwhile.
        rtt.sample(t0 + 3 * RTT_WINDOW, Duration::from_millis(20));
        assert_eq!(rtt.get(), Some(Duration::from_millis(20)));
    }
}
