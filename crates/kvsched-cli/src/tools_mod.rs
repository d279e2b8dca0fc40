//! The command-line tools on top of the library (feature `cli`): `kvsched replay`,
//! `kvsched stress`, the mutex baseline it compares against, and the runtime's claim path for
//! one replayed report. Nothing in the library imports them.

pub(crate) mod baseline;
pub(crate) mod cli;
pub(crate) mod parallel;
pub(crate) mod replay;
pub(crate) mod stress;

#[cfg(test)]
mod tests;
