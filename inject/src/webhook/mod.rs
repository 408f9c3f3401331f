//! `remora webhook`: the mutating admission webhook. [`admission`] turns an AdmissionReview
//! into its answer (a pure function, tested without a network); [`server`] serves it over
//! HTTPS with rustls.

pub mod admission;
pub mod server;

pub use admission::{review, NamespaceLookup, NoNamespaces, ReviewError};
pub use server::{serve, ServerError, WebhookOptions};
