#![no_main]
//! `hf_sharded`: see m2r2_tests::hostile::Target::HfSharded.
use m2r2_tests::hostile::{Target, run};

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    run(Target::HfSharded, data);
});
