//! Handing freed memory back to the system at the moments a library knows of.
//!
//! The binary chooses the allocator (the `gelo` binary: mimalloc, which keeps freed pages for
//! reuse and returns them only after a delay, while later frees happen); the library knows
//! when a burst of memory was just freed for good (a model's load). The binary registers
//! what "return it now" means for its allocator; the library calls it.

use std::sync::OnceLock;

static RELEASE: OnceLock<fn()> = OnceLock::new();

/// Sets what [`release_freed`] does, once per process (a later call is ignored).
pub fn set_release(f: fn()) {
    let _ = RELEASE.set(f);
}

/// Asks the allocator to return the memory freed so far to the system (nothing if the
/// binary registered nothing).
pub fn release_freed() {
    if let Some(f) = RELEASE.get() {
        f();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    static CALLS: AtomicUsize = AtomicUsize::new(0);

    #[test]
    fn the_registered_release_runs_on_each_call_and_only_the_first_registration_counts() {
        set_release(|| _ = CALLS.fetch_add(1, Ordering::SeqCst));
        set_release(|| panic!("a second registration must be ignored"));
        release_freed();
        release_freed();
        assert_eq!(CALLS.load(Ordering::SeqCst), 2);
    }
}
