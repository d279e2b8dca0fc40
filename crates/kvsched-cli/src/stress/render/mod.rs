//! The report rendered: as JSON ([`render_json`]) and as a human-readable table
//! ([`render_human`]), section by section.
//!
//! [`json`] (the JSON and what its keys mean); [`human`] (the table's sections of figures)
//! over [`header`] (the settings and the legend), [`notes`] (the notes under the sections)
//! with [`decisions`] (whether kvsched and the baseline decided alike, and why not),
//! [`prompt_notes`] (where the prompt tokens came from, against the trace's reference),
//! [`faults_caused`] (what each injected fault caused), [`invariants`] (the verdicts),
//! [`model`] (`--engine model`'s judge), [`store_notes`] (an unwarmed sim store, a disk
//! store's dropped saves), with
//! [`table`] (the column layout and the wrapping) and [`cells`] (how numbers are written).

mod cells;
mod decisions;
mod faults_caused;
mod header;
mod human;
mod invariants;
mod json;
mod load_policy;
mod model;
mod notes;
mod prompt_notes;
mod store_notes;
mod table;

pub use human::render_human;
pub use json::render_json;
