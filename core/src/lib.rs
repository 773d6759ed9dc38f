//! Core library (in progress).
