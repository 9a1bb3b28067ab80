#![no_main]
//! `m2r2_folder`: see m2r2_tests::hostile::Target::M2r2Folder.
use m2r2_tests::hostile::{Target, run};

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    run(Target::M2r2Folder, data);
});
