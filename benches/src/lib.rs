//! Remora's benchmarks. The criterion micro-benchmarks live in `benches/`; this library is the
//! load harness (`src/bin/harness.rs`) that runs the same scenarios, on loopback, against no
//! proxy, Remora, Envoy, HAProxy and nginx, and prints tables of absolute numbers and ratios.
//!
//! How the parts fit: [`proxy_config`] writes each proxy's configuration (and [`mesh_certs`] the mTLS scenario's
//! identities) (pure functions, so
//! tests check them without launching anything); [`process`] starts programs pinned to a core,
//! reads their CPU time and memory from `/proc`, and kills them by PID; [`cores`] reads how busy
//! each core was and how much of it the hypervisor took; [`upstream`] is the
//! server every proxy forwards to (1 KiB responses over HTTP/1.1, h2c and gRPC); [`floor`] is
//! the least a proxy can do (an epoll loop that relays bytes), a reference row; [`open_loop`]
//! is the fixed-rate load generator with coordinated-omission correction; [`tcp_load`] opens
//! connections as fast as it can or holds many idle; [`load_tools`] drives and parses wrk,
//! h2load and iperf3; [`scenarios`] puts these together per scenario (interleaved rounds,
//! reduced to medians with their spread), [`report`] renders the tables and their ratio
//! matrices as markdown and JSON, and [`targets`] judges the targets from them.
//! [`xds_scale`] writes istiod-shaped xDS resources for N services (the config-scale scenario);
//! [`route_scale`] the large route table and cluster of the traffic micro-benchmarks.

pub mod cores;
pub mod floor;
pub mod load_tools;
pub mod mesh_certs;
pub mod open_loop;
pub mod process;
pub mod proxy_config;
pub mod report;
pub mod route_scale;
pub mod scenarios;
pub mod targets;
pub mod tcp_load;
pub mod upstream;
pub mod wakeup;
pub mod xds_scale;
