//! The epoch ticker: advances the engine's epoch while calls run, so a call past its deadline
//! is interrupted, and parks when no call has run for a while.

use parking_lot::{Condvar, Mutex};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Instant;

use wasmtime::EngineWeak;

use super::{IDLE_PARK, TICK};

/// Advances the engine's epoch every [`TICK`] while calls run, so a call past its deadline
/// is interrupted; sleeps when no call has run for [`IDLE_PARK`].
pub(super) struct Ticker {
    active: AtomicUsize,
    parked: AtomicBool,
    shutdown: AtomicBool,
    lock: Mutex<()>,
    wake: Condvar,
}

/// Marks a call as running for the ticker.
pub(super) struct Active<'t>(&'t Ticker);

impl Drop for Active<'_> {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Ticker {
    pub(super) fn start(engine: EngineWeak) -> std::io::Result<Arc<Ticker>> {
        let ticker = Arc::new(Ticker {
            active: AtomicUsize::new(0),
            parked: AtomicBool::new(false),
            shutdown: AtomicBool::new(false),
            lock: Mutex::new(()),
            wake: Condvar::new(),
        });
        let t = ticker.clone();
        std::thread::Builder::new()
            .name("kubedev-policy-epoch".into())
            .stack_size(64 << 10)
            .spawn(move || t.run(engine))?;
        Ok(ticker)
    }

    pub(super) fn enter(&self) -> Active<'_> {
        self.active.fetch_add(1, Ordering::SeqCst);
        if self.parked.load(Ordering::SeqCst) {
            // The ticker holds the lock until it waits, so this wakes it for sure.
            let _g = self.lock.lock();
            self.wake.notify_one();
        }
        Active(self)
    }

    pub(super) fn shut_down(&self) {
        self.shutdown.store(true, Ordering::SeqCst);
        let _g = self.lock.lock();
        self.wake.notify_one();
    }

    fn run(&self, engine: EngineWeak) {
        let mut idle_since: Option<Instant> = None;
        loop {
            if self.shutdown.load(Ordering::SeqCst) {
                return;
            }
            if self.active.load(Ordering::SeqCst) == 0 {
                let now = Instant::now();
                if now.duration_since(*idle_since.get_or_insert(now)) >= IDLE_PARK {
                    let mut g = self.lock.lock();
                    self.parked.store(true, Ordering::SeqCst);
                    while self.active.load(Ordering::SeqCst) == 0
                        && !self.shutdown.load(Ordering::SeqCst)
                    {
                        self.wake.wait(&mut g);
                    }
                    self.parked.store(false, Ordering::SeqCst);
                    idle_since = None;
                    continue;
                }
            } else {
                idle_since = None;
            }
            std::thread::sleep(TICK);
            match engine.upgrade() {
                Some(e) => e.increment_epoch(),
                None => return,
            }
        }
    }
}
