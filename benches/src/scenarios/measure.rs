//! What a piece of load costs a contender: its CPU time and peak memory, sampled from `/proc`
//! while the load runs, and how busy each core was.

use super::{Bench, Contender};
use crate::cores;
use crate::process::{self, LOAD_CPU, PROXY_CPU};
use crate::report::Column;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often memory is sampled during a load run.
const RSS_SAMPLE_INTERVAL: Duration = Duration::from_millis(250);

/// What a piece of load cost: the proxy's CPU time and peak memory (`None` for no proxy) and
/// how busy each core was, which tells who the bottleneck was.
#[derive(Debug, Clone, Copy)]
pub struct Cost {
    pub cpu_seconds: Option<f64>,
    /// Times the proxy's threads were put on a CPU: its wake-ups, for a proxy that sleeps
    /// between events.
    pub slices: Option<u64>,
    pub max_rss_kib: Option<u64>,
    /// Wall-clock length of the load.
    pub seconds: f64,
    pub proxy_core_busy: Option<f64>,
    pub load_core_busy: Option<f64>,
    /// The share of each core the hypervisor gave to something else while the load ran.
    pub proxy_core_stolen: Option<f64>,
    pub load_core_stolen: Option<f64>,
}

/// The share of a core's time (of the whole measurement, as the stolen columns give it) the
/// hypervisor may take from a 1000 rps measurement before it is taken again: at that rate a proxy sleeps between requests, and a core handed to
/// another tenant for milliseconds puts its stall straight into the tail (a round that lost a
/// third of its core added 16 ms at p99 where the quiet rounds added under 3).
pub const STEAL_LIMIT: f64 = 0.10;
/// How many times one such measurement is taken again, at most.
pub const STEAL_RETRIES: usize = 2;

/// Note for a row whose measurements were taken again ([`measure_quietly`]).
pub fn repeated_note(repeated: usize) -> Option<String> {
    (repeated > 0).then(|| {
        format!(
            "{repeated} measurement(s) taken again: the hypervisor took over {:.0}% of a core",
            STEAL_LIMIT * 100.0
        )
    })
}

/// Runs `measure` (each call with a freshly started contender) until the hypervisor took no
/// more than [`STEAL_LIMIT`] of either core, taking it again up to [`STEAL_RETRIES`] times, the
/// same for every contender. Returns the last result and how many were taken again.
pub fn measure_quietly<T, E>(
    label: &str,
    mut measure: impl FnMut() -> Result<(T, Cost), E>,
) -> (Result<(T, Cost), E>, usize) {
    let mut repeated = 0;
    loop {
        let result = measure();
        let stolen = match &result {
            Ok((_, cost)) => cost.stolen(),
            Err(_) => None,
        };
        match stolen {
            Some(share) if share > STEAL_LIMIT && repeated < STEAL_RETRIES => {
                eprintln!(
                    "  {label}: the hypervisor took {:.1}% of a core; measuring again",
                    share * 100.0
                );
                repeated += 1;
            }
            _ => return (result, repeated),
        }
    }
}

/// How to read the core columns ([`core_columns`]).
pub const CORES_NOTE: &str = "Core busy % and stolen % are from /proc/stat. Busy includes kernel and softirq time (loopback TCP is processed there): a load core near 100% means the load generator and upstream, not the proxy, set the limit; a proxy core busy without a proxy means other work on the machine. Stolen is time the core had work but the hypervisor ran something else (steal): it slows whatever was on that core, and a round with much of it is a noisy round.";

/// The columns [`Cost::core_figures`] fills.
pub fn core_columns() -> [Column; 4] {
    [
        Column::new("proxy core busy", "%", 0),
        Column::new("load core busy", "%", 0),
        Column::new("proxy core stolen", "%", 1),
        Column::new("load core stolen", "%", 1),
    ]
}

impl Cost {
    /// Cores' worth of CPU the proxy used.
    pub fn proxy_cores(&self) -> Option<f64> {
        self.cpu_seconds.map(|c| c / self.seconds)
    }

    /// The larger of the two cores' stolen shares, where known.
    pub fn stolen(&self) -> Option<f64> {
        match (self.proxy_core_stolen, self.load_core_stolen) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        }
    }

    /// Busy and stolen shares of both cores, in per cent, in [`core_columns`]' order.
    pub fn core_figures(&self) -> [Option<f64>; 4] {
        [
            self.proxy_core_busy,
            self.load_core_busy,
            self.proxy_core_stolen,
            self.load_core_stolen,
        ]
        .map(|share| share.map(|s| s * 100.0))
    }
}

impl Bench {
    /// Runs `load` while sampling what it costs `contender` and how busy both cores are.
    pub fn measure<T>(&self, contender: &Contender, load: impl FnOnce() -> T) -> (T, Cost) {
        self.measure_after(contender, Duration::ZERO, load)
    }

    /// As [`Bench::measure`], with the proxy's CPU time counted only from `warmup` into the
    /// load: an open-loop run's warm-up opens its connections and wakes whatever a proxy
    /// initialises lazily, which is not the cost of a request in the steady state.
    pub fn measure_after<T>(
        &self,
        contender: &Contender,
        warmup: Duration,
        load: impl FnOnce() -> T,
    ) -> (T, Cost) {
        let pid = contender.pid();
        let cores_before = cores::core_times();
        let before = pid.map(process::tree_usage);
        let stop = Arc::new(AtomicBool::new(false));
        let sampler = pid.map(|pid| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let started = Instant::now();
                let mut max = 0;
                let mut warm: Option<process::Usage> = None;
                while !stop.load(Ordering::Relaxed) {
                    let usage = process::tree_usage(pid);
                    max = max.max(usage.rss_kib);
                    let elapsed = started.elapsed();
                    if warm.is_none() && elapsed >= warmup && !warmup.is_zero() {
                        warm = Some(usage);
                    }
                    // Wake at the end of the warm-up, not up to an interval after it.
                    let next = match warm {
                        None if !warmup.is_zero() => (warmup.saturating_sub(elapsed))
                            .clamp(Duration::from_millis(1), RSS_SAMPLE_INTERVAL),
                        _ => RSS_SAMPLE_INTERVAL,
                    };
                    std::thread::sleep(next);
                }
                (max, warm)
            })
        });
        let started = Instant::now();
        let result = load();
        let seconds = started.elapsed().as_secs_f64();
        let after = pid.map(process::tree_usage);
        let cores_after = cores::core_times();
        stop.store(true, Ordering::Relaxed);
        let (sampled_max, warm) = match sampler.map(|s| s.join().unwrap_or_default()) {
            Some((max, warm)) => (Some(max), warm),
            None => (None, None),
        };
        // Counted from the end of the warm-up when the load lasted past it.
        let (before, seconds) = match warm {
            Some(w) => (Some(w), (seconds - warmup.as_secs_f64()).max(f64::EPSILON)),
            None => (before, seconds),
        };
        let (proxy_core, load_core) = if self.settings.pin {
            (PROXY_CPU, LOAD_CPU)
        } else {
            (usize::MAX, usize::MAX)
        };
        let cost = Cost {
            cpu_seconds: before
                .as_ref()
                .zip(after.as_ref())
                .map(|(b, a)| a.cpu_seconds_since(b)),
            slices: before
                .as_ref()
                .zip(after.as_ref())
                .and_then(|(b, a)| a.slices_since(b)),
            max_rss_kib: after.map(|a| a.rss_kib.max(sampled_max.unwrap_or(0))),
            seconds,
            proxy_core_busy: cores::core_busy(&cores_before, &cores_after, proxy_core),
            load_core_busy: cores::core_busy(&cores_before, &cores_after, load_core),
            proxy_core_stolen: cores::core_stolen(&cores_before, &cores_after, proxy_core),
            load_core_stolen: cores::core_stolen(&cores_before, &cores_after, load_core),
        };
        (result, cost)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cost(proxy_core_stolen: f64, load_core_stolen: f64) -> Cost {
        Cost {
            cpu_seconds: None,
            slices: None,
            max_rss_kib: None,
            seconds: 1.0,
            proxy_core_busy: None,
            load_core_busy: None,
            proxy_core_stolen: Some(proxy_core_stolen),
            load_core_stolen: Some(load_core_stolen),
        }
    }

    /// `measure_quietly` over measurements whose steal is `stolen`, in turn; what it returned
    /// (the measurement's number), how many it took again, and how many it took.
    fn quietly(stolen: &[(f64, f64)]) -> (Result<usize, String>, usize, usize) {
        let mut taken = 0;
        let (result, again) = measure_quietly("t", || {
            let (p, l) = stolen[taken];
            taken += 1;
            Ok::<_, String>((taken, cost(p, l)))
        });
        (result.map(|(n, _)| n), again, taken)
    }

    #[test]
    fn a_measurement_that_lost_a_core_to_the_hypervisor_is_taken_again_a_bounded_number_of_times() {
        // Quiet at once: taken once.
        assert_eq!(quietly(&[(0.02, 0.0)]), (Ok(1), 0, 1));
        // Either core over the limit counts; the first quiet one is kept.
        assert_eq!(
            quietly(&[(0.0, 0.3), (0.2, 0.0), (0.05, 0.05)]),
            (Ok(3), 2, 3)
        );
        // Never quiet: the last allowed measurement is kept, noisy as it is.
        let noisy = [(0.4, 0.4); 5];
        assert_eq!(
            quietly(&noisy),
            (Ok(1 + STEAL_RETRIES), STEAL_RETRIES, 1 + STEAL_RETRIES)
        );
        // A failed measurement is not retried for steal.
        let (result, again) = measure_quietly("t", || Err::<((), Cost), _>("refused"));
        assert_eq!((result.err(), again), (Some("refused"), 0));
        assert_eq!(repeated_note(0), None);
        assert!(repeated_note(2).is_some_and(|n| n.contains("over 10%")));
    }
}
