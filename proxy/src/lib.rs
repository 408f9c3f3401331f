//! Remora's data plane (placeholder).
