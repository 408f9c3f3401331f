//! End-to-end harness (placeholder).
