//! Run a future on the calling thread until it first waits, then hand it to the runtime only
//! when it is woken.
//!
//! The FUSE threads serve requests this way (see ARCHITECTURE.md, Threads). A request answered
//! from memory completes in its first poll, on the FUSE thread, with no thread hand-off. One
//! that waits for the server has sent its request by then; `tokio::spawn` at that point would
//! wake a worker only to poll the future again and register the runtime's waker, one thread
//! wake-up per request for nothing. Instead the future is parked here with a waker of our
//! own, and spawned by whoever wakes it: the SFTP reader task that completes its reply, which
//! runs on a worker, so the spawned task goes to that worker's own queue and runs right after
//! it, on the same thread.
//!
//! Correctness: a wake that comes while the first poll is still running is remembered and the
//! future is spawned as soon as that poll returns; a wake after the future was handed over
//! finds nothing parked and does nothing (the runtime's task has registered its own waker by
//! then). A future is handed over at most once.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Wake, Waker};

type BoxedFuture = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

enum State {
    /// In its first poll, on the calling thread; `woken` if a wake came meanwhile.
    Polling { woken: bool },
    /// Waiting for its first wake.
    Parked(BoxedFuture),
    /// Handed to the runtime (or done).
    Gone,
}

struct Parking {
    state: Mutex<State>,
    runtime: tokio::runtime::Handle,
}

impl Wake for Parking {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        match std::mem::replace(&mut *state, State::Gone) {
            State::Polling { .. } => *state = State::Polling { woken: true },
            State::Parked(fut) => {
                drop(state);
                self.runtime.spawn(fut);
            }
            State::Gone => {}
        }
    }
}

/// Poll `fut` once here (inside `runtime`'s context, so it may spawn tasks and set timers);
/// if it is not done, it goes on as a task of `runtime` once something wakes it.
pub fn run_here_then_on<F>(runtime: &tokio::runtime::Handle, fut: F)
where
    F: Future<Output = ()> + Send + 'static,
{
    let mut fut: BoxedFuture = Box::pin(fut);
    let _context = runtime.enter();
    let parking = Arc::new(Parking {
        state: Mutex::new(State::Polling { woken: false }),
        runtime: runtime.clone(),
    });
    let waker = Waker::from(parking.clone());
    if fut
        .as_mut()
        .poll(&mut Context::from_waker(&waker))
        .is_ready()
    {
        return;
    }
    let mut state = parking.state.lock().unwrap_or_else(|e| e.into_inner());
    if matches!(*state, State::Polling { woken: true }) {
        *state = State::Gone;
        drop(state);
        runtime.spawn(fut);
    } else {
        *state = State::Parked(fut);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;
    use tokio::sync::oneshot;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_future_that_does_not_wait_runs_only_here() {
        let runtime = tokio::runtime::Handle::current();
        let here = std::thread::current().id();
        let ran_on = Arc::new(Mutex::new(None));
        let r = ran_on.clone();
        // From a plain thread, as a FUSE thread calls it.
        std::thread::spawn(move || {
            run_here_then_on(&runtime, async move {
                *r.lock().unwrap() = Some(std::thread::current().id());
            });
        })
        .join()
        .unwrap();
        let ran = ran_on.lock().unwrap().expect("ran at once");
        assert_ne!(ran, here, "ran on the calling thread, not a worker");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_waiting_future_is_handed_over_when_woken_and_finishes_once() {
        let runtime = tokio::runtime::Handle::current();
        let polls = Arc::new(AtomicUsize::new(0));
        let done = Arc::new(AtomicUsize::new(0));
        let (tx, mut rx) = oneshot::channel::<u32>();
        let (done_tx, done_rx) = oneshot::channel();
        let (p, d) = (polls.clone(), done.clone());
        let rt = runtime.clone();
        std::thread::spawn(move || {
            run_here_then_on(&rt, async move {
                let v = std::future::poll_fn(|cx| {
                    p.fetch_add(1, Ordering::SeqCst);
                    Pin::new(&mut rx).poll(cx)
                })
                .await
                .unwrap();
                d.fetch_add(1, Ordering::SeqCst);
                done_tx.send(v).unwrap();
            });
        })
        .join()
        .unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(done.load(Ordering::SeqCst), 0, "finished without its value");
        // Parked: not polled again before something woke it (a task spawned at once would
        // have been).
        assert_eq!(polls.load(Ordering::SeqCst), 1, "polled again unwoken");
        // Woken from a task on a worker, as the SFTP reader task does.
        tokio::spawn(async move { tx.send(7).unwrap() });
        assert_eq!(done_rx.await.unwrap(), 7);
        assert_eq!(done.load(Ordering::SeqCst), 1);
        assert_eq!(
            polls.load(Ordering::SeqCst),
            2,
            "polled here, then once when woken"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_wake_during_the_first_poll_is_not_lost() {
        let runtime = tokio::runtime::Handle::current();
        let (done_tx, done_rx) = oneshot::channel();
        let rt = runtime.clone();
        std::thread::spawn(move || {
            run_here_then_on(&rt, async move {
                // Wakes itself before returning Pending: nothing else will wake it.
                tokio::task::yield_now().await;
                done_tx.send(()).unwrap();
            });
        })
        .join()
        .unwrap();
        tokio::time::timeout(Duration::from_secs(30), done_rx)
            .await
            .expect("a wake during the first poll was lost")
            .unwrap();
    }

    /// Pending until `go`; gives its waker out and counts its polls.
    struct Capture {
        waker: Arc<Mutex<Option<Waker>>>,
        go: Arc<std::sync::atomic::AtomicBool>,
        polls: Arc<AtomicUsize>,
    }

    impl Future for Capture {
        type Output = ();
        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> std::task::Poll<()> {
            self.polls.fetch_add(1, Ordering::SeqCst);
            if self.go.load(Ordering::SeqCst) {
                return std::task::Poll::Ready(());
            }
            *self.waker.lock().unwrap() = Some(cx.waker().clone());
            std::task::Poll::Pending
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn many_wakes_at_once_hand_it_over_once() {
        let runtime = tokio::runtime::Handle::current();
        for _ in 0..100 {
            let waker = Arc::new(Mutex::new(None));
            let go = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let polls = Arc::new(AtomicUsize::new(0));
            let (done_tx, done_rx) = oneshot::channel();
            let capture = Capture {
                waker: waker.clone(),
                go: go.clone(),
                polls: polls.clone(),
            };
            run_here_then_on(&runtime, async move {
                capture.await;
                done_tx.send(()).unwrap();
            });
            let parked = waker.lock().unwrap().clone().expect("first poll ran here");
            go.store(true, Ordering::SeqCst);
            let threads: Vec<_> = (0..4)
                .map(|_| {
                    let w = parked.clone();
                    std::thread::spawn(move || (0..10).for_each(|_| w.wake_by_ref()))
                })
                .collect();
            threads.into_iter().for_each(|t| t.join().unwrap());
            tokio::time::timeout(Duration::from_secs(30), done_rx)
                .await
                .expect("never finished")
                .unwrap();
            assert_eq!(
                polls.load(Ordering::SeqCst),
                2,
                "polled here, then once when woken"
            );
        }
    }
}
