//! What waking a thread across the cores costs on this machine, with no proxy involved: a thread
//! on the proxy's core sleeps in `read`, and a thread on the load core sends it messages at a
//! fixed spacing, as a proxy at a fixed request rate is woken by requests and answers.
//!
//! Two figures come of it. The sleeper's CPU time per wake-up, when it answers each message
//! and so wakes its peer as a proxy wakes the next hop, is the floor under any proxy's CPU per
//! wake-up here: a few microseconds on bare metal, many times that on some VMs (30–43 µs on the
//! one this was built on, whether its idle cores halted or polled). And the
//! time from a message's send to its having been read is one hop's latency: a proxied request
//! makes four hops between the cores where the no-proxy baseline makes none, so the rare hops
//! that stall for milliseconds (most likely a vCPU the host did not run at once) land in every
//! proxy's tail.

use crate::process::{own_thread_clock, pin_self};
use serde::Serialize;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

/// The sleeping thread's CPU time per time it was put on a CPU.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct WakeCost {
    pub cpu_us_per_wake_up: f64,
    /// Wake-ups per message; above 1 when something else also woke the thread.
    pub wake_ups_per_message: f64,
}

/// How long a message took from the load core's `write` to the proxy core's thread having read
/// it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct HopLatency {
    pub hops: usize,
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub max_us: f64,
    /// The per cent of hops that took over [`STALLED_HOP`].
    pub stalled_percent: f64,
}

/// A hop slower than this is a stall of the machine's, not a proxy's work: a whole request
/// through a proxy takes a few hundred µs here.
pub const STALLED_HOP: Duration = Duration::from_millis(1);

impl HopLatency {
    /// Summarizes hop times in nanoseconds (nearest-rank percentiles); `None` for none.
    pub fn of(mut hops_ns: Vec<u64>) -> Option<Self> {
        hops_ns.sort_unstable();
        let n = hops_ns.len();
        let at = |q: f64| {
            let rank = ((q * n as f64).ceil() as usize).clamp(1, n);
            hops_ns[rank - 1] as f64 / 1000.0
        };
        let stalled = hops_ns
            .iter()
            .filter(|&&ns| u128::from(ns) > STALLED_HOP.as_nanos())
            .count();
        (n > 0).then(|| HopLatency {
            hops: n,
            p50_us: at(0.5),
            p99_us: at(0.99),
            p999_us: at(0.999),
            max_us: at(1.0),
            stalled_percent: stalled as f64 * 100.0 / n as f64,
        })
    }
}

/// The machine probe's two figures.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Probe {
    pub cost: WakeCost,
    pub hop: HopLatency,
}

/// How long either side waits for the other before the probe gives up.
const STALL: Duration = Duration::from_secs(2);

/// The spacing of the machine probe's messages: a proxy at the latency scenario's 1000 rps
/// has an event (a request or an answer) about every 500 µs.
pub const GAP: Duration = Duration::from_micros(500);

/// The machine probe, about seven seconds: three batches of 1,000 exchanges [`GAP`] apart, of
/// which the batch with the median CPU per wake-up gives the cost; then 10,000 one-way hops
/// [`GAP`] apart for the latency, as its stalls are a few in a thousand.
pub fn probe(sleeper_core: usize, waker_core: usize) -> Option<Probe> {
    let mut batches: Vec<WakeCost> = (0..3)
        .filter_map(|_| measure(sleeper_core, waker_core, 1000, GAP))
        .collect();
    batches.sort_by(|a, b| a.cpu_us_per_wake_up.total_cmp(&b.cpu_us_per_wake_up));
    let cost = *batches.get(batches.len() / 2)?;
    let hop = HopLatency::of(hops(sleeper_core, waker_core, 10_000, GAP)?)?;
    Some(Probe { cost, hop })
}

/// A connected pair of loopback TCP sockets, as a proxy's hops are (a Unix stream socket
/// wakes its reader twice per message), with Nagle off and every wait bounded.
fn pair() -> Option<(TcpStream, TcpStream)> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).ok()?;
    let waker_end = TcpStream::connect(listener.local_addr().ok()?).ok()?;
    let (sleeper_end, _) = listener.accept().ok()?;
    for end in [&sleeper_end, &waker_end] {
        end.set_nodelay(true).ok()?;
        end.set_read_timeout(Some(STALL)).ok()?;
        end.set_write_timeout(Some(STALL)).ok()?;
    }
    Some((sleeper_end, waker_end))
}

/// Runs `messages` one-byte exchanges `gap` apart, the sleeper pinned to `sleeper_core` and the
/// waker to `waker_core`; the sleeper answers each, waking the waker as a proxy wakes its next
/// hop. `None` when the threads cannot be pinned, schedstat is missing or a side stalls.
pub fn measure(
    sleeper_core: usize,
    waker_core: usize,
    messages: u32,
    gap: Duration,
) -> Option<WakeCost> {
    let (mut sleeper_end, mut waker_end) = pair()?;
    let sleeper = std::thread::spawn(move || -> Option<(u64, u64)> {
        pin_self(sleeper_core).ok()?;
        let mut byte = [0u8; 1];
        // The first exchange moves the thread onto its core; count from after it.
        sleeper_end.read_exact(&mut byte).ok()?;
        sleeper_end.write_all(&byte).ok()?;
        let before = own_thread_clock()?;
        for _ in 0..messages {
            sleeper_end.read_exact(&mut byte).ok()?;
            sleeper_end.write_all(&byte).ok()?;
        }
        let after = own_thread_clock()?;
        Some((
            after.0.saturating_sub(before.0),
            after.1.saturating_sub(before.1),
        ))
    });
    let waker = std::thread::spawn(move || -> Option<()> {
        pin_self(waker_core).ok()?;
        let mut byte = [7u8; 1];
        for _ in 0..=messages {
            std::thread::sleep(gap);
            waker_end.write_all(&byte).ok()?;
            waker_end.read_exact(&mut byte).ok()?;
        }
        Some(())
    });
    let waked = waker.join().ok().flatten();
    let (on_cpu_ns, slices) = sleeper.join().ok().flatten()?;
    waked?;
    (slices > 0 && messages > 0).then(|| WakeCost {
        cpu_us_per_wake_up: on_cpu_ns as f64 / 1000.0 / slices as f64,
        wake_ups_per_message: slices as f64 / f64::from(messages),
    })
}

/// Sends `messages` timestamps `gap` apart from a thread on `waker_core` to one sleeping in
/// `read` on `sleeper_core`, and gives each one's time from before its `write` to after its
/// `read`, in nanoseconds. The sender waits for nothing but its timer, as a load generator's
/// request or a proxy's forward does not wait for the answer: on the VM this was built on, a
/// ping-pong, whose sender sleeps in `read` instead, stalled several times less often.
pub fn hops(
    sleeper_core: usize,
    waker_core: usize,
    messages: u32,
    gap: Duration,
) -> Option<Vec<u64>> {
    let (mut sleeper_end, mut waker_end) = pair()?;
    // Nanoseconds from a shared origin: the monotonic clock is the same on every core.
    let origin = Instant::now();
    let since_origin = move || u64::try_from(origin.elapsed().as_nanos()).unwrap_or(u64::MAX);
    let sleeper = std::thread::spawn(move || -> Option<Vec<u64>> {
        pin_self(sleeper_core).ok()?;
        let mut message = [0u8; 8];
        let mut hops = Vec::with_capacity(messages as usize);
        // The first message moves the thread onto its core; time from after it.
        sleeper_end.read_exact(&mut message).ok()?;
        for _ in 0..messages {
            sleeper_end.read_exact(&mut message).ok()?;
            hops.push(since_origin().saturating_sub(u64::from_le_bytes(message)));
        }
        Some(hops)
    });
    let waker = std::thread::spawn(move || -> Option<()> {
        pin_self(waker_core).ok()?;
        for _ in 0..=messages {
            std::thread::sleep(gap);
            waker_end.write_all(&since_origin().to_le_bytes()).ok()?;
        }
        Some(())
    });
    let sent = waker.join().ok().flatten();
    let hops = sleeper.join().ok().flatten()?;
    sent?;
    Some(hops)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two cores this test may pin to, or one twice where only one is allowed.
    fn two_cores() -> (usize, usize) {
        let allowed = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0))
            .expect("this thread's affinity");
        let cores: Vec<usize> = (0..nix::sched::CpuSet::count())
            .filter(|&c| allowed.is_set(c).unwrap_or(false))
            .take(2)
            .collect();
        match cores[..] {
            [a, b] => (a, b),
            [a] => (a, a),
            _ => panic!("no core in this thread's affinity mask"),
        }
    }

    #[test]
    fn a_sleeping_thread_is_woken_once_per_message_and_pays_for_it() {
        let (sleeper, waker) = two_cores();
        let cost = measure(sleeper, waker, 50, Duration::from_micros(200)).expect("the probe runs");
        assert!(cost.cpu_us_per_wake_up > 0.0);
        // Each message wakes the sleeper once. On one shared core the answer also hands the
        // core to the waker, which puts the sleeper back on it once more.
        // A message that lands while the sleeper is still running (a loaded machine) wakes
        // nothing, so a few in fifty may cost none.
        let most = if sleeper == waker { 2.5 } else { 1.5 };
        assert!(
            (0.9..most).contains(&cost.wake_ups_per_message),
            "{cost:?} on cores {sleeper} and {waker}"
        );
    }

    #[test]
    fn every_hop_is_timed_from_before_its_write() {
        let (sleeper, waker) = two_cores();
        let hops = hops(sleeper, waker, 20, Duration::from_micros(200)).expect("the probe runs");
        assert_eq!(hops.len(), 20);
        // A write, the loopback stack and a read lie between the two clock readings.
        assert!(hops.iter().all(|&ns| ns > 0), "{hops:?}");
        // Sent 200 µs apart and read at once: none waits out the stall timeout.
        assert!(hops.iter().all(|&ns| ns < 2_000_000_000), "{hops:?}");
    }

    #[test]
    fn hop_latency_takes_nearest_rank_percentiles_and_counts_the_stalls() {
        // 1..=1000 µs, then two hops over a millisecond.
        let mut hops: Vec<u64> = (1..=1000).map(|us| us * 1000).collect();
        hops.extend([1_500_000, 4_000_000]);
        hops.reverse();
        let hop = HopLatency::of(hops).expect("hops");
        assert_eq!(hop.hops, 1002);
        assert_eq!(hop.p50_us, 501.0);
        assert_eq!(hop.p99_us, 992.0);
        assert_eq!(hop.p999_us, 1500.0);
        assert_eq!(hop.max_us, 4000.0);
        // Exactly 1 ms is not a stall; the two above it are.
        assert!((hop.stalled_percent - 200.0 / 1002.0).abs() < 1e-9);
        assert_eq!(HopLatency::of(vec![]), None);
    }
}
