//! `remora webhook`: the mutating admission webhook. [`admission`] turns an AdmissionReview
//! into its answer (a pure function, tested without a network); [`server`] serves it over
//! HTTPS with rustls, presenting the certificate [`cert`] keeps in step with its files.

pub mod admission;
pub mod cert;
pub mod server;

pub use admission::{review, NamespaceLookup, NoNamespaces, ReviewError};
pub use server::{serve, ServerError, WebhookOptions};
