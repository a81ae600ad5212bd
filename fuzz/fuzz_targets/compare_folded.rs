//! The folded-stacks reader of `report` and `diff`
//! (`compare::input::parse_folded`): any text a user hands them must give
//! a profile or an error, never a panic or a wrong total. An accepted
//! profile's counts add up without overflow, per function too, and its
//! folded form reads back to the same folded form.
#![no_main]

use libfuzzer_sys::fuzz_target;
use lightswitch::commands::compare::{function_table, input, report};
use lightswitch::profile::format::folded;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(profile) = input::parse_folded(text) else {
        return;
    };
    let total = profile
        .samples
        .iter()
        .try_fold(0u64, |sum, s| sum.checked_add(s.count))
        .expect("an accepted profile's total fits in a u64");
    let table = function_table(&profile, false).expect("its per-function sums fit too");
    assert_eq!(table.total, total);
    for counts in table.functions.values() {
        assert!(counts.self_samples <= counts.inclusive && counts.inclusive <= total);
    }
    report::render_top(&profile, &table, 0);
    let encoded = folded::encode(&profile);
    let again = input::parse_folded(&encoded);
    if total > 0 {
        let again = again.expect("the encoder's output reads back");
        assert_eq!(folded::encode(&again), encoded, "folded form changed");
    }
});
