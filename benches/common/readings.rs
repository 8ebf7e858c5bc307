//! Reading a process's figures: Prometheus text, /proc/<pid>/status and its sockets.

/// The first sample of metric `name` in Prometheus text; NaN when absent.
pub fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find(|l| is_sample_of(l, name))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(f64::NAN)
}

/// The sum of metric `name`'s samples whose line contains `label` ("" for all of them).
pub fn metric_sum(text: &str, name: &str, label: &str) -> f64 {
    text.lines()
        .filter(|l| is_sample_of(l, name) && l.contains(label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn is_sample_of(line: &str, name: &str) -> bool {
    line.starts_with(name) && line[name.len()..].starts_with([' ', '{'])
}

/// A `kB` field of /proc/<pid>/status (`VmRSS:`, `RssAnon:`), in bytes; NaN when unreadable.
pub fn proc_status(pid: u32, field: &str) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))?
                .split_whitespace()
                .nth(1)?
                .parse::<f64>()
                .ok()
        })
        .map_or(f64::NAN, |kib| kib * 1024.0)
}

/// Established TCP connections from `pid` to `port`; NaN for a port that is not a number.
#[allow(clippy::cast_precision_loss)] // a count of sockets
pub fn connections(pid: u32, port: &str) -> f64 {
    port.parse().map_or(f64::NAN, |port| {
        lazyquota_testenv::established_connections(pid, port) as f64
    })
}
