//! Work over many independent items (a dump's objects, a cluster's nodes) spread over the
//! machine's cores: items are taken in blocks by whichever thread is free, and the blocks'
//! results come back in the items' order, so the outcome does not depend on the threads.

use std::num::NonZeroUsize;
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Most threads used: beyond this, each thread's own state (an allocator's index of the
/// devices in use) costs more memory than the time it saves.
const MAX_THREADS: usize = 8;

/// The results of `work` over `0..items` in blocks of `block` items, in the blocks' order.
///
/// Each thread builds its state with `init` when it takes its first block and passes it to
/// `work` for each block it takes. A block whose result `last` says is the last one (an
/// error) ends the work: the blocks after it are not run or are dropped, the blocks before it
/// all run. With one core or one block, everything runs on the calling thread, in order.
pub(super) fn map_blocks<S, T, I, W, L>(
    items: usize,
    block: usize,
    init: I,
    work: W,
    last: L,
) -> Vec<T>
where
    T: Send,
    I: Fn() -> S + Sync,
    W: Fn(&mut S, Range<usize>) -> T + Sync,
    L: Fn(&T) -> bool + Sync,
{
    let block = block.max(1);
    let blocks = items.div_ceil(block);
    let range = |b: usize| b * block..((b + 1) * block).min(items);
    let threads = std::thread::available_parallelism()
        .map_or(1, NonZeroUsize::get)
        .min(MAX_THREADS)
        .min(blocks);
    if threads <= 1 {
        let mut state: Option<S> = None;
        let mut out = Vec::with_capacity(blocks);
        for b in 0..blocks {
            let state = state.get_or_insert_with(&init);
            let result = work(state, range(b));
            let stop = last(&result);
            out.push(result);
            if stop {
                break;
            }
        }
        return out;
    }
    let next = AtomicUsize::new(0);
    // The first block whose result is the last one (`usize::MAX`: none yet).
    let stop_at = AtomicUsize::new(usize::MAX);
    let parts: Vec<Vec<(usize, T)>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    let mut state: Option<S> = None;
                    let mut done = Vec::new();
                    loop {
                        let b = next.fetch_add(1, Ordering::Relaxed);
                        if b >= blocks || b > stop_at.load(Ordering::Relaxed) {
                            break;
                        }
                        let state = state.get_or_insert_with(&init);
                        let result = work(state, range(b));
                        if last(&result) {
                            stop_at.fetch_min(b, Ordering::Relaxed);
                        }
                        done.push((b, result));
                    }
                    done
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    });
    let end = stop_at.into_inner().min(blocks - 1) + 1;
    let mut slots: Vec<Option<T>> = (0..end).map(|_| None).collect();
    for (b, result) in parts.into_iter().flatten() {
        if let Some(slot) = slots.get_mut(b) {
            *slot = Some(result);
        }
    }
    // Every block before the stop ran: a thread takes blocks in increasing order and stops
    // only past `stop_at`, so each of them was taken and finished.
    slots.into_iter().flatten().collect()
}
