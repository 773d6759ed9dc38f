//! Conformance through the official Python SDK (conductor-python), run by the interpreter
//! named by `PERAGO_TEST_PYTHON`, else `<workspace>/.venv/bin/python` (created by
//! `scripts/test`).
