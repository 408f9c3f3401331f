//! Process metrics (`process_*`), read from the kernel at scrape time, named as the Prometheus
//! client libraries name them so existing dashboards find them.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use std::time::{SystemTime, UNIX_EPOCH};

/// Reads `/proc/self` and `getrusage` on each scrape.
#[derive(Debug)]
pub struct ProcessCollector {
    start_time: f64,
}

impl ProcessCollector {
    /// A collector whose start time is now.
    pub fn new() -> Self {
        ProcessCollector {
            start_time: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_secs_f64())
                .unwrap_or(0.0),
        }
    }
}

impl Default for ProcessCollector {
    fn default() -> Self {
        Self::new()
    }
}

/// The values of one scrape; `None` where the kernel would not say.
#[derive(Debug, Default, PartialEq)]
pub struct Sample {
    pub cpu_seconds: Option<f64>,
    pub resident_bytes: Option<i64>,
    pub virtual_bytes: Option<i64>,
    pub open_fds: Option<i64>,
    pub max_fds: Option<i64>,
}

/// The byte count `/proc/self/status` gives for `key` (`VmRSS:`; the kernel writes kB).
fn status_bytes(status: &str, key: &str) -> Option<i64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse::<i64>().ok())
        .map(|n| n * 1024)
}

/// Read the current values.
pub fn sample() -> Sample {
    use nix::sys::resource::{getrusage, UsageWho};
    let cpu_seconds = getrusage(UsageWho::RUSAGE_SELF).ok().map(|u| {
        let t = |tv: nix::sys::time::TimeVal| tv.tv_sec() as f64 + tv.tv_usec() as f64 / 1e6;
        t(u.user_time()) + t(u.system_time())
    });
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kib = |key: &str| status_bytes(&status, key);
    let open_fds = std::fs::read_dir("/proc/self/fd")
        .ok()
        .map(|d| d.count() as i64);
    let max_fds = rlimit::getrlimit(rlimit::Resource::NOFILE)
        .ok()
        .map(|(soft, _)| i64::try_from(soft).unwrap_or(i64::MAX));
    Sample {
        cpu_seconds,
        resident_bytes: kib("VmRSS:"),
        virtual_bytes: kib("VmSize:"),
        open_fds,
        max_fds,
    }
}

/// Envoy's `server.memory_*` gauges: the C allocator's bytes in use and taken from the system
/// (Envoy reads tcmalloc's), and the physical memory they stand on, estimated as the process's
/// anonymous resident memory, at most the heap's size (glibc does not count the free pages it
/// gave back). Absent where the allocator is not glibc's.
pub fn envoy_memory() -> Vec<(&'static str, u64)> {
    let Some(heap) = remora_malloc::heap_stats() else {
        return Vec::new();
    };
    // Only the status file: the rest of a process sample (file descriptors, rusage) is not
    // needed here.
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let resident = status_bytes(&status, "RssAnon:")
        .and_then(|b| u64::try_from(b).ok())
        .unwrap_or(heap.heap_size);
    vec![
        ("memory_allocated", heap.allocated),
        ("memory_heap_size", heap.heap_size),
        ("memory_physical_size", resident.min(heap.heap_size)),
    ]
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let s = sample();
        if let Some(v) = s.cpu_seconds {
            let c = ConstCounter::new(v);
            let m = encoder.encode_descriptor(
                "process_cpu_seconds",
                "Total user and system CPU time spent in seconds",
                None,
                c.metric_type(),
            )?;
            c.encode(m)?;
        }
        let gauges = [
            (
                "process_resident_memory_bytes",
                "Resident memory size in bytes",
                s.resident_bytes,
            ),
            (
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes",
                s.virtual_bytes,
            ),
            (
                "process_open_fds",
                "Number of open file descriptors",
                s.open_fds,
            ),
            (
                "process_max_fds",
                "Maximum number of open file descriptors",
                s.max_fds,
            ),
        ];
        for (name, help, value) in gauges {
            if let Some(v) = value {
                let g = ConstGauge::new(v);
                let m = encoder.encode_descriptor(name, help, None, g.metric_type())?;
                g.encode(m)?;
            }
        }
        let g = ConstGauge::new(self.start_time);
        let m = encoder.encode_descriptor(
            "process_start_time_seconds",
            "Start time of the process since unix epoch in seconds",
            None,
            g.metric_type(),
        )?;
        g.encode(m)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    /// Envoy's three names, the heap in use within the heap taken, on the heap's pages.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn envoys_memory_gauges_read_the_allocator() {
        let memory = super::envoy_memory();
        let names: Vec<&str> = memory.iter().map(|(n, _)| *n).collect();
        assert_eq!(
            names,
            [
                "memory_allocated",
                "memory_heap_size",
                "memory_physical_size"
            ]
        );
        let [(_, allocated), (_, heap), (_, physical)] = memory[..] else {
            panic!("{memory:?}");
        };
        assert!(0 < allocated && allocated <= heap, "{memory:?}");
        assert!(0 < physical && physical <= heap, "{memory:?}");
    }

    use super::*;

    #[test]
    fn sample_reads_real_values() {
        let s = sample();
        assert!(s.resident_bytes.is_some_and(|v| v > 0), "{s:?}");
        assert!(s.open_fds.is_some_and(|v| v >= 3), "{s:?}");
        assert!(s.cpu_seconds.is_some(), "{s:?}");
    }
}
