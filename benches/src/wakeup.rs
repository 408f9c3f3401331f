//! What one wake-up costs on this machine, with no proxy involved: a thread on the proxy's core
//! sleeps in `read`, a thread on the load core sends it one byte at a fixed spacing, and it
//! answers with one byte, as a proxy at a fixed request rate is woken by a request and wakes
//! the next hop. Its CPU time per wake-up is the floor under any proxy's CPU per wake-up here:
//! typically a few microseconds on bare metal, many times that on a VM whose idle cores halt
//! (the wake of a halted core and the interrupt that wakes the peer both go through the
//! hypervisor).

use crate::process::{own_thread_clock, pin_self};
use serde::Serialize;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::time::Duration;

/// The probe's result: the sleeping thread's CPU time per time it was put on a CPU.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct WakeCost {
    pub cpu_us_per_wake_up: f64,
    /// Wake-ups per message; above 1 when something else also woke the thread.
    pub wake_ups_per_message: f64,
}

/// How long either side waits for the other before the probe gives up.
const STALL: Duration = Duration::from_secs(2);

/// The spacing of the machine probe's messages: a proxy at the latency scenario's 1000 rps
/// has an event (a request or an answer) about every 500 µs.
pub const GAP: Duration = Duration::from_micros(500);

/// The machine probe: three batches of 1,000 messages [`GAP`] apart, and the batch with the
/// median CPU per wake-up (about two seconds in all).
pub fn probe(sleeper_core: usize, waker_core: usize) -> Option<WakeCost> {
    let mut batches: Vec<WakeCost> = (0..3)
        .filter_map(|_| measure(sleeper_core, waker_core, 1000, GAP))
        .collect();
    batches.sort_by(|a, b| a.cpu_us_per_wake_up.total_cmp(&b.cpu_us_per_wake_up));
    batches.get(batches.len() / 2).copied()
}

/// Runs `messages` one-byte exchanges `gap` apart, the sleeper pinned to `sleeper_core` and the
/// waker to `waker_core`. `None` when the threads cannot be pinned, schedstat is missing or a
/// side stalls.
pub fn measure(
    sleeper_core: usize,
    waker_core: usize,
    messages: u32,
    gap: Duration,
) -> Option<WakeCost> {
    // Loopback TCP, as a proxy's hops are (a Unix stream socket wakes its reader twice per
    // message).
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).ok()?;
    let mut waker_end = TcpStream::connect(listener.local_addr().ok()?).ok()?;
    let (mut sleeper_end, _) = listener.accept().ok()?;
    for end in [&sleeper_end, &waker_end] {
        end.set_nodelay(true).ok()?;
        end.set_read_timeout(Some(STALL)).ok()?;
        end.set_write_timeout(Some(STALL)).ok()?;
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sleeping_thread_is_woken_once_per_message_and_pays_for_it() {
        let allowed = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0))
            .expect("this thread's affinity");
        let cores: Vec<usize> = (0..nix::sched::CpuSet::count())
            .filter(|&c| allowed.is_set(c).unwrap_or(false))
            .take(2)
            .collect();
        let (sleeper, waker) = match cores[..] {
            [a, b] => (a, b),
            [a] => (a, a),
            _ => panic!("no core in this thread's affinity mask"),
        };
        let cost = measure(sleeper, waker, 50, Duration::from_micros(200)).expect("the probe runs");
        assert!(cost.cpu_us_per_wake_up > 0.0);
        // Each message wakes the sleeper once. On one shared core the answer also hands the
        // core to the waker, which puts the sleeper back on it once more.
        let most = if sleeper == waker { 2.5 } else { 1.5 };
        assert!(
            (1.0..most).contains(&cost.wake_ups_per_message),
            "{cost:?} on cores {sleeper} and {waker}"
        );
    }
}
