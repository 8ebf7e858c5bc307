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

/// CPU time (user + system) a process has used so far, in seconds, from /proc/<pid>/stat;
/// NaN when unreadable.
pub fn cpu_seconds(pid: u32) -> f64 {
    static TICKS: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    // Clock ticks a second (`getconf CLK_TCK`; 100 on Linux nearly always).
    let ticks = *TICKS.get_or_init(|| {
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
            .unwrap_or(100.0)
    });
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return f64::NAN;
    };
    // The command name (field 2) is in parentheses and may hold spaces: count after it.
    let Some((_, rest)) = stat.rsplit_once(") ") else {
        return f64::NAN;
    };
    // utime and stime are fields 14 and 15, the 12th and 13th after the name.
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok());
    match (field(11), field(12)) {
        (Some(user), Some(system)) => (user + system) / ticks,
        _ => f64::NAN,
    }
}

/// Bytes `pid` has received on its open TCP connections to `port` (`ss -ti`'s
/// `bytes_received`, summed): what the apiserver sent it, for connections still open.
pub fn bytes_received(pid: u32, port: &str) -> f64 {
    let Ok(out) = std::process::Command::new("ss")
        .args(["-tinpH", "state", "established"])
        .output()
    else {
        return f64::NAN;
    };
    let (needle, peer_port) = (format!("pid={pid},"), format!(":{port}"));
    let text = String::from_utf8_lossy(&out.stdout);
    let mut total = 0.0;
    let mut mine = false;
    for line in text.lines() {
        if line.starts_with(char::is_whitespace) {
            // The previous socket's details.
            if mine {
                total += line
                    .split_whitespace()
                    .find_map(|f| f.strip_prefix("bytes_received:"))
                    .and_then(|b| b.parse::<f64>().ok())
                    .unwrap_or(0.0);
            }
        } else {
            mine = line.contains(&needle)
                && line
                    .split_whitespace()
                    .nth(3)
                    .is_some_and(|peer| peer.ends_with(&peer_port));
        }
    }
    total
}
