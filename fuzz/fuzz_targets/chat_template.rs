#![no_main]
//! `chat_template`: see m2r2_tests::hostile::Target::ChatTemplate.
use m2r2_tests::hostile::{Target, run};

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    run(Target::ChatTemplate, data);
});
