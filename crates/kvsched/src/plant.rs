//! Planted bugs: deliberate mistakes that a test-the-tests build turns on, one at a time, with
//! `RUSTFLAGS='--cfg kvsched_plant="NAME"'` (`scripts/plants.sh` for the test suite,
//! `loom-tests/plants.sh` for the loom models), to show the tests meant to catch each one do.
//!
//! Every plant is one [`planted!`] test next to the code it breaks: `planted!("NAME")` is
//! `cfg!(kvsched_plant = "NAME")`, a constant `false` in every normal build, so the compiler
//! folds the bug's branch away and the correct code is all that runs. Both branches are
//! compiled (and type-checked, and linted) in every build, so a plant cannot rot unnoticed.

/// `true` only in a build with `--cfg kvsched_plant="NAME"`; a constant, usable in `const`s.
macro_rules! planted {
    ($name:tt) => {
        cfg!(kvsched_plant = $name)
    };
}
