#![no_main]
//! `gguf`: see m2r2_tests::hostile::Target::Gguf.
use m2r2_tests::hostile::{Target, run};

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    run(Target::Gguf, data);
});
