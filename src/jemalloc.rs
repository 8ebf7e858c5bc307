//! The allocator, and its settings for a one-task controller.
//!
//! jemalloc's defaults suit allocation-heavy programs with many threads. lazyquota's work is one
//! task, allocating in bursts (a relist, a discovery run) between long quiet spells, so two of
//! them are changed at start, through `mallctl`. jemalloc's `malloc_conf` symbol would set them
//! at once, but exporting it needs `unsafe`, which the workspace denies (its one exception is
//! `src/pages.rs`'s `madvise`).
//!
//! - **One arena.** jemalloc gives each thread one of 4 × CPUs arenas, each keeping its own
//!   partly filled slabs, dirty pages and metadata; every thread here allocates from the first
//!   (the main thread, and each runtime thread as it starts). Measured at N = 400 CRDs with one
//!   arena through `narenas:1`: 7.7 MiB anonymous RSS against 8.5 MiB in the same run
//!   (`benches/results/jemalloc-arena/scale.md`). The threads' caches (tcache) still serve most
//!   allocations without the arena's lock. jemalloc picks an arena for a thread before it can
//!   be moved, so a runtime thread may still create one, which then stays empty (its metadata
//!   only).
//! - **A short decay.** Unused pages go back to the kernel after 1 s instead of 10 s, and at
//!   once rather than through a second, "muzzy" decay. Measured at N = 400 in three pairs of runs:
//!   7.5, 7.9 and 7.6 MiB anonymous RSS against 9.6, 9.1 and 8.8 MiB with the same live heap
//!   (`benches/results/jemalloc-decay/scale.md`).
//!
//! Neither is done when `_RJEM_MALLOC_CONF` is set, whatever it says: an operator who tunes
//! jemalloc gets jemalloc's defaults plus their own options, not ours.

use tikv_jemalloc_ctl::{Access as _, AsName as _};

#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Applies the settings unless `_RJEM_MALLOC_CONF` is set; call it first thing, before any
/// other thread starts. Returns the hook every runtime thread must run as it starts, if any.
pub fn tune() -> Option<fn()> {
    if std::env::var_os("_RJEM_MALLOC_CONF").is_some() {
        return None;
    }
    if let Err(error) = set_decay() {
        eprintln!("lazyquota: cannot set jemalloc's decay (running with its defaults): {error}");
    }
    use_first_arena();
    Some(use_first_arena)
}

/// Has the calling thread allocate from arena 0, which always exists.
fn use_first_arena() {
    // The write fails only if jemalloc lacks the option; the thread keeps its own arena then.
    let _ = "thread.arena\0".name().write(0_u32);
}

/// Sets the 1-second dirty and immediate muzzy decay for the arenas created from now on and
/// for those that exist.
fn set_decay() -> Result<(), tikv_jemalloc_ctl::Error> {
    let arenas = tikv_jemalloc_ctl::arenas::narenas::read()?;
    for (kind, ms) in [("dirty", 1000_isize), ("muzzy", 0)] {
        format!("arenas.{kind}_decay_ms\0").name().write(ms)?;
        for arena in 0..arenas {
            // Arenas not created yet answer EFAULT; they take the default above.
            let _ = format!("arena.{arena}.{kind}_decay_ms\0").name().write(ms);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `set_decay` names real options (a wrong name is an error, not a silent no-op) and sets
    /// them for the arenas that exist and those created later.
    #[test]
    fn every_arena_s_dirty_decay_is_one_second_and_muzzy_decay_zero() {
        set_decay().unwrap();
        for key in ["arenas.dirty_decay_ms\0", "arena.0.dirty_decay_ms\0"] {
            let ms: isize = key.name().read().unwrap();
            assert_eq!(ms, 1000, "{key}");
        }
        for key in ["arenas.muzzy_decay_ms\0", "arena.0.muzzy_decay_ms\0"] {
            let ms: isize = key.name().read().unwrap();
            assert_eq!(ms, 0, "{key}");
        }
        // A thread started now allocates from an arena with the same decay, made before or
        // after the call.
        let ms = std::thread::spawn(|| {
            let buffer = vec![1_u8; 1 << 20];
            let arena: u32 = "thread.arena\0".name().read().unwrap();
            drop(buffer);
            let ms: isize = format!("arena.{arena}.dirty_decay_ms\0").name().read().unwrap();
            ms
        })
        .join()
        .unwrap();
        assert_eq!(ms, 1000);
    }

    /// Every thread of a runtime built with the hook allocates from arena 0 (jemalloc would
    /// give each new thread an arena of its own).
    #[test]
    fn runtime_threads_share_the_first_arena() {
        let arena = || -> u32 {
            let buffer = vec![1_u8; 4096];
            let arena = "thread.arena\0".name().read().unwrap();
            drop(buffer);
            arena
        };
        let runtime = crate::runtime(Some(use_first_arena)).unwrap();
        let (worker, blocking) = runtime.block_on(async move {
            let worker = tokio::spawn(async move { arena() }).await.unwrap();
            let blocking = tokio::task::spawn_blocking(arena).await.unwrap();
            (worker, blocking)
        });
        assert_eq!((worker, blocking), (0, 0));
    }
}
