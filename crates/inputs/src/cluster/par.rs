//! Work over many independent items (a dump's objects, a cluster's nodes) spread over the
//! machine's cores: items are taken in blocks by whichever thread is free, and the blocks'
//! results come back in the items' order, so the outcome does not depend on the threads.
//!
//! The calling thread works too: besides saving a thread, memory it allocates comes from the
//! process's main heap, which grows in large steps, where another thread's heap grows a page
//! at a time (one system call per page, which stalls the other threads' page faults).

use std::num::NonZeroUsize;
use std::ops::Range;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, channel};

/// Most threads used: beyond this, each thread's own state (an allocator's index of the
/// devices in use) costs more memory than the time it saves.
const MAX_THREADS: usize = 8;

/// How many threads to use, the calling one included.
fn threads() -> usize {
    std::thread::available_parallelism()
        .map_or(1, NonZeroUsize::get)
        .min(MAX_THREADS)
}

/// How many threads to use for `items` items in blocks of `block` (at least one).
pub(super) fn threads_for(items: usize, block: usize) -> usize {
    threads().min(items.div_ceil(block.max(1))).max(1)
}

/// The results of `work` over `0..items` in blocks of `block` items, in the blocks' order.
///
/// One thread runs for each of `states` (the calling thread for the first; give
/// [`threads_for`] of them), and passes its state to `work` for each block it takes. A block
/// whose result `last` says is the last one (an error) ends the work: the blocks after it are
/// not run or are dropped, the blocks before it all run. With one state, everything runs on
/// the calling thread, in order.
pub(super) fn map_blocks<S, T, W, L>(
    items: usize,
    block: usize,
    states: Vec<S>,
    work: W,
    last: L,
) -> Vec<T>
where
    S: Send,
    T: Send,
    W: Fn(&mut S, Range<usize>) -> T + Sync,
    L: Fn(&T) -> bool + Sync,
{
    let block = block.max(1);
    let blocks = items.div_ceil(block);
    let next = AtomicUsize::new(0);
    // The first block whose result is the last one (`usize::MAX`: none yet).
    let stop_at = AtomicUsize::new(usize::MAX);
    // Takes blocks in increasing order until none is left or one is the last: every block
    // before the last one is taken by some thread, and run.
    let worker = |mut state: S| {
        let mut done = Vec::new();
        loop {
            let b = next.fetch_add(1, Ordering::Relaxed);
            if b >= blocks || b > stop_at.load(Ordering::Relaxed) {
                break;
            }
            let result = work(&mut state, b * block..((b + 1) * block).min(items));
            if last(&result) {
                stop_at.fetch_min(b, Ordering::Relaxed);
            }
            done.push((b, result));
        }
        done
    };
    let mut states = states.into_iter();
    let Some(first) = states.next() else {
        return Vec::new();
    };
    let parts: Vec<Vec<(usize, T)>> = std::thread::scope(|scope| {
        let handles: Vec<_> = states.map(|s| scope.spawn(move || worker(s))).collect();
        let mut parts = vec![worker(first)];
        parts.extend(
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p))),
        );
        parts
    });
    let end = stop_at.into_inner().min(blocks);
    in_order(parts, end.saturating_add(1).min(blocks))
}

/// The results of `parts` (each a thread's, with its blocks' positions) for blocks
/// `0..blocks`, in order.
fn in_order<T>(parts: Vec<Vec<(usize, T)>>, blocks: usize) -> Vec<T> {
    let mut slots: Vec<Option<T>> = (0..blocks).map(|_| None).collect();
    for (b, result) in parts.into_iter().flatten() {
        if let Some(slot) = slots.get_mut(b) {
            *slot = Some(result);
        }
    }
    slots.into_iter().flatten().collect()
}

/// Runs `produce` on the calling thread, which hands out blocks of work as it goes (a dump's
/// items as its reading finds them), while other threads run `work` on each block, and the
/// calling thread too once `produce` returns; returns what `produce` returns and the blocks'
/// results in the order they were handed out. With one core, the blocks are worked on after
/// `produce` returns, in order.
pub(super) fn map_produced<B, T, R, P, W>(produce: P, work: W) -> (R, Vec<T>)
where
    B: Send,
    T: Send,
    P: FnOnce(&mut dyn FnMut(B)) -> R,
    W: Fn(B) -> T + Sync,
{
    let (sender, receiver) = channel::<(usize, B)>();
    let receiver = Mutex::new(receiver);
    // Works on blocks until every block is handed out and the sender is gone.
    let worker = || {
        let mut done = Vec::new();
        while let Some((i, block)) = receive(&receiver) {
            done.push((i, work(block)));
        }
        done
    };
    std::thread::scope(|scope| {
        let handles: Vec<_> = (1..threads()).map(|_| scope.spawn(worker)).collect();
        let mut handed_out = 0;
        let r = produce(&mut |block| {
            // The receiver lives until this function returns: the send cannot fail.
            let _ = sender.send((handed_out, block));
            handed_out += 1;
        });
        drop(sender);
        let mut parts = vec![worker()];
        parts.extend(
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p))),
        );
        (r, in_order(parts, handed_out))
    })
}

/// The next block from `receiver`; `None` once the sender is gone and every block taken.
fn receive<B>(receiver: &Mutex<Receiver<(usize, B)>>) -> Option<(usize, B)> {
    receiver.lock().ok()?.recv().ok()
}
