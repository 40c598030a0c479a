//! One persistent pool of compute threads for the TEE's products.
//!
//! A decode step is hundreds of small parallel regions (every linear of every layer), each a
//! few microseconds of work per thread. rayon parks an idle worker and a fork wakes it
//! through the kernel, which on a VM's vCPUs costs tens of microseconds: as much as the
//! region itself. This pool's workers spin on a shared generation counter for a while after
//! each region ([`SPIN`]) and only then sleep, so back-to-back regions of one forward pass
//! are dispatched by a store and picked up within a cache-line transfer, as ggml's thread
//! pool does. Work is split into tasks that threads claim from one atomic counter, so a
//! slow or preempted thread holds back at most one task.
//!
//! The caller runs tasks too. One region runs at a time; a caller that finds the pool busy
//! (another thread's region, or a task that itself asks for a region) runs its tasks inline,
//! so nesting and concurrent callers cannot deadlock.

use std::{
    cell::{Cell, UnsafeCell},
    sync::{
        Arc, Condvar, Mutex, OnceLock,
        atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

/// How long an idle worker keeps polling for the next region before it sleeps: longer than
/// the gaps between the regions of one forward pass (attention and norms on the calling
/// thread), far shorter than the gap between two requests.
const SPIN: Duration = Duration::from_micros(400);

/// The work of one region: `f(task)` for every `task < tasks`.
#[derive(Clone, Copy)]
struct Job {
    f: *const (dyn Fn(usize) + Sync),
    tasks: usize,
}

struct Shared {
    /// Bumped once per region; workers compare it with the last one they served.
    generation: AtomicU64,
    /// The current region's job. Written by the region's caller before it bumps
    /// `generation`, read by a worker only after it has joined a region not yet closed
    /// (see `join`), so never read while written. No lock: a lock taken by every worker at
    /// every region is a convoy on many cores (15 workers contending for it each time).
    job: UnsafeCell<Option<Job>>,
    /// The last generation whose tasks were all claimed: a worker that joins it later must
    /// not touch its job (the caller no longer waits for it).
    closed: AtomicU64,
    /// Next task index to claim.
    next: AtomicUsize,
    /// Workers inside the current region (joined and not yet left).
    active: AtomicUsize,
    /// Workers asleep on `wake`.
    sleepers: AtomicUsize,
    sleep_lock: Mutex<()>,
    wake: Condvar,
    shutdown: AtomicBool,
}

// SAFETY: `job` is written only by the one caller that holds `Pool::busy`, while no worker
// is inside a region (`active == 0` after `closed` was raised), and read only by workers
// inside an open region; its closure is `Sync` and outlives the region (`Pool::run`).
unsafe impl Send for Shared {}
unsafe impl Sync for Shared {}

/// A fixed set of compute threads; see the module documentation.
pub struct Pool {
    shared: Arc<Shared>,
    threads: usize,
    /// Held by the caller of the region in flight.
    busy: Mutex<()>,
}

thread_local! {
    /// Whether this thread is a pool worker (its tasks must not open regions of their own).
    static IN_POOL: Cell<bool> = const { Cell::new(false) };
}

impl Pool {
    /// A pool of `threads` threads in all, the caller included (`threads − 1` workers).
    pub fn new(threads: usize) -> Self {
        let threads = threads.max(1);
        let shared = Arc::new(Shared {
            generation: AtomicU64::new(0),
            job: UnsafeCell::new(None),
            closed: AtomicU64::new(0),
            next: AtomicUsize::new(0),
            active: AtomicUsize::new(0),
            sleepers: AtomicUsize::new(0),
            sleep_lock: Mutex::new(()),
            wake: Condvar::new(),
            shutdown: AtomicBool::new(false),
        });
        for i in 1..threads {
            let shared = shared.clone();
            thread::Builder::new()
                .name(format!("gelo-compute-{i}"))
                .spawn(move || worker(&shared))
                .expect("spawning a compute thread");
        }
        Pool { shared, threads, busy: Mutex::new(()) }
    }

    /// Threads a region runs on, the caller included.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Runs `f(task)` for every `task < tasks`, on the pool's threads and the caller's, and
    /// returns when all have finished. Tasks may run in any order and concurrently.
    pub fn run(&self, tasks: usize, f: &(dyn Fn(usize) + Sync)) {
        if tasks == 0 {
            return;
        }
        let guard = if tasks == 1 || self.threads == 1 || IN_POOL.get() { None } else { self.busy.try_lock().ok() };
        let Some(_guard) = guard else {
            (0..tasks).for_each(f);
            return;
        };
        let s = &*self.shared;
        // SAFETY (lifetime erasure): before this function returns the job is closed (no
        // worker joins it after) and every worker that joined has left (`active == 0`), so
        // `f` outlives its uses.
        let f: *const (dyn Fn(usize) + Sync) = unsafe { std::mem::transmute(f) };
        let job = Job { f, tasks };
        let generation = s.generation.load(Ordering::Relaxed) + 1;
        // SAFETY: this caller holds `busy`, and the last region ended with no worker inside
        // it (`active == 0` after `closed`): no one reads `job` now (see `Shared`).
        unsafe { *s.job.get() = Some(job) };
        s.next.store(0, Ordering::Relaxed);
        // SeqCst here and on the sleeper's side: the bump and a worker's decision to sleep
        // are a store-then-load on each side, which only total order keeps from both
        // reading stale values (the worker asleep, the caller not waking it).
        s.generation.store(generation, Ordering::SeqCst);
        if s.sleepers.load(Ordering::SeqCst) > 0 {
            let _g = s.sleep_lock.lock().expect("pool sleep lock");
            s.wake.notify_all();
        }
        claim_tasks(s, job);
        // Every task is claimed. Workers that have not joined yet (descheduled, on a
        // machine with more runnable threads than cores) are not waited for: closing the
        // region turns them away. SeqCst pairs with `join`: either a worker's join comes
        // first in the total order and this loop sees it, or the worker sees `closed`.
        s.closed.store(generation, Ordering::SeqCst);
        let mut spins = 0u32;
        while s.active.load(Ordering::SeqCst) > 0 {
            spins = spins.wrapping_add(1);
            // A joined worker that was preempted mid-task may be waiting for this core.
            if spins.is_multiple_of(256) {
                thread::yield_now();
            }
            std::hint::spin_loop();
        }
    }

    /// Splits `0..n` into about `pieces_per_thread` pieces a thread, each at least `min`
    /// long, and runs `f(range)` for each on the pool.
    pub fn for_ranges(&self, n: usize, min: usize, f: &(dyn Fn(std::ops::Range<usize>) + Sync)) {
        let step = n.div_ceil(split(n, min.max(1), self.threads * 4));
        // Recounted from the step: 256 rows in 42 pieces are 37 steps of 7, and a 38th
        // piece would start past the end.
        let pieces = n.div_ceil(step.max(1));
        self.run(pieces, &|t| f(t * step..((t + 1) * step).min(n)));
    }
}

impl Pool {
    /// `f(i)` for every `i < n`, on the pool, collected in order.
    pub fn map<T: Send + Sync>(&self, n: usize, f: &(dyn Fn(usize) -> T + Sync)) -> Vec<T> {
        let outs: Vec<OnceLock<T>> = (0..n).map(|_| OnceLock::new()).collect();
        self.run(n, &|i| {
            let _ = outs[i].set(f(i));
        });
        outs.into_iter().map(|o| o.into_inner().expect("every task runs once")).collect()
    }

    /// Runs `f(first, chunk)` over `data` cut into chunks of whole `unit`s (rows of a
    /// matrix), each at least `min_units` long (`first` the chunk's first unit): a parallel
    /// pass over a buffer. Below two chunks' worth it runs on the caller alone.
    pub fn for_chunks_mut<T: Send>(
        &self,
        data: &mut [T],
        unit: usize,
        min_units: usize,
        f: &(dyn Fn(usize, &mut [T]) + Sync),
    ) {
        let units = data.len() / unit.max(1);
        let pieces = split(units, min_units.max(1), self.threads * 4);
        if pieces <= 1 {
            f(0, data);
            return;
        }
        let step = units.div_ceil(pieces);
        let pieces = units.div_ceil(step);
        let (ptr, len) = (SyncPtr(data.as_mut_ptr()), data.len());
        self.run(pieces, &|t| {
            let (u0, u1) = (t * step, ((t + 1) * step).min(units));
            let (lo, hi) = (u0 * unit, if t + 1 == pieces { len } else { u1 * unit });
            // SAFETY: the pieces' ranges `lo..hi` are disjoint and inside `data`, which
            // the caller lends exclusively for the call.
            let chunk = unsafe { std::slice::from_raw_parts_mut(ptr.get().add(lo), hi - lo) };
            f(u0, chunk);
        });
    }
}

/// Whether work of `flops` is worth a region on the pool: a region whose workers are
/// polling costs about a microsecond, so far less work pays than for a fork that wakes
/// sleeping threads.
pub fn worth(flops: usize) -> bool {
    flops >= 1 << 16 && global().threads() > 1
}

/// How many pieces to cut `n` items into: at most `max_pieces`, each at least `min` long.
fn split(n: usize, min: usize, max_pieces: usize) -> usize {
    (n / min).clamp(1, max_pieces.max(1)).min(n.max(1))
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::Release);
        self.shared.generation.fetch_add(1, Ordering::Release);
        let _g = self.shared.sleep_lock.lock().expect("pool sleep lock");
        self.shared.wake.notify_all();
    }
}

fn claim_tasks(s: &Shared, job: Job) {
    loop {
        let t = s.next.fetch_add(1, Ordering::Relaxed);
        if t >= job.tasks {
            return;
        }
        // SAFETY: see `Job`: the closure lives until the region's caller returns.
        unsafe { (*job.f)(t) };
    }
}

fn worker(s: &Shared) {
    IN_POOL.set(true);
    // The generation the pool was made with, not the one this thread first reads: a region
    // may open before a new thread runs, and it must still serve it.
    let mut seen = 0;
    loop {
        // 1. Wait for a new region: spin, then sleep.
        let start = Instant::now();
        let mut spins = 0u32;
        loop {
            let g = s.generation.load(Ordering::Acquire);
            if g != seen {
                seen = g;
                break;
            }
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(64) {
                // Polling must not hold a core another runnable thread wants (tests and
                // services share a small machine): sched_yield returns at once when no
                // other thread is waiting for this core.
                thread::yield_now();
            }
            if spins.is_multiple_of(64) && start.elapsed() > SPIN {
                let mut lock = s.sleep_lock.lock().expect("pool sleep lock");
                s.sleepers.fetch_add(1, Ordering::SeqCst);
                while s.generation.load(Ordering::SeqCst) == seen {
                    lock = s.wake.wait(lock).expect("pool sleep lock");
                }
                s.sleepers.fetch_sub(1, Ordering::AcqRel);
                drop(lock);
                seen = s.generation.load(Ordering::Acquire);
                break;
            }
            std::hint::spin_loop();
        }
        if s.shutdown.load(Ordering::Acquire) {
            return;
        }
        // 2. Serve it, unless its caller already finished it.
        if join(s, seen) {
            // SAFETY: joined to an open region: its caller wrote `job` before the
            // generation this thread read, and waits for this thread before writing again.
            if let Some(job) = unsafe { *s.job.get() } {
                claim_tasks(s, job);
            }
            s.active.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// Enters the region of `generation` if it is still open; a `true` return must be paired
/// with a decrement of `active` when the worker leaves.
fn join(s: &Shared, generation: u64) -> bool {
    s.active.fetch_add(1, Ordering::SeqCst);
    if s.closed.load(Ordering::SeqCst) >= generation {
        s.active.fetch_sub(1, Ordering::SeqCst);
        return false;
    }
    true
}

/// The process's pool, sized like rayon's global pool (`RAYON_NUM_THREADS`, else the
/// available cores), so one setting governs every parallel region.
pub fn global() -> &'static Pool {
    static POOL: OnceLock<Pool> = OnceLock::new();
    POOL.get_or_init(|| Pool::new(rayon::current_num_threads()))
}

/// A raw pointer that parallel tasks may share when each writes a disjoint part.
pub struct SyncPtr<T>(pub *mut T);

impl<T> Clone for SyncPtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for SyncPtr<T> {}

// SAFETY: users write disjoint elements only (stated at each use).
unsafe impl<T> Send for SyncPtr<T> {}
unsafe impl<T> Sync for SyncPtr<T> {}

impl<T> SyncPtr<T> {
    /// The pointer (a method, so closures capture the `Sync` wrapper, not the field).
    pub fn get(self) -> *mut T {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_task_runs_once() {
        let pool = Pool::new(3);
        for tasks in [0, 1, 2, 7, 100] {
            let hits: Vec<AtomicUsize> = (0..tasks).map(|_| AtomicUsize::new(0)).collect();
            pool.run(tasks, &|t| {
                hits[t].fetch_add(1, Ordering::Relaxed);
            });
            assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1), "{tasks} tasks");
        }
    }

    #[test]
    fn nested_and_concurrent_regions_run_inline() {
        let pool = Arc::new(Pool::new(2));
        let total = Arc::new(AtomicUsize::new(0));
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let (pool, total) = (pool.clone(), total.clone());
                thread::spawn(move || {
                    for _ in 0..50 {
                        pool.run(4, &|_| {
                            pool.run(3, &|_| {
                                total.fetch_add(1, Ordering::Relaxed);
                            })
                        });
                    }
                })
            })
            .collect();
        handles.into_iter().for_each(|h| h.join().unwrap());
        assert_eq!(total.load(Ordering::Relaxed), 4 * 50 * 4 * 3);
    }

    #[test]
    fn map_collects_in_task_order() {
        let pool = Pool::new(3);
        for n in [0, 1, 5, 64] {
            assert_eq!(pool.map(n, &|i| i * i), (0..n).map(|i| i * i).collect::<Vec<_>>(), "{n} tasks");
        }
    }

    #[test]
    fn workers_wake_after_sleeping() {
        let pool = Pool::new(2);
        thread::sleep(SPIN * 3);
        let n = AtomicUsize::new(0);
        pool.run(64, &|_| {
            n.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(n.load(Ordering::Relaxed), 64);
    }

    #[test]
    fn chunks_cover_exactly_in_whole_units() {
        let pool = Pool::new(2);
        for (n, unit, min) in [(0, 3, 1), (9, 3, 1), (3000, 7, 10), (20, 4, 100)] {
            let mut data = vec![0u32; n];
            pool.for_chunks_mut(&mut data, unit, min, &|first, chunk| {
                let last = first * unit + chunk.len() == n;
                assert!(last || chunk.len().is_multiple_of(unit), "only the last chunk holds a partial unit");
                chunk.iter_mut().enumerate().for_each(|(i, v)| *v += (first * unit + i) as u32 + 1);
            });
            assert!(data.iter().enumerate().all(|(i, &v)| v == i as u32 + 1), "n={n} unit={unit}");
        }
    }

    #[test]
    fn ranges_cover_exactly() {
        // Sixteen threads too: the pieces' rounding once left ranges past the end there
        // (256 rows of 6144 values, quantized in pieces of at least 6 rows).
        for threads in [2, 16] {
            let pool = Pool::new(threads);
            for (n, min) in [(0, 1), (1, 1), (10, 3), (1000, 7), (5, 100), (256, 6), (100, 6), (9, 1), (63, 2)] {
                let seen: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
                pool.for_ranges(n, min, &|r| {
                    assert!(r.start < r.end && r.end <= n, "n={n} min={min}: range {r:?}");
                    r.for_each(|i| _ = seen[i].fetch_add(1, Ordering::Relaxed))
                });
                assert!(seen.iter().all(|s| s.load(Ordering::Relaxed) == 1), "n={n} min={min}");
            }
        }
    }
}
