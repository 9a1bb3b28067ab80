#![no_main]
//! `tokenizer`: see m2r2_tests::hostile::Target::Tokenizer.
use m2r2_tests::hostile::{Target, run};

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    run(Target::Tokenizer, data);
});
