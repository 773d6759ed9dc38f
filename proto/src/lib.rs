//! Generated protocol code (in progress).
