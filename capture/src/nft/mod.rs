//! The native nftables backend (`--native-nftables`): the same capture decisions as the
//! iptables path, written as one `nft -f` program over three `inet` tables, as Istio's
//! nftables backend does.
//!
//! [`generate`] turns a [`crate::CaptureConfig`] into an [`NftProgram`]; [`program`] renders
//! it; [`apply`] loads it (or the cleanup program) in one atomic `nft -f -` transaction.

pub mod apply;
pub mod generate;
pub mod program;

pub use generate::generate_nft;
pub use program::{NftProgram, NftTable};
