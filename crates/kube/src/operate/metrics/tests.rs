//! Tests of the Prometheus metrics: names, units and labels.

use super::*;

#[test]
fn every_metric_is_prefixed_and_counters_end_in_total() {
    let metrics = Metrics::new();
    metrics.watch_events("pods").inc();
    metrics.quota_sync("written", 0.01);
    metrics.status_write("ok");
    let text = metrics.encode();
    for line in text.lines().filter(|l| l.starts_with("# TYPE")) {
        let mut parts = line.split_whitespace().skip(2);
        let (name, kind) = (parts.next().unwrap(), parts.next().unwrap());
        assert!(name.starts_with("lazyquota_"), "{name}");
        assert_eq!(kind == "counter", name.ends_with("_total"), "{name} is a {kind}");
    }
    assert!(text.contains("lazyquota_watch_events_total{resource=\"pods\"} 1"));
}

#[test]
fn per_quota_gauges_report_used_hard_and_ratio_up_to_the_cap() {
    use crate::controller::snapshot::QuotaKeyUsage;
    let sample = |quota: &str, resource: &str, used: Option<f64>, hard: f64| QuotaKeyUsage {
        cluster: "c".into(),
        namespace: "team".into(),
        quota: quota.into(),
        resource: resource.into(),
        used,
        hard,
    };
    let snapshot = Snapshot {
        quota_usage: vec![
            sample("q", "requests.cpu", Some(1.5), 2.0),
            sample("q", "pods", Some(3.0), 0.0),
            sample("r", "count/configmaps", None, 10.0),
        ],
        ..Snapshot::default()
    };
    let metrics = Metrics::new();
    metrics.observe(&snapshot);
    let text = metrics.encode();
    let series = |name: &str, quota: &str, resource: &str| {
        let head =
            format!("{name}{{cluster=\"c\",namespace=\"team\",quota=\"{quota}\",resource=\"{resource}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(head.as_str()).map(str::to_owned))
    };
    assert_eq!(
        series("lazyquota_quota_used", "q", "requests.cpu").as_deref(),
        Some("1.5")
    );
    assert_eq!(
        series("lazyquota_quota_hard", "q", "requests.cpu").as_deref(),
        Some("2")
    );
    assert_eq!(
        series("lazyquota_quota_usage_ratio", "q", "requests.cpu").as_deref(),
        Some("0.75")
    );
    assert_eq!(
        series("lazyquota_quota_usage_ratio", "q", "pods"),
        None,
        "no ratio of a zero hard"
    );
    assert_eq!(
        series("lazyquota_quota_used", "r", "count/configmaps"),
        None,
        "not written yet"
    );
    assert_eq!(
        series("lazyquota_quota_hard", "r", "count/configmaps").as_deref(),
        Some("10")
    );
    assert!(text.contains("lazyquota_quota_usage_series_dropped 0"));

    metrics.set_quota_series_cap(1);
    metrics.observe(&snapshot);
    let text = metrics.encode();
    assert_eq!(
        text.lines()
            .filter(|l| l.starts_with("lazyquota_quota_hard{"))
            .count(),
        1
    );
    assert!(text.contains("lazyquota_quota_usage_series_dropped 2"));
}
