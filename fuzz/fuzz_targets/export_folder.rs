#![no_main]
//! `export_folder`: see m2r2_tests::hostile::Target::ExportFolder.
use m2r2_tests::hostile::{Target, run};

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    run(Target::ExportFolder, data);
});
