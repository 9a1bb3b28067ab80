#![no_main]
//! `hf_checkpoint`: see m2r2_tests::hostile::Target::HfCheckpoint.
use m2r2_tests::hostile::{Target, run};

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    run(Target::HfCheckpoint, data);
});
