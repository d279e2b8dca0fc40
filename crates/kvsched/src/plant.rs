//! Planted bugs: deliberate mistakes that a test-the-tests build turns on, one at a time, with
//! `RUSTFLAGS='--cfg kvsched_plant="NAME"'` (`scripts/plants.sh` for the test suite,
//! `loom-tests/plants.sh` for the loom models), to show the tests meant to catch each one do.
//!
//! Every plant is one [`planted!`] test next to the code it breaks: `planted!("NAME")` is
//! `cfg!(kvsched_plant = "NAME")`, a constant `false` in every normal build, so the compiler
//! folds the bug's branch away and the correct code is all that runs. Both branches are
//! compiled (and type-checked, and linted) in every build, so a plant cannot rot unnoticed.

/// `true` only in a build with `--cfg kvsched_plant="NAME"`; a constant, usable in `const`s.
/// With several names (`planted!("A", "B")`), in a build with any of them: a site that two
/// plants share (code two components share, each plant with its own component's test).
macro_rules! planted {
    ($($name:tt),+ $(,)?) => {
        cfg!(any($(kvsched_plant = $name),+))
    };
}
