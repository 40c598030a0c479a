//! Shield rows (TwinShield): `k` random high-energy rows stacked under each sequence's
//! activations before masking and stripped after recovery.
//!
//! Without them the engine sees `UᵀU = HᵀA ᵀAH = HᵀH`: the masked operand leaks the
//! activations' Gram matrix exactly. With them it sees `HᵀH + SᵀS`, and the fresh
//! Gaussian rows dominate the spectrum at energy 4× the mean row norm.

use std::sync::{Arc, Condvar, Mutex, OnceLock};

use rand::{Rng, RngExt, SeedableRng};
use rand_chacha::ChaCha12Rng;
use rand_distr::{Distribution, StandardNormal};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use zeroize::Zeroize;

/// How many shield rows, and how loud.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct ShieldConfig {
    /// Rows stacked under every sequence (HD₃ adds more to reach a power of two).
    pub rows: usize,
    /// Each row's norm, in units of the block's mean activation row norm.
    pub energy: f32,
}

impl Default for ShieldConfig {
    fn default() -> Self {
        ShieldConfig { rows: 8, energy: 4.0 }
    }
}

impl ShieldConfig {
    /// No shield rows (the C1 condition of the attack harness; leaks the Gram matrix).
    pub fn off() -> Self {
        ShieldConfig { rows: 0, energy: 0.0 }
    }
}

/// Fills `out` (`k×d`, row-major) with fresh shield rows for the activation block `h`
/// (`n×d`). With `energy == 0` the rows are zero padding.
///
/// Every piece of a row is drawn from its own ChaCha12 stream keyed from `rng`, so the draws
/// run in parallel: at decode a linear's input is one real row under `k` shield rows, and
/// drawing those `k·d` Gaussians on one core was a quarter of a masked Qwen3-1.7B decode step.
pub fn fill(out: &mut [f32], h: &[f32], d: usize, energy: f32, rng: &mut impl Rng) {
    fill_from(out, h, d, energy, rng, None);
}

/// [`fill`], taking as many standard normal values as `reservoir` has ready (drawn ahead of
/// use) and drawing the rest.
pub fn fill_from(out: &mut [f32], h: &[f32], d: usize, energy: f32, rng: &mut impl Rng, reservoir: Option<&Reservoir>) {
    if out.is_empty() {
        return;
    }
    if energy == 0.0 {
        out.iter_mut().for_each(|v| *v = 0.0);
        return;
    }
    let n = (h.len() / d).max(1);
    let mean_norm = h
        .chunks_exact(d)
        .map(|r| r.iter().map(|&v| (v as f64) * (v as f64)).sum::<f64>().sqrt())
        .sum::<f64>()
        / n as f64;
    let target = (energy as f64 * mean_norm).max(f64::MIN_POSITIVE);
    let ready = reservoir.map_or(0, |r| r.take(out));
    draw_normals(&mut out[ready..], rng);
    // Each row scaled to the target norm.
    for row in out.chunks_exact_mut(d) {
        let sq = row.iter().map(|&v| (v as f64) * (v as f64)).sum::<f64>();
        let f = (target / sq.sqrt().max(f64::MIN_POSITIVE)) as f32;
        row.iter_mut().for_each(|v| *v *= f);
    }
}

/// Standard normal values into `out`, in pieces of at most [`PIECE`] values, each from its
/// own ChaCha12 stream keyed from `rng`, so that even a few rows spread over the cores.
fn draw_normals(out: &mut [f32], rng: &mut impl Rng) {
    if out.is_empty() {
        return;
    }
    let mut seeds: Vec<[u8; 32]> = (0..out.len().div_ceil(PIECE)).map(|_| rng.random()).collect();
    let draw = |(piece, seed): (&mut [f32], &[u8; 32])| {
        let mut rng = ChaCha12Rng::from_seed(*seed);
        for v in piece.iter_mut() {
            *v = StandardNormal.sample(&mut rng);
        }
    };
    // Below a few thousand draws a fork costs more than it saves.
    if out.len() >= PARALLEL_DRAWS {
        out.par_chunks_mut(PIECE).zip(seeds.par_iter()).for_each(draw);
    } else {
        out.chunks_mut(PIECE).zip(seeds.iter()).for_each(draw);
    }
    seeds.zeroize();
}

/// Standard normal values drawn ahead of use by a background thread, so that a linear's
/// shield rows cost a copy instead of their draws: the thread draws while the pass waits on
/// the engine. Each value is handed out once and zeroed in the reservoir as it leaves;
/// whatever is left is zeroed when the reservoir is dropped. The thread starts on first use
/// and sleeps while [`Reservoir::capacity`] values are ready.
pub struct Reservoir {
    shared: Arc<Shared>,
    started: OnceLock<()>,
}

struct Shared {
    ready: Mutex<Ready>,
    wake: Condvar,
    capacity: usize,
}

#[derive(Default)]
struct Ready {
    chunks: Vec<Vec<f32>>,
    values: usize,
    closed: bool,
}

impl Ready {
    fn wipe(&mut self) {
        for c in &mut self.chunks {
            c.zeroize();
        }
        self.chunks.clear();
        self.values = 0;
    }
}

/// Values drawn per chunk of the reservoir's background thread.
const CHUNK: usize = 64 * 1024;

impl Reservoir {
    /// A reservoir holding up to `capacity` values (rounded up to whole chunks of 64 Ki).
    pub fn new(capacity: usize) -> Self {
        Reservoir {
            shared: Arc::new(Shared { ready: Mutex::new(Ready::default()), wake: Condvar::new(), capacity: capacity.max(1) }),
            started: OnceLock::new(),
        }
    }

    pub fn capacity(&self) -> usize {
        self.shared.capacity
    }

    /// Values ready now.
    pub fn ready(&self) -> usize {
        self.shared.ready.lock().expect("reservoir poisoned").values
    }

    /// Fills a prefix of `out` with ready values (as many as there are, never waiting) and
    /// returns its length.
    pub fn take(&self, out: &mut [f32]) -> usize {
        self.start();
        let mut ready = self.shared.ready.lock().expect("reservoir poisoned");
        let mut filled = 0;
        while filled < out.len() {
            let Some(chunk) = ready.chunks.last_mut() else { break };
            let n = chunk.len().min(out.len() - filled);
            let from = chunk.len() - n;
            out[filled..filled + n].copy_from_slice(&chunk[from..]);
            chunk[from..].zeroize();
            chunk.truncate(from);
            if chunk.is_empty() {
                ready.chunks.pop();
            }
            filled += n;
        }
        ready.values -= filled;
        drop(ready);
        if filled > 0 {
            self.shared.wake.notify_one();
        }
        filled
    }

    fn start(&self) {
        self.started.get_or_init(|| {
            let shared = self.shared.clone();
            let spawned = std::thread::Builder::new().name("gelo-shield".into()).spawn(move || produce(&shared));
            if let Err(e) = spawned {
                // Shield rows are then drawn inline, as without a reservoir.
                tracing::warn!(target: "gelo::protocol", error = %e, "shield reservoir thread not started");
            }
        });
    }
}

fn produce(shared: &Shared) {
    let mut rng = crate::os_seeded_rng();
    loop {
        {
            let mut ready = shared.ready.lock().expect("reservoir poisoned");
            while !ready.closed && ready.values >= shared.capacity {
                ready = shared.wake.wait(ready).expect("reservoir poisoned");
            }
            if ready.closed {
                return;
            }
        }
        let mut chunk = vec![0.0f32; CHUNK];
        let mut stream = ChaCha12Rng::from_seed(rng.random());
        for v in chunk.iter_mut() {
            *v = StandardNormal.sample(&mut stream);
        }
        let mut ready = shared.ready.lock().expect("reservoir poisoned");
        if ready.closed {
            chunk.zeroize();
            return;
        }
        ready.values += chunk.len();
        ready.chunks.push(chunk);
    }
}

impl Drop for Reservoir {
    fn drop(&mut self) {
        let mut ready = self.shared.ready.lock().expect("reservoir poisoned");
        ready.closed = true;
        ready.wipe();
        drop(ready);
        self.shared.wake.notify_all();
    }
}

/// Values per independently seeded piece of a shield row.
const PIECE: usize = 2048;
const PARALLEL_DRAWS: usize = 8 * 1024;

#[cfg(test)]
mod tests {
    use rand::SeedableRng;

    use super::*;

    /// Every row has norm `energy ×` the block's mean row norm, on both the sequential and
    /// the parallel path and for widths that split rows into uneven pieces; rows and pieces
    /// are independent draws.
    #[test]
    fn rows_have_the_target_energy_and_independent_pieces() {
        let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(3);
        for (k, d) in [(2usize, 100usize), (8, 5000), (8, 2 * PIECE)] {
            let h: Vec<f32> = (0..3 * d).map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0).collect();
            let mean = h.chunks(d).map(|r| r.iter().map(|v| (v * v) as f64).sum::<f64>().sqrt()).sum::<f64>() / 3.0;
            let mut out = vec![0.0f32; k * d];
            fill(&mut out, &h, d, 4.0, &mut rng);
            for row in out.chunks(d) {
                let norm = row.iter().map(|v| (v * v) as f64).sum::<f64>().sqrt();
                assert!((norm / (4.0 * mean) - 1.0).abs() < 1e-5, "k {k}, d {d}: row norm {norm} vs {}", 4.0 * mean);
            }
            assert_ne!(out[..d], out[d..2 * d]);
            if d >= 2 * PIECE {
                assert_ne!(out[..PIECE], out[PIECE..2 * PIECE], "pieces of a row must not repeat a stream");
            }
        }
        let mut zero = vec![1.0f32; 16];
        fill(&mut zero, &[1.0; 8], 8, 0.0, &mut rng);
        assert!(zero.iter().all(|&v| v == 0.0));
    }

    /// The reservoir hands out standard normal values, each once, never waits when empty,
    /// refills in the background, and shield rows drawn through it keep their energy.
    #[test]
    fn the_reservoir_hands_out_fresh_standard_normals_once() {
        let r = Reservoir::new(4 * CHUNK);
        let mut none = vec![0.0f32; 10];
        // The first take starts the thread: it may find nothing ready, and must not wait.
        let first = r.take(&mut none);
        assert!(first <= none.len());
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while r.ready() < r.capacity() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(r.ready() >= r.capacity(), "refilled to capacity: {}", r.ready());
        let mut a = vec![0.0f32; 3 * CHUNK + 17];
        assert_eq!(r.take(&mut a), a.len());
        let mean = a.iter().map(|&v| v as f64).sum::<f64>() / a.len() as f64;
        let var = a.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / a.len() as f64;
        assert!(mean.abs() < 0.02 && (var - 1.0).abs() < 0.02, "mean {mean}, variance {var}");
        // Handed out once: a second take gives different values.
        let mut b = vec![0.0f32; CHUNK];
        let got = r.take(&mut b);
        assert!(got > 0);
        // (Single f32 values recur by chance; a run of eight does not.)
        let window = &b[..got.min(8)];
        assert!(!a.windows(window.len()).any(|w| w == window), "a run of values handed out twice");
        // Shield rows through the reservoir keep the target energy.
        let d = 300;
        let h: Vec<f32> = (0..2 * d).map(|i| (i % 7) as f32 - 3.0).collect();
        let mean_norm = h.chunks(d).map(|r| r.iter().map(|v| (v * v) as f64).sum::<f64>().sqrt()).sum::<f64>() / 2.0;
        let mut out = vec![0.0f32; 8 * d];
        fill_from(&mut out, &h, d, 4.0, &mut rand_chacha::ChaCha20Rng::seed_from_u64(5), Some(&r));
        for row in out.chunks(d) {
            let norm = row.iter().map(|v| (v * v) as f64).sum::<f64>().sqrt();
            assert!((norm / (4.0 * mean_norm) - 1.0).abs() < 1e-5);
        }
    }
}
