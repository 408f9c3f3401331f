//! Sidecar injection: adds Remora to Kubernetes pods as Istio's injector adds Envoy.
//!
//! One library, two front ends: `remora inject` rewrites manifests ([`documents`]), and
//! `remora webhook` answers the API server's admission reviews ([`webhook`]). Both hand each
//! pod template to the [`Injector`] ([`injector`]), which decides ([`decision`]), resolves the
//! pod's settings from the [`config`] and its annotations ([`settings`], checked by
//! [`mod@validate`]) and hands the pod to its [`template`]: the sidecar
//! ([`sidecar_template`]: capture and proxy containers built as typed Kubernetes objects by
//! [`capture`] and [`sidecar`]), a [`gateway`], or proxyless gRPC ([`grpc`]). A user's own
//! `istio-proxy` is merged over ours ([`overlay`]), application probes are rewritten
//! ([`probes`]) and the metadata written ([`metadata`]). Pods stay
//! untyped YAML values ([`pod`]) so that fields the injector does not know pass through.

#![forbid(unsafe_code)]

pub mod capture;
pub mod cli;
pub mod config;
pub mod decision;
pub mod documents;
pub mod error;
pub mod gateway;
pub mod grpc;
pub mod injector;
pub mod metadata;
pub mod names;
pub mod overlay;
pub mod patch;
pub mod pod;
pub mod probes;
pub mod proxy_config;
pub mod quantity;
pub mod settings;
pub mod sidecar;
pub mod sidecar_template;
pub mod template;
pub mod validate;
pub mod webhook;
pub mod yaml11;

pub use config::InjectorConfig;
pub use error::InjectError;
pub use injector::{Injector, Outcome, Request};
