//! Loopback TCP relay that adds a fixed round-trip time: a delay line, not a throttle.
//!
//! Used by `scripts/bench.sh` to put awcp-mount and sshfs "far" from the private sshd:
//!
//! ```text
//! latency_relay --upstream 127.0.0.1:SSHD_PORT --rtt-ms 20 [--listen 127.0.0.1:0] [--port-file F]
//! ```
//!
//! Every accepted connection gets its own connection to the upstream. In each direction a
//! reader task stamps every chunk it reads with `arrival + rtt/2` and queues it; a writer task
//! sleeps until a chunk's stamp and writes it. The reader never waits for the writer (beyond a
//! large byte budget that bounds memory), so many chunks are in flight at once and throughput
//! is whatever the endpoints manage: only latency is added, order is preserved, and a stream
//! with one chunk in flight (stop-and-wait) sees exactly one RTT per exchange.
//!
//! The wait uses a timerfd per direction rather than `tokio::time`, whose 1 ms granularity
//! (a deadline is rounded up to the next tick, and the driver sleeps in whole ms) adds
//! 1-2 ms to every one-way trip: 2.4 ms per round trip at "0 ms", 22.6 at "20 ms".
//!
//! Only loopback addresses are accepted for both ends. It prints the listening port on the
//! first line of stdout (and to `--port-file`), then runs until killed.

use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncReadExt, AsyncWriteExt, Interest};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Semaphore};

/// Largest chunk read at once.
const CHUNK: usize = 256 * 1024;
/// Bytes queued in one direction before the reader waits (bounds memory, not throughput:
/// 64 MiB per 25 ms is 2.5 GiB/s).
const BUDGET: usize = 64 * 1024 * 1024;

struct Args {
    listen: SocketAddr,
    upstream: SocketAddr,
    one_way: Duration,
    port_file: Option<String>,
}

fn usage() -> ! {
    eprintln!(
        "usage: latency_relay --upstream 127.0.0.1:PORT --rtt-ms MS [--listen 127.0.0.1:PORT] [--port-file FILE]"
    );
    std::process::exit(2);
}

fn parse_args() -> Args {
    let mut listen: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let mut upstream = None;
    let mut rtt_ms: Option<f64> = None;
    let mut port_file = None;
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut val = || it.next().unwrap_or_else(|| usage());
        match a.as_str() {
            "--listen" => listen = val().parse().unwrap_or_else(|_| usage()),
            "--upstream" => upstream = Some(val().parse().unwrap_or_else(|_| usage())),
            "--rtt-ms" => rtt_ms = Some(val().parse().unwrap_or_else(|_| usage())),
            "--port-file" => port_file = Some(val()),
            _ => usage(),
        }
    }
    let upstream: SocketAddr = upstream.unwrap_or_else(|| usage());
    let rtt_ms = rtt_ms.unwrap_or_else(|| usage());
    if !(0.0..=10_000.0).contains(&rtt_ms) {
        usage();
    }
    for addr in [listen, upstream] {
        if !addr.ip().is_loopback() {
            eprintln!("latency_relay: {addr} is not a loopback address; refusing");
            std::process::exit(2);
        }
    }
    Args {
        listen,
        upstream,
        one_way: Duration::from_secs_f64(rtt_ms / 2000.0),
        port_file,
    }
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let args = parse_args();
    let listener = TcpListener::bind(args.listen).await?;
    let port = listener.local_addr()?.port();
    if let Some(f) = &args.port_file {
        // Written whole, then renamed, so a reader never sees a partial number.
        let tmp = format!("{f}.tmp");
        std::fs::write(&tmp, format!("{port}\n"))?;
        std::fs::rename(&tmp, f)?;
    }
    println!("{port}");
    loop {
        let (client, _) = listener.accept().await?;
        let upstream = args.upstream;
        let one_way = args.one_way;
        tokio::spawn(async move {
            match TcpStream::connect(upstream).await {
                Ok(server) => relay(client, server, one_way).await,
                Err(e) => eprintln!("latency_relay: connecting to {upstream}: {e}"),
            }
        });
    }
}

async fn relay(client: TcpStream, server: TcpStream, one_way: Duration) {
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (cr, cw) = client.into_split();
    let (sr, sw) = server.into_split();
    let up = tokio::spawn(direction(cr, sw, one_way));
    let down = tokio::spawn(direction(sr, cw, one_way));
    let _ = tokio::join!(up, down);
}

/// A CLOCK_MONOTONIC timerfd (the clock `Instant` uses), awaited through tokio's reactor.
struct Timer(AsyncFd<OwnedFd>);

impl Timer {
    fn new() -> std::io::Result<Timer> {
        // SAFETY: plain syscall; the returned descriptor is checked and then owned.
        let fd = unsafe {
            libc::timerfd_create(
                libc::CLOCK_MONOTONIC,
                libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: fd is a fresh descriptor nothing else owns; the OwnedFd keeps it open (and
        // the same) for as long as the AsyncFd that owns it lives.
        let owned = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Timer(unsafe {
            AsyncFd::register_with_interest(owned, Interest::READABLE)
        }?))
    }

    /// Returns at `due` (give or take the scheduler's wake-up latency, tens of µs).
    async fn sleep_until(&self, due: Instant) -> std::io::Result<()> {
        let left = due.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(());
        }
        let spec = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: libc::timespec {
                tv_sec: left.as_secs() as libc::time_t,
                tv_nsec: left.subsec_nanos() as libc::c_long,
            },
        };
        let fd = self.0.get_ref().as_raw_fd();
        // SAFETY: fd is our timerfd; spec is a valid itimerspec; the old value is not asked for.
        if unsafe { libc::timerfd_settime(fd, 0, &spec, std::ptr::null_mut()) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
        loop {
            let mut guard = self.0.readable().await?;
            let mut expirations = [0u8; 8];
            // SAFETY: reads at most 8 bytes into an 8-byte buffer.
            let n = unsafe { libc::read(fd, expirations.as_mut_ptr().cast(), 8) };
            if n == 8 {
                return Ok(());
            }
            let err = std::io::Error::last_os_error();
            if err.kind() != std::io::ErrorKind::WouldBlock {
                return Err(err);
            }
            guard.clear_ready();
        }
    }
}

/// One direction of the delay line: `from` -> queue (stamped) -> `to` at the stamp.
async fn direction(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, one_way: Duration) {
    let timer = match Timer::new() {
        Ok(t) => t,
        Err(e) => {
            eprintln!("latency_relay: timerfd: {e}");
            return;
        }
    };
    let budget = Arc::new(Semaphore::new(BUDGET));
    let (tx, mut rx) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();

    let reader_budget = budget.clone();
    let reader = tokio::spawn(async move {
        let mut buf = vec![0u8; CHUNK];
        loop {
            let n = match from.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let due = Instant::now() + one_way;
            match reader_budget.acquire_many(n as u32).await {
                Ok(p) => p.forget(),
                Err(_) => break,
            }
            if tx.send((due, buf[..n].to_vec())).is_err() {
                break;
            }
        }
        // Dropping tx ends the writer once the queue is drained (a half-close travels
        // with the same delay as the data before it).
    });

    while let Some((due, data)) = rx.recv().await {
        let sent = match timer.sleep_until(due).await {
            Ok(()) => to.write_all(&data).await,
            Err(e) => Err(e),
        };
        if sent.is_err() {
            // The far end is gone: stop reading too.
            budget.close();
            reader.abort();
            return;
        }
        budget.add_permits(data.len());
    }
    let _ = to.shutdown().await;
}
