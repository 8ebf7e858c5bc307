//! Writing a quantity in its canonical form, as `Quantity.String()` does.

use super::*;

/// Removes factors of `base` from `value`, returning the reduced value and the count.
fn remove_factors(mut value: BigUint, base: u32) -> (BigUint, i32) {
    let mut times = 0;
    loop {
        let (quotient, rem) = (&value / base, &value % base);
        if value < BigUint::from(base) || !rem.is_zero() {
            return (value, times);
        }
        value = quotient;
        times += 1;
    }
}

/// `AsCanonicalBytes`: mantissa and a base-10 exponent that is a multiple of 3.
fn canonical_decimal(magnitude: BigUint) -> (BigUint, i32) {
    let (mut mantissa, times) = remove_factors(magnitude, 10);
    let mut exponent = times - 9;
    let shift = exponent.rem_euclid(3);
    // shift <= times, so the mantissa never exceeds the original magnitude.
    for _ in 0..shift {
        mantissa *= 10u32;
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

fn write_exponent_form(
    f: &mut fmt::Formatter<'_>,
    sign: &str,
    mantissa: &BigUint,
    exponent: i32,
) -> fmt::Result {
    if exponent == 0 {
        write!(f, "{sign}{mantissa}")
    } else {
        write!(f, "{sign}{mantissa}e{exponent}")
    }
}

impl fmt::Display for Quantity {
    /// `CanonicalizeBytes`: the string Kubernetes writes for a computed quantity. An unknown
    /// value prints as `<unknown>` (in logs only: it is never written).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let value = match &self.amount {
            Amount::Unknown => return f.write_str("<unknown>"),
            Amount::Nanos(0) => return f.write_str("0"),
            amount => amount.to_big().unwrap_or_default(),
        };
        let (sign, magnitude) = value.into_parts();
        let sign = if sign == Sign::Minus { "-" } else { "" };
        let nano = BigUint::from(NANOS_PER_UNIT.unsigned_abs());
        let format = match self.format {
            Format::BinarySI if magnitude < BigUint::from(1024u32) * &nano => Format::DecimalSI,
            Format::BinarySI if !(&magnitude % &nano).is_zero() => Format::DecimalSI,
            other => other,
        };
        match format {
            Format::BinarySI => {
                let (mantissa, times) = remove_factors(&magnitude / &nano, 1024);
                let suffix = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];
                if let Some(suffix) = usize::try_from(times).ok().and_then(|t| suffix.get(t)) {
                    write!(f, "{sign}{mantissa}{suffix}")
                } else {
                    // Past Ei there is no binary suffix; the newest upstream falls back to an
                    // exact exponent form instead of dropping the magnitude.
                    let (mantissa, exponent) = canonical_decimal(magnitude);
                    write_exponent_form(f, sign, &mantissa, exponent)
                }
            }
            Format::DecimalSI => {
                let (mantissa, exponent) = canonical_decimal(magnitude);
                match decimal_si_suffix(exponent) {
                    Some(suffix) => write!(f, "{sign}{mantissa}{suffix}"),
                    // Beyond "E" the newest upstream switches to exponent notation.
                    None => write_exponent_form(f, sign, &mantissa, exponent),
                }
            }
            Format::DecimalExponent => {
                let (mantissa, exponent) = canonical_decimal(magnitude);
                write_exponent_form(f, sign, &mantissa, exponent)
            }
        }
    }
}
