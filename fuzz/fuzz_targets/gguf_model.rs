#![no_main]
//! `gguf_model`: see m2r2_tests::hostile::Target::GgufModel.
use m2r2_tests::hostile::{Target, run};

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    run(Target::GgufModel, data);
});
