//! Wall-clock instants passed in by the caller: the crate never reads a clock itself.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time as K8sTime;

/// An instant as unix seconds plus nanoseconds, ordered chronologically.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Time {
    seconds: i64,
    nanos: u32,
}

impl Time {
    /// The start of a unix second.
    pub const fn from_unix_seconds(seconds: i64) -> Self {
        Self { seconds, nanos: 0 }
    }

    /// An instant with nanosecond precision; values beyond the `i64` seconds range saturate.
    pub fn from_unix_nanos(nanos: i128) -> Self {
        let seconds = nanos.div_euclid(1_000_000_000);
        let sub = nanos.rem_euclid(1_000_000_000);
        match i64::try_from(seconds) {
            Ok(seconds) => Self {
                seconds,
                nanos: u32::try_from(sub).unwrap_or(0),
            },
            Err(_) if nanos < 0 => Self::from_unix_seconds(i64::MIN),
            Err(_) => Self::from_unix_seconds(i64::MAX),
        }
    }

    /// The instant of a Kubernetes timestamp (sub-second precision is kept, as Go keeps it).
    pub fn from_k8s(time: &K8sTime) -> Self {
        Self::from_unix_nanos(time.0.as_nanosecond())
    }

    /// Whole unix seconds (floor).
    pub const fn unix_seconds(self) -> i64 {
        self.seconds
    }

    /// Nanoseconds past [`Time::unix_seconds`].
    pub const fn subsec_nanos(self) -> u32 {
        self.nanos
    }

    /// This instant plus whole seconds, saturating at the representable range (Go's
    /// `time.Time.Add` saturates too).
    #[must_use]
    pub const fn saturating_add_seconds(self, seconds: i64) -> Self {
        Self {
            seconds: self.seconds.saturating_add(seconds),
            nanos: self.nanos,
        }
    }
}
