//! Kubernetes resource quantities with the exact semantics of
//! `k8s.io/apimachinery/pkg/api/resource` (`quantity.go`, `amount.go`, `suffix.go`).
//!
//! A [`Quantity`] holds its exact value as a signed count of nano-units (`i128`), because
//! `ParseQuantity` rounds every value up (away from zero) to nano precision: nothing finer
//! ever survives a parse. No floating point is involved anywhere.
//!
//! The supported magnitude is `i128::MAX` nano-units (about 1.7e29 units). Upstream keeps
//! arbitrary precision decimals, so strings beyond that range (such as `1e30`) are rejected
//! with [`QuantityError::OutOfRange`] instead of being silently wrong; arithmetic saturates.

use std::cmp::Ordering;
use std::fmt;
use std::hash::{Hash, Hasher};

use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;

/// Nano-units per unit: the precision floor of every parsed quantity.
const NANOS_PER_UNIT: i128 = 1_000_000_000;

/// The BinarySI cap of `ParseQuantity`: values above `2^63 - 1` units are clamped to it.
const BINARY_SI_MAX_NANOS: u128 = (i64::MAX as u128) * 1_000_000_000;

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
    /// The value is valid Kubernetes syntax but beyond the supported range of about ±1.7e29.
    #[error("quantity {input:?} is outside the supported range (|value| < 1.7e29)")]
    OutOfRange {
        /// The rejected input.
        input: String,
    },
}

/// An exact Kubernetes quantity: value in nano-units plus the format it prints in.
///
/// Equality, ordering and hashing are by value only, like upstream `Cmp`: `1Gi == 1073741824`.
#[derive(Clone, Copy, Debug)]
pub struct Quantity {
    nanos: i128,
    format: Format,
}

impl PartialEq for Quantity {
    fn eq(&self, other: &Self) -> bool {
        self.nanos == other.nanos
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
        self.nanos.cmp(&other.nanos)
    }
}

impl Hash for Quantity {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.nanos.hash(state);
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
        Self { nanos: 0, format }
    }

    /// `resource.NewQuantity(n, DecimalSI)`: how upstream expresses object counts.
    pub fn from_count(count: u64) -> Self {
        Self {
            nanos: i128::from(count) * NANOS_PER_UNIT,
            format: Format::DecimalSI,
        }
    }

    /// A quantity of exactly `nanos` nano-units in `format`.
    pub const fn from_nanos(nanos: i128, format: Format) -> Self {
        Self { nanos, format }
    }

    /// The exact value in nano-units.
    pub const fn nanos(self) -> i128 {
        self.nanos
    }

    /// The format the quantity prints in.
    pub const fn format(self) -> Format {
        self.format
    }

    /// The same value printed in another format.
    #[must_use]
    pub const fn with_format(self, format: Format) -> Self {
        Self {
            nanos: self.nanos,
            format,
        }
    }

    /// Whether the value is zero (whatever the format).
    pub const fn is_zero(self) -> bool {
        self.nanos == 0
    }

    /// Whether the value is a whole number of units.
    pub const fn is_integer(self) -> bool {
        self.nanos % NANOS_PER_UNIT == 0
    }

    /// Parses a quantity exactly as `resource.ParseQuantity` does.
    pub fn parse(input: &str) -> Result<Self, QuantityError> {
        parse(input)
    }

    /// Parses the string inside a k8s-openapi quantity.
    pub fn parse_k8s(quantity: &K8sQuantity) -> Result<Self, QuantityError> {
        parse(&quantity.0)
    }

    /// The canonical string wrapped as a k8s-openapi quantity, as the controller would write it.
    pub fn to_k8s(self) -> K8sQuantity {
        K8sQuantity(self.to_string())
    }

    /// `Quantity.Add`: the sum, or `None` on overflow. If `self` is zero the result takes
    /// `other`'s format, which is why a usage sum prints in the format of its first non-zero
    /// addend.
    pub fn checked_add(self, other: Self) -> Option<Self> {
        let format = if self.is_zero() { other.format } else { self.format };
        Some(Self {
            nanos: self.nanos.checked_add(other.nanos)?,
            format,
        })
    }

    /// `Quantity.Add` with the same format rule as [`Quantity::checked_add`], saturating at the
    /// representable range instead of failing (a sum that large is already meaningless).
    #[must_use]
    pub fn saturating_add(self, other: Self) -> Self {
        let format = if self.is_zero() { other.format } else { self.format };
        Self {
            nanos: self.nanos.saturating_add(other.nanos),
            format,
        }
    }

    /// The larger value, keeping `self` (and its format) on ties, like upstream
    /// `maxResourceList` which replaces only when the new value is strictly greater.
    #[must_use]
    pub fn max_by_value(self, other: Self) -> Self {
        if other.nanos > self.nanos { other } else { self }
    }

    /// `Quantity.RoundUp(0)`: rounds away from zero to whole units, keeping the format.
    /// The flag is `true` when the value was already whole (no precision lost).
    #[must_use]
    pub fn round_up_to_integer(self) -> (Self, bool) {
        let rem = self.nanos % NANOS_PER_UNIT;
        if rem == 0 {
            return (self, true);
        }
        let toward_zero = self.nanos - rem;
        let away = if self.nanos > 0 {
            toward_zero.saturating_add(NANOS_PER_UNIT)
        } else {
            toward_zero.saturating_sub(NANOS_PER_UNIT)
        };
        (
            Self {
                nanos: away,
                format: self.format,
            },
            false,
        )
    }
}

impl std::ops::Add for Quantity {
    type Output = Quantity;

    /// Saturating [`Quantity::saturating_add`], with the upstream zero-adopts-format rule.
    fn add(self, rhs: Self) -> Self::Output {
        self.saturating_add(rhs)
    }
}

impl std::ops::AddAssign for Quantity {
    fn add_assign(&mut self, rhs: Self) {
        *self = self.saturating_add(rhs);
    }
}

impl std::str::FromStr for Quantity {
    type Err = QuantityError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse(s)
    }
}

// ---------------------------------------------------------------------------------------------
// Parsing
// ---------------------------------------------------------------------------------------------

/// The base and exponent a suffix stands for.
#[derive(Clone, Copy)]
enum Base {
    Ten,
    Two,
}

/// `quantitySuffixer.interpret`.
fn interpret_suffix(suffix: &str) -> Option<(Base, i64, Format)> {
    let decimal = |e| Some((Base::Ten, e, Format::DecimalSI));
    let binary = |e| Some((Base::Two, e, Format::BinarySI));
    match suffix {
        "" => decimal(0),
        "n" => decimal(-9),
        "u" => decimal(-6),
        "m" => decimal(-3),
        "k" => decimal(3),
        "M" => decimal(6),
        "G" => decimal(9),
        "T" => decimal(12),
        "P" => decimal(15),
        "E" => decimal(18),
        "Ki" => binary(10),
        "Mi" => binary(20),
        "Gi" => binary(30),
        "Ti" => binary(40),
        "Pi" => binary(50),
        "Ei" => binary(60),
        _ => {
            let rest = suffix.strip_prefix(['e', 'E'])?;
            if rest.is_empty() {
                return None;
            }
            // strconv.ParseInt(.., 10, 64) accepts an optional sign, then decimal digits. The
            // newest upstream rejects exponents whose negation would not fit an int32 scale.
            let exponent: i64 = rest.parse().ok()?;
            if exponent.unsigned_abs() > u64::from(i32::MAX.unsigned_abs()) {
                return None;
            }
            Some((Base::Ten, exponent, Format::DecimalExponent))
        }
    }
}

/// `parseQuantityString`: splits `[sign] number suffix`, returning the positions of the parts.
struct Scanned<'a> {
    positive: bool,
    /// Integer digits after leading zeros were stripped (may be empty).
    num: &'a str,
    /// Fraction digits (may be empty).
    denom: &'a str,
    suffix: &'a str,
    /// Whether the numeric part contained any digit at all (`"."` and `"Ki"` contain none).
    has_digit: bool,
}

fn scan(input: &str) -> Result<Scanned<'_>, QuantityError> {
    let bytes = input.as_bytes();
    let end = bytes.len();
    let mut pos = 0;
    let mut positive = true;
    match bytes.first() {
        Some(b'-') => {
            positive = false;
            pos = 1;
        }
        Some(b'+') => pos = 1,
        _ => {}
    }
    let number_start = pos;
    while pos < end && bytes[pos] == b'0' {
        pos += 1;
    }
    if pos >= end {
        // Upstream returns "0" here without looking at any suffix: "+", "-", "00" are zero.
        return Ok(Scanned {
            positive,
            num: "",
            denom: "",
            suffix: "",
            has_digit: true,
        });
    }
    let num_start = pos;
    while pos < end && bytes[pos].is_ascii_digit() {
        pos += 1;
    }
    let num = &input[num_start..pos];
    let mut denom = "";
    if pos < end && bytes[pos] == b'.' {
        pos += 1;
        let denom_start = pos;
        while pos < end && bytes[pos].is_ascii_digit() {
            pos += 1;
        }
        denom = &input[denom_start..pos];
    }
    let has_digit = input[number_start..pos].bytes().any(|b| b.is_ascii_digit());
    let suffix_start = pos;
    while pos < end && b"eEinumkKMGTP".contains(&bytes[pos]) {
        pos += 1;
    }
    if pos < end && (bytes[pos] == b'-' || bytes[pos] == b'+') {
        pos += 1;
    }
    while pos < end && bytes[pos].is_ascii_digit() {
        pos += 1;
    }
    if pos < end {
        return Err(QuantityError::Syntax {
            input: input.to_owned(),
        });
    }
    Ok(Scanned {
        positive,
        num,
        denom,
        suffix: &input[suffix_start..],
        has_digit,
    })
}

/// Whether upstream would leave its int64 fast path for the slow `inf.Dec` path, which
/// fails on a numeric part without digits (`inf.Dec.SetString(".")`). Only consulted for
/// inputs without any digit, where `num` is effectively `"0"` and `denom` is empty.
fn digitless_takes_slow_path(base: Base, exponent: i64) -> bool {
    match base {
        // precision = 18 - 1 >= 0, so only scale < Nano leaves the fast path.
        Base::Ten => exponent < -9,
        // precision = 15 - 1 - int32(float32(exponent)*3/10) - 1 is negative from Pi on.
        Base::Two => exponent >= 50,
    }
}

fn parse(input: &str) -> Result<Quantity, QuantityError> {
    if input.is_empty() {
        return Err(QuantityError::Empty);
    }
    if input == "0" {
        return Ok(Quantity::zero(Format::DecimalSI));
    }
    let scanned = scan(input)?;
    let Some((base, exponent, mut format)) = interpret_suffix(scanned.suffix) else {
        return Err(QuantityError::Suffix {
            input: input.to_owned(),
            suffix: scanned.suffix.to_owned(),
        });
    };
    if !scanned.has_digit && digitless_takes_slow_path(base, exponent) {
        return Err(QuantityError::Syntax {
            input: input.to_owned(),
        });
    }
    let out_of_range = || QuantityError::OutOfRange {
        input: input.to_owned(),
    };

    // value = digits * 10^(-len(denom)) * base^exponent, in nano-units: shift by 9 more.
    let digits = scanned.num.bytes().chain(scanned.denom.bytes());
    let mut big = BigUint::from_digits(digits);
    let denom_len = i64::try_from(scanned.denom.len()).map_err(|_| out_of_range())?;
    let (mut ten_exponent, two_exponent) = match base {
        Base::Ten => (exponent - denom_len + 9, 0),
        Base::Two => (9 - denom_len, exponent),
    };
    let magnitude = if big.is_zero() {
        Some(0)
    } else {
        if two_exponent > 0 {
            big.shl_small(u32::try_from(two_exponent).unwrap_or(u32::MAX));
        }
        let mut inexact = false;
        let mut overflow = false;
        while ten_exponent > 0 && !overflow {
            big.mul_small(10);
            overflow = big.bits() > 128;
            ten_exponent -= 1;
        }
        while ten_exponent < 0 && !big.is_zero() {
            inexact |= big.div_small(10) != 0;
            ten_exponent += 1;
        }
        if ten_exponent < 0 {
            // Every remaining digit was divided away: a non-zero value below one nano-unit.
            inexact = true;
        }
        if overflow {
            None
        } else {
            // Upstream rounds non-zero values up (away from zero) to the nano scale.
            big.to_u128().and_then(|v| v.checked_add(u128::from(inexact)))
        }
    };
    let magnitude = match (format, magnitude) {
        (Format::BinarySI, None) => BINARY_SI_MAX_NANOS,
        (Format::BinarySI, Some(v)) => v.min(BINARY_SI_MAX_NANOS),
        (_, None) => return Err(out_of_range()),
        (_, Some(v)) => v,
    };
    let magnitude = i128::try_from(magnitude).map_err(|_| out_of_range())?;
    if format == Format::BinarySI && magnitude > 0 && magnitude < NANOS_PER_UNIT {
        // Fractions of a byte cannot be written with binary suffixes.
        format = Format::DecimalSI;
    }
    let nanos = if scanned.positive { magnitude } else { -magnitude };
    Ok(Quantity { nanos, format })
}

/// A minimal unsigned big integer (little-endian base 2^32 limbs), used only while parsing
/// so that long digit strings and large exponents are handled exactly.
struct BigUint {
    limbs: Vec<u32>,
}

// The `as` casts split a `u64` into its low and high 32-bit halves on purpose.
#[allow(clippy::cast_possible_truncation)]
impl BigUint {
    fn from_digits(digits: impl Iterator<Item = u8>) -> Self {
        let mut value = Self { limbs: Vec::new() };
        for digit in digits {
            value.mul_small(10);
            value.add_small(u32::from(digit - b'0'));
        }
        value
    }

    fn is_zero(&self) -> bool {
        self.limbs.iter().all(|&l| l == 0)
    }

    fn bits(&self) -> u64 {
        let mut len = self.limbs.len();
        while len > 0 && self.limbs[len - 1] == 0 {
            len -= 1;
        }
        if len == 0 {
            return 0;
        }
        (len as u64 - 1) * 32 + u64::from(32 - self.limbs[len - 1].leading_zeros())
    }

    fn mul_small(&mut self, factor: u32) {
        let mut carry = 0u64;
        for limb in &mut self.limbs {
            let v = u64::from(*limb) * u64::from(factor) + carry;
            *limb = v as u32;
            carry = v >> 32;
        }
        if carry != 0 {
            self.limbs.push(carry as u32);
        }
    }

    fn add_small(&mut self, addend: u32) {
        let mut carry = u64::from(addend);
        for limb in &mut self.limbs {
            if carry == 0 {
                return;
            }
            let v = u64::from(*limb) + carry;
            *limb = v as u32;
            carry = v >> 32;
        }
        if carry != 0 {
            self.limbs.push(carry as u32);
        }
    }

    fn shl_small(&mut self, shift: u32) {
        let mut remaining = shift;
        while remaining > 0 {
            let step = remaining.min(31);
            self.mul_small(1 << step);
            remaining -= step;
        }
    }

    /// Divides in place, returning the remainder.
    fn div_small(&mut self, divisor: u32) -> u32 {
        let mut rem = 0u64;
        for limb in self.limbs.iter_mut().rev() {
            let v = (rem << 32) | u64::from(*limb);
            *limb = (v / u64::from(divisor)) as u32;
            rem = v % u64::from(divisor);
        }
        rem as u32
    }

    fn to_u128(&self) -> Option<u128> {
        if self.bits() > 128 {
            return None;
        }
        Some(
            self.limbs
                .iter()
                .rev()
                .fold(0u128, |acc, &l| (acc << 32) | u128::from(l)),
        )
    }
}

// ---------------------------------------------------------------------------------------------
// Canonical formatting
// ---------------------------------------------------------------------------------------------

/// Removes factors of `base` from `value`, returning the reduced value and the count.
fn remove_factors(mut value: u128, base: u128) -> (u128, i32) {
    let mut times = 0;
    while value >= base && value.is_multiple_of(base) {
        value /= base;
        times += 1;
    }
    (value, times)
}

/// `AsCanonicalBytes`: mantissa and a base-10 exponent that is a multiple of 3.
fn canonical_decimal(magnitude: u128) -> (u128, i32) {
    let (mut mantissa, times) = remove_factors(magnitude, 10);
    let mut exponent = times - 9;
    let shift = exponent.rem_euclid(3);
    // shift <= times, so the mantissa never exceeds the original magnitude.
    for _ in 0..shift {
        mantissa *= 10;
    }
    exponent -= shift;
    (mantissa, exponent)
}

fn decimal_si_suffix(exponent: i32) -> Option<&'static str> {
    Some(match exponent {
        -9 => "n",
        -6 => "u",
        -3 => "m",
        0 => "",
        3 => "k",
        6 => "M",
        9 => "G",
        12 => "T",
        15 => "P",
        18 => "E",
        _ => return None,
    })
}

fn write_exponent_form(f: &mut fmt::Formatter<'_>, sign: &str, mantissa: u128, exponent: i32) -> fmt::Result {
    if exponent == 0 {
        write!(f, "{sign}{mantissa}")
    } else {
        write!(f, "{sign}{mantissa}e{exponent}")
    }
}

impl fmt::Display for Quantity {
    /// `CanonicalizeBytes`: the string Kubernetes writes for a computed quantity.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.nanos == 0 {
            return f.write_str("0");
        }
        let sign = if self.nanos < 0 { "-" } else { "" };
        let magnitude = self.nanos.unsigned_abs();
        let format = match self.format {
            Format::BinarySI if magnitude < 1024 * NANOS_PER_UNIT.unsigned_abs() => Format::DecimalSI,
            Format::BinarySI if !self.is_integer() => Format::DecimalSI,
            other => other,
        };
        match format {
            Format::BinarySI => {
                let units = magnitude / NANOS_PER_UNIT.unsigned_abs();
                let (mantissa, times) = remove_factors(units, 1024);
                let suffix = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];
                if let Some(suffix) = usize::try_from(times).ok().and_then(|t| suffix.get(t)) {
                    write!(f, "{sign}{mantissa}{suffix}")
                } else {
                    // Past Ei there is no binary suffix; the newest upstream falls back to an
                    // exact exponent form instead of dropping the magnitude.
                    let (mantissa, exponent) = canonical_decimal(magnitude);
                    write_exponent_form(f, sign, mantissa, exponent)
                }
            }
            Format::DecimalSI => {
                let (mantissa, exponent) = canonical_decimal(magnitude);
                match decimal_si_suffix(exponent) {
                    Some(suffix) => write!(f, "{sign}{mantissa}{suffix}"),
                    // Beyond "E" the newest upstream switches to exponent notation.
                    None => write_exponent_form(f, sign, mantissa, exponent),
                }
            }
            Format::DecimalExponent => {
                let (mantissa, exponent) = canonical_decimal(magnitude);
                write_exponent_form(f, sign, mantissa, exponent)
            }
        }
    }
}

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
        let mut mantissa = q.nanos;
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
            CompactQuantity::Large(q) => **q,
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
            CompactQuantity::Large(_) => std::mem::size_of::<Quantity>(),
        }
    }
}
