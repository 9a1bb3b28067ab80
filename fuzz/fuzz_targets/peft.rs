#![no_main]
//! `peft`: see m2r2_tests::hostile::Target::Peft.
use m2r2_tests::hostile::{Target, run};

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    run(Target::Peft, data);
});
