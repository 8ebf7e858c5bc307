//! Tests of the discovery schedule: when each served cluster's discovery runs.

use std::collections::BTreeSet;

use proptest::prelude::*;

use super::*;

fn c(name: &str) -> ClusterName {
    ClusterName::new(name)
}

const POLL: Duration = Duration::from_mins(5);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[test]
fn a_cluster_is_discovered_when_added_and_then_every_poll_period() {
    let t0 = Instant::now();
    let mut d = Discoveries::new(POLL, 4);
    d.add(c("a"), t0);
    assert_eq!(d.next_due(), Some(t0));
    assert_eq!(d.start_due(t0), vec![c("a")]);
    assert_eq!(
        d.start_due(t0),
        Vec::<ClusterName>::new(),
        "running: not started twice"
    );
    d.finished(&c("a"), true, t0 + ms(50));
    assert_eq!(d.next_due(), Some(t0 + POLL), "next: one poll after the start");
    assert!(d.start_due(t0 + POLL.saturating_sub(ms(1))).is_empty());
    assert_eq!(d.start_due(t0 + POLL), vec![c("a")]);
}

#[test]
fn an_api_change_asks_for_four_runs_over_eight_seconds() {
    let t0 = Instant::now();
    let mut d = Discoveries::new(POLL, 4);
    d.add(c("a"), t0);
    d.start_due(t0);
    d.finished(&c("a"), true, t0);
    let t1 = t0 + Duration::from_secs(10);
    d.api_changed(&c("a"), t1);
    let mut runs = Vec::new();
    for step in 0..100 {
        let now = t1 + ms(step * 100);
        if !d.start_due(now).is_empty() {
            runs.push(now - t1);
            d.finished(&c("a"), true, now);
        }
    }
    assert_eq!(runs, vec![ms(300), ms(1_000), ms(3_000), ms(8_000)]);
    d.api_changed(&c("unknown"), t1);
    assert!(
        !d.contains(&c("unknown")),
        "a change of a cluster not served is ignored"
    );
}

#[test]
fn a_failing_first_discovery_is_retried_doubling_and_a_known_cluster_waits_for_its_poll() {
    let t0 = Instant::now();
    let mut d = Discoveries::new(Duration::from_secs(10), 4);
    d.add(c("a"), t0);
    let mut now = t0;
    let mut waits = Vec::new();
    for _ in 0..6 {
        assert_eq!(d.start_due(now), vec![c("a")]);
        d.finished(&c("a"), false, now);
        let next = d.next_due().expect("a retry");
        waits.push(next - now);
        now = next;
    }
    assert_eq!(
        waits,
        [1, 2, 4, 8, 10, 10].map(Duration::from_secs),
        "capped at the poll"
    );
    d.start_due(now);
    d.finished(&c("a"), true, now);
    d.start_due(now + Duration::from_secs(10));
    d.finished(&c("a"), false, now + Duration::from_secs(10));
    assert_eq!(
        d.next_due(),
        Some(now + Duration::from_secs(20)),
        "once known, a failure waits for the next poll (what was known is kept)"
    );
}

#[test]
fn at_most_max_running_at_once_earliest_first() {
    let t0 = Instant::now();
    let mut d = Discoveries::new(POLL, 2);
    for (i, name) in ["a", "b", "c"].iter().enumerate() {
        d.add(c(name), t0 + ms(i as u64));
    }
    assert_eq!(d.start_due(t0 + ms(10)), vec![c("a"), c("b")]);
    assert_eq!(d.next_due(), None, "no slot free: no timer");
    d.finished(&c("b"), true, t0 + ms(20));
    assert_eq!(d.next_due(), Some(t0 + ms(2)));
    assert_eq!(d.start_due(t0 + ms(20)), vec![c("c")]);
    d.remove(&c("a"));
    d.finished(&c("a"), true, t0 + ms(30));
    d.add(c("d"), t0 + ms(30));
    assert_eq!(
        d.start_due(t0 + ms(30)),
        vec![c("d")],
        "a removed run frees its slot"
    );
}

#[test]
fn a_relist_of_the_api_watches_runs_every_cluster_once_more() {
    let t0 = Instant::now();
    let mut d = Discoveries::new(POLL, 8);
    for name in ["a", "b"] {
        d.add(c(name), t0);
    }
    d.start_due(t0);
    d.finished(&c("a"), true, t0);
    d.all_changed(t0 + ms(100));
    assert_eq!(d.start_due(t0 + ms(400)), vec![c("a")], "b is still running");
    d.finished(&c("b"), true, t0 + ms(500));
    assert_eq!(
        d.start_due(t0 + ms(500)),
        vec![c("b")],
        "b's run asked for while it ran"
    );
}

#[derive(Clone, Debug)]
enum Op {
    Add(u8),
    Remove(u8),
    Changed(u8),
    AllChanged,
    Finish(u8, bool),
    Tick(u16),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0..6_u8).prop_map(Op::Add),
        (0..6_u8).prop_map(Op::Remove),
        (0..6_u8).prop_map(Op::Changed),
        Just(Op::AllChanged),
        (0..6_u8, any::<bool>()).prop_map(|(c, ok)| Op::Finish(c, ok)),
        (0..20_000_u16).prop_map(Op::Tick),
    ]
}

proptest! {
    /// Whatever happens: never more than `max` run at once, never a cluster not scheduled,
    /// never one twice; and every scheduled cluster is due within one poll period of any
    /// moment (nothing is forgotten), an API change within 300 ms once a slot is free.
    #[test]
    fn runs_are_bounded_and_no_cluster_is_forgotten(ops in proptest::collection::vec(op(), 1..200), max in 1..4_usize) {
        let t0 = Instant::now();
        let mut now = t0;
        let mut d = Discoveries::new(Duration::from_secs(30), max);
        let mut running: BTreeSet<ClusterName> = BTreeSet::new();
        for op in ops {
            match op {
                Op::Add(i) => d.add(c(&i.to_string()), now),
                Op::Remove(i) => {
                    d.remove(&c(&i.to_string()));
                    running.remove(&c(&i.to_string()));
                }
                Op::Changed(i) => d.api_changed(&c(&i.to_string()), now),
                Op::AllChanged => d.all_changed(now),
                Op::Finish(i, ok) => {
                    if running.remove(&c(&i.to_string())) {
                        d.finished(&c(&i.to_string()), ok, now);
                    }
                }
                Op::Tick(n) => now += ms(u64::from(n)),
            }
            for started in d.start_due(now) {
                prop_assert!(d.contains(&started));
                prop_assert!(running.insert(started), "started twice");
            }
            prop_assert!(running.len() <= max);
            if running.len() < max {
                let due = d.due.iter().map(|(at, _)| *at);
                for at in due {
                    prop_assert!(at > now, "a due discovery was not started");
                    prop_assert!(at <= now + Duration::from_secs(30), "due more than a poll away");
                }
            }
            let idle = d.clusters.iter().filter(|(_, s)| !s.running).count();
            prop_assert_eq!(idle, d.due.len(), "every idle cluster is in the due index, once");
        }
    }
}

#[test]
fn a_narrowed_first_discovery_asks_for_the_full_one_and_retries_it_soon_when_it_fails() {
    let t0 = Instant::now();
    let mut d = Discoveries::new(POLL, 4);
    d.add(c("a"), t0);
    assert_eq!(d.start_due(t0), [c("a")]);
    d.finished(&c("a"), true, t0 + ms(10));
    d.incomplete(&c("a"), t0 + ms(1_010));
    assert!(d.start_due(t0 + ms(1_000)).is_empty());
    assert_eq!(d.start_due(t0 + ms(1_010)), [c("a")], "the full discovery");
    d.finished(&c("a"), false, t0 + ms(1_020));
    assert_eq!(
        d.next_due(),
        Some(t0 + ms(2_020)),
        "a failed full discovery is retried after 1 s, not at the next poll"
    );
    assert_eq!(d.start_due(t0 + ms(2_020)), [c("a")]);
    d.finished(&c("a"), true, t0 + ms(2_030));
    assert_eq!(
        d.next_due(),
        Some(t0 + ms(2_020) + POLL),
        "complete: the poll's schedule again"
    );
}
