//! The statistics the benchmarks report: medians, spreads, least-squares slopes and
//! percentiles, each defined once.

// Counts and indices become f64 and back for reporting; none comes near 2^52.
#![allow(
    clippy::cast_precision_loss,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss
)]

use std::time::Duration;

/// The median of `values` (the upper one of an even count); NaN when there are none.
pub fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Largest minus smallest of `values`.
pub fn spread(values: impl Iterator<Item = f64> + Clone) -> f64 {
    let max = values.clone().fold(f64::MIN, f64::max);
    let min = values.fold(f64::MAX, f64::min);
    max - min
}

/// The least-squares slope of y over x, over the points whose y is finite; NaN when fewer than
/// two such points or all at one x (no slope can be read, and a report must not print 0).
pub fn slope(points: impl IntoIterator<Item = (f64, f64)>) -> f64 {
    let points: Vec<(f64, f64)> = points.into_iter().filter(|(_, y)| y.is_finite()).collect();
    if points.len() < 2 {
        return f64::NAN;
    }
    let n = points.len() as f64;
    let (sx, sy) = points.iter().fold((0.0, 0.0), |(a, b), (x, y)| (a + x, b + y));
    let (mx, my) = (sx / n, sy / n);
    let (sxy, sxx) = points.iter().fold((0.0, 0.0), |(a, b), (x, y)| {
        (a + (x - mx) * (y - my), b + (x - mx) * (x - mx))
    });
    if sxx == 0.0 { f64::NAN } else { sxy / sxx }
}

/// The p-th percentile (nearest rank, rounded) of `samples`; `None` when there are none.
pub fn percentile(samples: &[Duration], p: f64) -> Option<Duration> {
    if samples.is_empty() {
        return None;
    }
    let mut s = samples.to_vec();
    s.sort_unstable();
    let index = ((p / 100.0) * (s.len() - 1) as f64).round() as usize;
    Some(s[index])
}

/// Milliseconds, rounded, or "–" for none.
pub fn ms(d: Option<Duration>) -> String {
    d.map_or_else(|| "–".into(), |d| format!("{:.0}", d.as_secs_f64() * 1000.0))
}
