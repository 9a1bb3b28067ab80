#![no_main]
//! `hf_config`: see m2r2_tests::hostile::Target::HfConfig.
use m2r2_tests::hostile::{Target, run};

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    run(Target::HfConfig, data);
});
