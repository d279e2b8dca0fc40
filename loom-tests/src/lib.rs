//! loom models of kvsched's concurrent protocols live in `tests/`; see `run.sh`.
