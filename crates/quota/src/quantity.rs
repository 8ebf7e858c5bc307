//! Kubernetes resource quantities with the exact semantics of
//! `k8s.io/apimachinery/pkg/api/resource` (`quantity.go`, `amount.go`, `suffix.go`).
//!
//! A [`Quantity`] holds its exact value as a signed count of nano-units, because
//! `ParseQuantity` rounds every value up (away from zero) to nano precision: nothing finer
//! ever survives a parse. No floating point is involved anywhere.
//!
//! Every practical value fits an `i128` (about ±1.7e29 units), the fast path. Upstream keeps
//! arbitrary precision, and the apiserver accepts a tenant's `requests.memory: 1e30`; such
//! values, and sums that leave the `i128` range, are held exactly as big integers up to
//! [`MAX_BITS`] bits (about 1e1224 units). A string beyond that is refused by the parser
//! ([`QuantityError::OutOfRange`]); an object carrying one is still counted, with that
//! quantity [`Quantity::unknown`], and every sum it enters is unknown too, so a key is never
//! written lower than upstream's value (the controller withholds it instead).

use std::cmp::Ordering;
use std::fmt;
use std::hash::{Hash, Hasher};

use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;
use num_bigint::{BigInt, BigUint, Sign};
use num_traits::{ToPrimitive as _, Zero as _};

/// Nano-units per unit: the precision floor of every parsed quantity.
const NANOS_PER_UNIT: i128 = 1_000_000_000;

/// The BinarySI cap of `ParseQuantity`: values above `2^63 - 1` units are clamped to it.
const BINARY_SI_MAX_NANOS: u128 = (i64::MAX as u128) * 1_000_000_000;

/// The largest magnitude held exactly, in bits of nano-units (2^4096 nano-units, about 1e1224
/// units): far beyond any real request, and it bounds what one tenant-written string costs
/// (512 bytes of big integer, where `1e2147483647` would otherwise take 900 MB to sum).
pub const MAX_BITS: u64 = 4096;

/// How a quantity prints, as remembered from the string it was parsed from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Format {
    /// `e` or `E` exponent notation, printed as `12e6`.
    DecimalExponent,
    /// Powers of 1024, printed with `Ki`, `Mi`, ... `Ei`.
    BinarySI,
    /// Powers of 1000, printed with `n`, `u`, `m`, `k`, `M`, ... `E`.
    DecimalSI,
}

/// Why a quantity string was rejected; every variant names the offending input.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    /// The string was empty (`ErrFormatWrong` upstream).
    #[error("quantity string is empty")]
    Empty,
    /// The string does not match the quantity grammar (`ErrFormatWrong` or `ErrNumeric`).
    #[error("quantity {input:?} does not match the Kubernetes quantity syntax")]
    Syntax {
        /// The rejected input.
        input: String,
    },
    /// The suffix is not one Kubernetes knows (`ErrSuffix`).
    #[error("quantity {input:?} has the unknown suffix {suffix:?}")]
    Suffix {
        /// The rejected input.
        input: String,
        /// The suffix that could not be interpreted.
        suffix: String,
    },
    /// The value is valid Kubernetes syntax but beyond [`MAX_BITS`] bits of nano-units.
    #[error("quantity {input:?} is outside the supported range (|value| < 1e1224)")]
    OutOfRange {
        /// The rejected input.
        input: String,
    },
}

/// The value of a [`Quantity`]; each value has exactly one representation.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Amount {
    /// Exact nano-units: the fast path, every practical value.
    Nanos(i128),
    /// Exact nano-units outside the `i128` range, at most [`MAX_BITS`] bits.
    Big(Box<BigInt>),
    /// Not held: a string beyond [`MAX_BITS`], or a sum or maximum that involved one.
    Unknown,
}

impl Amount {
    fn from_big(value: BigInt) -> Self {
        if value.bits() > MAX_BITS {
            return Self::Unknown;
        }
        match value.to_i128() {
            Some(nanos) => Self::Nanos(nanos),
            None => Self::Big(Box::new(value)),
        }
    }

    fn to_big(&self) -> Option<BigInt> {
        match self {
            Self::Nanos(nanos) => Some(BigInt::from(*nanos)),
            Self::Big(big) => Some((**big).clone()),
            Self::Unknown => None,
        }
    }

    /// The exact sum (unknown if either is, or beyond [`MAX_BITS`]).
    fn add(&self, other: &Self) -> Self {
        match (self, other) {
            (Self::Nanos(a), Self::Nanos(b)) => a
                .checked_add(*b)
                .map_or_else(|| Self::from_big(BigInt::from(*a) + b), Self::Nanos),
            (Self::Unknown, _) | (_, Self::Unknown) => Self::Unknown,
            _ => match (self.to_big(), other.to_big()) {
                (Some(a), Some(b)) => Self::from_big(a + b),
                _ => Self::Unknown,
            },
        }
    }
}

impl Ord for Amount {
    /// By value; unknown sorts above every value (a maximum involving it is unknown).
    fn cmp(&self, other: &Self) -> Ordering {
        match (self, other) {
            (Self::Nanos(a), Self::Nanos(b)) => a.cmp(b),
            (Self::Unknown, Self::Unknown) => Ordering::Equal,
            (Self::Unknown, _) => Ordering::Greater,
            (_, Self::Unknown) => Ordering::Less,
            _ => self.to_big().cmp(&other.to_big()),
        }
    }
}

impl PartialOrd for Amount {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// An exact Kubernetes quantity: its value plus the format it prints in.
///
/// Equality, ordering and hashing are by value only, like upstream `Cmp`: `1Gi == 1073741824`.
#[derive(Clone, Debug)]
pub struct Quantity {
    amount: Amount,
    format: Format,
}

impl PartialEq for Quantity {
    fn eq(&self, other: &Self) -> bool {
        self.amount == other.amount
    }
}

impl Eq for Quantity {}

impl PartialOrd for Quantity {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Quantity {
    fn cmp(&self, other: &Self) -> Ordering {
        self.amount.cmp(&other.amount)
    }
}

impl Hash for Quantity {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.amount.hash(state);
    }
}

impl Default for Quantity {
    /// `resource.Quantity{Format: DecimalSI}`: the zero every usage sum starts from.
    fn default() -> Self {
        Self::zero(Format::DecimalSI)
    }
}

impl Quantity {
    /// A zero quantity that prints as `"0"` and carries `format` for later additions.
    pub const fn zero(format: Format) -> Self {
        Self::from_nanos(0, format)
    }

    /// `resource.NewQuantity(n, DecimalSI)`: how upstream expresses object counts.
    pub fn from_count(count: u64) -> Self {
        Self::from_nanos(i128::from(count) * NANOS_PER_UNIT, Format::DecimalSI)
    }

    /// A quantity of exactly `nanos` nano-units in `format`.
    pub const fn from_nanos(nanos: i128, format: Format) -> Self {
        Self {
            amount: Amount::Nanos(nanos),
            format,
        }
    }

    /// A quantity of exactly `nanos` nano-units in `format`; unknown beyond [`MAX_BITS`].
    pub fn from_big_nanos(nanos: BigInt, format: Format) -> Self {
        Self {
            amount: Amount::from_big(nanos),
            format,
        }
    }

    /// The value an object carries when lazyquota cannot hold it (a string beyond
    /// [`MAX_BITS`]): the object still counts, and every sum it enters is unknown.
    pub const fn unknown() -> Self {
        Self {
            amount: Amount::Unknown,
            format: Format::DecimalSI,
        }
    }

    /// Whether the value is not held (see [`Quantity::unknown`]).
    pub const fn is_unknown(&self) -> bool {
        matches!(self.amount, Amount::Unknown)
    }

    /// The exact value in nano-units, if it fits an `i128`.
    pub const fn nanos(&self) -> Option<i128> {
        match self.amount {
            Amount::Nanos(nanos) => Some(nanos),
            _ => None,
        }
    }

    /// The exact value in nano-units, at any size (`None` if unknown).
    pub fn big_nanos(&self) -> Option<BigInt> {
        self.amount.to_big()
    }

    /// The format the quantity prints in.
    pub const fn format(&self) -> Format {
        self.format
    }

    /// The same value printed in another format.
    #[must_use]
    pub fn with_format(self, format: Format) -> Self {
        Self { format, ..self }
    }

    /// Whether the value is zero (whatever the format).
    pub const fn is_zero(&self) -> bool {
        matches!(self.amount, Amount::Nanos(0))
    }

    /// The value in units as a float, for metrics and display only (rounded; NaN if unknown).
    #[allow(clippy::cast_precision_loss)] // a gauge needs a float; exactness stays in `self`
    pub fn to_f64(&self) -> f64 {
        match &self.amount {
            Amount::Nanos(nanos) => *nanos as f64 / 1e9,
            Amount::Big(big) => big.to_f64().map_or(f64::NAN, |v| v / 1e9),
            Amount::Unknown => f64::NAN,
        }
    }

    /// Heap bytes owned by this value: zero on the fast path.
    pub fn heap_bytes(&self) -> usize {
        match &self.amount {
            Amount::Big(big) => std::mem::size_of::<BigInt>() + big.magnitude().to_u64_digits().len() * 8,
            _ => 0,
        }
    }

    /// Parses a quantity exactly as `resource.ParseQuantity` does.
    pub fn parse(input: &str) -> Result<Self, QuantityError> {
        parse(input)
    }

    /// Parses the string inside a k8s-openapi quantity.
    pub fn parse_k8s(quantity: &K8sQuantity) -> Result<Self, QuantityError> {
        parse(&quantity.0)
    }

    /// The canonical string wrapped as a k8s-openapi quantity, as the controller would write it
    /// (never called for an unknown value: the controller withholds those keys).
    ///
    /// One deliberate difference from upstream: a BinarySI value beyond 2^63-1 units is written
    /// in decimal. The apiserver caps a binary-suffixed string at 2^63-1 when it parses it, so
    /// KCM's `…Mi` string for such a sum (a `64Mi` pod counted before a tenant's `1e30` one) is
    /// stored lower than the usage — an undercount lazyquota does not copy.
    pub fn to_k8s(&self) -> K8sQuantity {
        let beyond_binary_cap = self.format == Format::BinarySI
            && self
                .amount
                .to_big()
                .is_some_and(|v| v.magnitude() > &BigUint::from(BINARY_SI_MAX_NANOS));
        if beyond_binary_cap {
            return K8sQuantity(self.clone().with_format(Format::DecimalSI).to_string());
        }
        K8sQuantity(self.to_string())
    }

    /// `Quantity.Add`, exact at any size. If `self` is zero the result takes `other`'s format,
    /// which is why a usage sum prints in the format of its first non-zero addend.
    #[must_use]
    pub fn add(&self, other: &Self) -> Self {
        let format = if self.is_zero() { other.format } else { self.format };
        Self {
            amount: self.amount.add(&other.amount),
            format,
        }
    }

    /// `Quantity.Sub`, exact at any size, with the same zero-adopts-format rule as
    /// [`Quantity::add`]; unknown if either side is.
    #[must_use]
    pub fn sub(&self, other: &Self) -> Self {
        let format = if self.is_zero() { other.format } else { self.format };
        let amount = match (&self.amount, &other.amount) {
            (Amount::Nanos(a), Amount::Nanos(b)) if a.checked_sub(*b).is_some() => Amount::Nanos(a - b),
            _ => match (self.amount.to_big(), other.amount.to_big()) {
                (Some(a), Some(b)) => Amount::from_big(a - b),
                _ => Amount::Unknown,
            },
        };
        Self { amount, format }
    }

    /// Whether the value is greater than zero (`Cmp(0) > 0`); `None` if unknown.
    pub fn is_positive(&self) -> Option<bool> {
        match &self.amount {
            Amount::Nanos(n) => Some(*n > 0),
            Amount::Big(b) => Some(b.sign() == Sign::Plus),
            Amount::Unknown => None,
        }
    }

    /// The larger value, keeping `self` (and its format) on ties, like upstream
    /// `maxResourceList` which replaces only when the new value is strictly greater.
    #[must_use]
    pub fn max_by_value(self, other: Self) -> Self {
        if other.amount > self.amount { other } else { self }
    }

    /// `Quantity.RoundUp(0)`: rounds away from zero to whole units, keeping the format.
    /// The flag is `true` when the value was already whole (no precision lost).
    #[must_use]
    pub fn round_up_to_integer(self) -> (Self, bool) {
        let Some(value) = self.amount.to_big() else {
            return (self, false);
        };
        let unit = BigInt::from(NANOS_PER_UNIT);
        // Rust's remainder has the dividend's sign, so `value - rem` rounds toward zero.
        let rem = &value % &unit;
        if rem.is_zero() {
            return (self, true);
        }
        let negative = value.sign() == Sign::Minus;
        let toward_zero = value - rem;
        let away = if negative {
            toward_zero - unit
        } else {
            toward_zero + unit
        };
        (Self::from_big_nanos(away, self.format), false)
    }
}

impl std::ops::Add for Quantity {
    type Output = Quantity;

    /// [`Quantity::add`]: exact, with the upstream zero-adopts-format rule.
    fn add(self, rhs: Self) -> Self::Output {
        Quantity::add(&self, &rhs)
    }
}

impl std::ops::AddAssign for Quantity {
    fn add_assign(&mut self, rhs: Self) {
        *self = Quantity::add(self, &rhs);
    }
}

impl std::ops::AddAssign<&Quantity> for Quantity {
    fn add_assign(&mut self, rhs: &Quantity) {
        *self = Quantity::add(self, rhs);
    }
}

impl std::str::FromStr for Quantity {
    type Err = QuantityError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse(s)
    }
}

mod format;
mod parse;

use parse::parse;

// ---------------------------------------------------------------------------------------------
// Compact storage
// ---------------------------------------------------------------------------------------------

/// A [`Quantity`] packed into 16 bytes for per-object storage (`Option<CompactQuantity>` is
/// 16 bytes too): `mantissa * 10^exponent` nano-units. Values with more than 19 significant
/// digits, which never occur in practice, are boxed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CompactQuantity {
    /// The common case.
    Small {
        /// Significant digits of the nano-unit value.
        mantissa: i64,
        /// Power of ten applied to the mantissa, in `0..=38`.
        exponent: i8,
        /// Format to print in.
        format: Format,
    },
    /// Anything the small form cannot hold exactly.
    Large(Box<Quantity>),
}

impl From<Quantity> for CompactQuantity {
    fn from(q: Quantity) -> Self {
        let Some(mut mantissa) = q.nanos() else {
            return CompactQuantity::Large(Box::new(q));
        };
        let mut exponent: i8 = 0;
        while mantissa != 0 && mantissa % 10 == 0 {
            mantissa /= 10;
            exponent += 1;
        }
        match i64::try_from(mantissa) {
            Ok(mantissa) => CompactQuantity::Small {
                mantissa,
                exponent,
                format: q.format,
            },
            Err(_) => CompactQuantity::Large(Box::new(q)),
        }
    }
}

impl From<&CompactQuantity> for Quantity {
    fn from(c: &CompactQuantity) -> Self {
        match c {
            CompactQuantity::Small {
                mantissa,
                exponent,
                format,
            } => {
                // The small form is only built from an i128, so this cannot overflow.
                let nanos = (0..*exponent).fold(i128::from(*mantissa), |acc, _| acc * 10);
                Quantity::from_nanos(nanos, *format)
            }
            CompactQuantity::Large(q) => (**q).clone(),
        }
    }
}

impl CompactQuantity {
    /// The full quantity.
    pub fn get(&self) -> Quantity {
        Quantity::from(self)
    }

    /// Heap bytes owned by this value (non-zero only for the rare boxed form).
    pub fn heap_bytes(&self) -> usize {
        match self {
            CompactQuantity::Small { .. } => 0,
            CompactQuantity::Large(q) => std::mem::size_of::<Quantity>() + q.heap_bytes(),
        }
    }
}
