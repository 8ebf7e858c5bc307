//! Arbitrary strings through `Quantity::parse`: never panics, and whatever parses prints in a
//! canonical form that reparses to the same value (and prints the same again).

#![no_main]

use lazyquota_quota::{Format, Quantity};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(input) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(q) = Quantity::parse(input) else {
        return;
    };
    let printed = q.to_string();
    let back = Quantity::parse(&printed)
        .unwrap_or_else(|e| panic!("{input:?} printed as {printed:?}, which does not reparse: {e}"));
    assert_eq!(
        q, back,
        "{input:?} printed as {printed:?} reparses to another value"
    );
    assert_eq!(back.to_string(), printed, "{input:?}: printing is not idempotent");
    // The k8s-openapi wrapper goes the same way.
    assert_eq!(Quantity::parse_k8s(&q.to_k8s()).ok(), Some(q));
    // Arithmetic and formats never panic either.
    let _ = q.checked_add(back);
    let _ = q.saturating_add(back);
    let _ = q.round_up_to_integer();
    let _ = q.max_by_value(back);
    for format in [Format::DecimalSI, Format::BinarySI, Format::DecimalExponent] {
        let _ = q.with_format(format).to_string();
    }
});
