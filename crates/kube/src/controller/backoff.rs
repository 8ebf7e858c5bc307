//! The retry backoff of an object watch (a logical cluster's own or a kcp shared one).
//!
//! kube's `default_backoff()` is client-go's reflector backoff: 800 ms doubling to 30 s, each
//! wait plus up to as much again of jitter. That suits a watch opened at start, but a watch
//! here opens when a quota appears and a user waits for its first status: a kcp shard answers
//! the first watch of a type whose watch cache is still starting with
//! `429 storage is (re)initializing`, and 800 ms is then most of what the user waits. So the
//! first retry comes after 100 ms (plus jitter); the waits double from there to the same 30 s
//! cap, so a server that keeps failing is asked no more often than kube's backoff asks it
//! after its first few retries. Like kube's, it starts again after two minutes without a
//! retry, and the watcher resets it on any event it delivers.

use std::time::Duration;

use kube::runtime::{
    utils::{Backoff, ResetTimerBackoff},
    watcher::ExponentialBackoff,
};

/// The first retry's wait, before jitter.
pub const FIRST: Duration = Duration::from_millis(100);
/// The longest wait, before jitter (kube's).
pub const MAX: Duration = Duration::from_secs(30);
/// Without a retry for this long, the next one waits [`FIRST`] again (kube's).
const RESET_AFTER: Duration = Duration::from_mins(2);

/// A new backoff for one object watch.
#[must_use]
pub fn object_watch() -> impl Backoff {
    let exponential = backon::ExponentialBuilder::default()
        .with_min_delay(FIRST)
        .with_max_delay(MAX)
        .with_factor(2.0)
        .without_max_times()
        .with_jitter();
    ResetTimerBackoff::new(ExponentialBackoff::from(exponential), RESET_AFTER)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The waits before jitter, and the most jitter adds (as much again).
    fn within(wait: Duration, before_jitter: Duration) -> bool {
        wait >= before_jitter && wait <= before_jitter * 2
    }

    #[test]
    fn the_first_retry_is_soon_and_the_waits_double_to_kubes_cap() {
        let mut backoff = object_watch();
        let mut expected = FIRST;
        for attempt in 1..=12 {
            let wait = backoff.next().expect("the backoff never gives up");
            assert!(
                within(wait, expected),
                "attempt {attempt}: {wait:?} is not {expected:?} plus jitter"
            );
            expected = (expected * 2).min(MAX);
        }
        assert_eq!(expected, MAX, "twelve retries reach the cap");
    }

    #[test]
    fn a_reset_starts_from_the_first_wait_again() {
        let mut backoff = object_watch();
        for _ in 0..6 {
            backoff.next();
        }
        assert!(backoff.next().unwrap() >= FIRST * 64);
        backoff.reset();
        assert!(within(backoff.next().unwrap(), FIRST));
    }
}
