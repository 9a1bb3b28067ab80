#![no_main]
//! `golden`: see m2r2_tests::hostile::Target::Golden.
use m2r2_tests::hostile::{Target, run};

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    run(Target::Golden, data);
});
