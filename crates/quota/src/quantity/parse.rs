//! Parsing a quantity string exactly as `ParseQuantity` does: the suffix, the digits, and the
//! rounding up to nano-units.

use super::*;

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

pub(super) fn parse(input: &str) -> Result<Quantity, QuantityError> {
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
    let digits: Vec<u8> = scanned
        .num
        .bytes()
        .chain(scanned.denom.bytes())
        .map(|b| b - b'0')
        .collect();
    let mut big = BigUint::from_radix_be(&digits, 10).unwrap_or_default();
    let denom_len = i64::try_from(scanned.denom.len()).map_err(|_| out_of_range())?;
    let (ten_exponent, two_exponent) = match base {
        Base::Ten => (exponent - denom_len + 9, 0),
        Base::Two => (9 - denom_len, exponent),
    };
    let mut overflow = false;
    if !big.is_zero() {
        big <<= usize::try_from(two_exponent).unwrap_or(0);
        let mut inexact = false;
        if ten_exponent > 0 {
            // Each power of ten adds more than 3 bits: refuse before computing a huge power.
            let shift = u32::try_from(ten_exponent).unwrap_or(u32::MAX);
            overflow = u64::from(shift) > MAX_BITS / 3 + 1;
            if !overflow {
                big *= BigUint::from(10u32).pow(shift);
            }
        } else if ten_exponent < 0 {
            let shift = ten_exponent.unsigned_abs();
            if shift > big.bits() {
                // 10^shift > 2^shift > the digits: every digit is divided away.
                big = BigUint::zero();
                inexact = true;
            } else {
                let divisor = BigUint::from(10u32).pow(u32::try_from(shift).map_err(|_| out_of_range())?);
                inexact = !(&big % &divisor).is_zero();
                big /= divisor;
            }
        }
        // Upstream rounds non-zero values up (away from zero) to the nano scale.
        if inexact {
            big += 1u32;
        }
        overflow |= big.bits() > MAX_BITS;
    }
    let binary_si_max = BigUint::from(BINARY_SI_MAX_NANOS);
    if format == Format::BinarySI && (overflow || big > binary_si_max) {
        big = binary_si_max;
    } else if overflow {
        return Err(out_of_range());
    }
    if format == Format::BinarySI && !big.is_zero() && big < BigUint::from(NANOS_PER_UNIT.unsigned_abs()) {
        // Fractions of a byte cannot be written with binary suffixes.
        format = Format::DecimalSI;
    }
    let sign = if scanned.positive { Sign::Plus } else { Sign::Minus };
    Ok(Quantity::from_big_nanos(BigInt::from_biguint(sign, big), format))
}
