//! An open-loop HTTP/1.1 load generator: requests leave at a fixed total rate, evenly paced over
//! a set of keep-alive connections, whatever the server does, and every latency is measured from
//! the moment the request was *due*, not the moment it could be sent. A server that stalls for
//! 100 ms therefore shows 100 ms, 91 ms, 82 ms… for the requests queued behind the stall instead
//! of one slow sample (coordinated-omission correction, as in wrk2 and Gil Tene's HdrHistogram).
//!
//! Only the system under test's delays count: when the connection was free but the generator's
//! own timer woke late (tokio's timer has millisecond granularity), that lag is subtracted, so the
//! generator's clock does not add a millisecond floor to a proxy that adds 50 µs.

use bytes::Bytes;
use hdrhistogram::Histogram;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::net::TcpStream;
use tokio::time::Instant;

/// Requests slower than this count as errors (and end the connection).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Highest latency the histograms hold, in nanoseconds.
const HISTOGRAM_MAX_NS: u64 = 60_000_000_000;

/// A fixed-rate run.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    /// Requests per second, over all connections.
    pub rate: f64,
    pub connections: usize,
    /// Sent at the full rate but not recorded.
    pub warmup: Duration,
    /// Recorded.
    pub duration: Duration,
}

/// When one connection's requests are due. Each connection sends every `connections / rate`,
/// connection `k` starting `k / rate` after the others' start, so that together they send
/// evenly every `1 / rate` rather than in bursts of `connections`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Schedule {
    first: Duration,
    interval: Duration,
}

impl Schedule {
    /// The schedule of connection `k` of the plan.
    pub fn for_connection(plan: &Plan, k: usize) -> Schedule {
        let gap = 1.0 / plan.rate;
        Schedule {
            first: Duration::from_secs_f64(gap * k as f64),
            interval: Duration::from_secs_f64(gap * plan.connections as f64),
        }
    }

    /// When request `i` of this connection is due, from the run's start.
    pub fn due(&self, i: u64) -> Duration {
        self.first + self.interval.mul_f64(i as f64)
    }
}

/// The latency to record for one request, all times from the run's start.
///
/// The request could have left at `max(due, previous_done)`: later than `due` only because the
/// server was still busy with the previous request on this connection, and that wait counts.
/// Any further delay until `sent` was the generator's own (a late timer) and does not.
pub fn corrected_latency(
    due: Duration,
    previous_done: Duration,
    sent: Duration,
    done: Duration,
) -> Duration {
    let could_send = due.max(previous_done);
    let generator_lag = sent.saturating_sub(could_send);
    done.saturating_sub(due).saturating_sub(generator_lag)
}

/// What one run measured.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// Corrected latencies of the recorded requests, in nanoseconds.
    pub latency_ns: Histogram<u64>,
    /// Requests answered with a 200 and a full body in the recorded window.
    pub requests: u64,
    /// Requests answered in the whole run, warm-up included.
    pub answered: u64,
    /// Failed requests (errors, timeouts, wrong status) in the whole run.
    pub errors: u64,
    /// The recorded window.
    pub duration: Duration,
    /// The largest generator lag seen (timer lateness); large values mean the generator, not
    /// the proxy, was short of CPU.
    pub max_generator_lag: Duration,
    /// Every recorded request, in the order they were due: when a tail is slow, whether its
    /// slow requests cluster in time or on a connection.
    pub samples: Vec<Sample>,
}

/// One recorded request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    /// When it was due, from the run's start.
    pub due: Duration,
    pub connection: usize,
    /// Corrected latency.
    pub latency: Duration,
}

impl Outcome {
    /// Nothing measured yet, over a recorded window of `duration`.
    fn empty(duration: Duration) -> Outcome {
        Outcome {
            latency_ns: new_histogram(),
            requests: 0,
            answered: 0,
            errors: 0,
            duration,
            max_generator_lag: Duration::ZERO,
            samples: vec![],
        }
    }

    /// Adds the requests of `other`, which covered the same window (another connection of
    /// the same run). Both histograms have the same bounds, so adding cannot fail in practice.
    fn absorb(&mut self, other: &Outcome) -> Result<(), hdrhistogram::AdditionError> {
        self.latency_ns.add(&other.latency_ns)?;
        self.requests += other.requests;
        self.answered += other.answered;
        self.errors += other.errors;
        self.max_generator_lag = self.max_generator_lag.max(other.max_generator_lag);
        self.samples.extend_from_slice(&other.samples);
        Ok(())
    }

    /// The latency at quantile `q` (0.5 for p50) in microseconds.
    pub fn percentile_us(&self, q: f64) -> f64 {
        self.latency_ns.value_at_quantile(q) as f64 / 1000.0
    }

    /// The per cent of recorded requests slower than `threshold`.
    pub fn percent_over(&self, threshold: Duration) -> f64 {
        let total = self.latency_ns.len();
        if total == 0 {
            return 0.0;
        }
        let limit = u64::try_from(threshold.as_nanos()).unwrap_or(u64::MAX);
        let within = self.latency_ns.count_between(0, limit);
        total.saturating_sub(within) as f64 * 100.0 / total as f64
    }

    /// Adds another run's measurements (a later round of the same plan) to these.
    pub fn merge(&mut self, other: &Outcome) {
        let _ = self.absorb(other);
        self.duration += other.duration;
    }

    /// Answered requests per second in the recorded window.
    pub fn achieved_rate(&self) -> f64 {
        self.requests as f64 / self.duration.as_secs_f64()
    }
}

fn new_histogram() -> Histogram<u64> {
    // Bounds are constants that hdrhistogram accepts; this cannot fail.
    Histogram::new_with_bounds(1, HISTOGRAM_MAX_NS, 3).expect("valid histogram bounds")
}

/// Runs `plan` against `GET /` on `addr` (HTTP/1.1, keep-alive). Call it on a runtime of its
/// own: every connection is a task, and the timing is only as good as that runtime's latency.
pub async fn run(addr: SocketAddr, plan: Plan) -> anyhow::Result<Outcome> {
    anyhow::ensure!(
        plan.rate > 0.0 && plan.connections > 0,
        "rate and connections must be positive"
    );
    let mut senders = Vec::with_capacity(plan.connections);
    for _ in 0..plan.connections {
        senders.push(connect(addr).await?);
    }
    let start = Instant::now() + Duration::from_millis(20);
    let tasks: Vec<_> = senders
        .into_iter()
        .enumerate()
        .map(|(k, sender)| {
            tokio::spawn(drive_connection(
                addr,
                sender,
                Schedule::for_connection(&plan, k),
                k,
                start,
                plan,
            ))
        })
        .collect();
    let mut outcome = Outcome::empty(plan.duration);
    for task in tasks {
        outcome.absorb(&task.await?)?;
    }
    outcome.samples.sort_by_key(|s| s.due);
    Ok(outcome)
}

type Sender = hyper::client::conn::http1::SendRequest<Empty<Bytes>>;

async fn connect(addr: SocketAddr) -> anyhow::Result<Sender> {
    let stream = TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(connection);
    Ok(sender)
}

async fn drive_connection(
    addr: SocketAddr,
    sender: Sender,
    schedule: Schedule,
    connection: usize,
    start: Instant,
    plan: Plan,
) -> Outcome {
    let mut outcome = Outcome::empty(plan.duration);
    let end = plan.warmup + plan.duration;
    let mut sender = Some(sender);
    let mut previous_done = Duration::ZERO;
    for i in 0.. {
        let due = schedule.due(i);
        if due >= end {
            break;
        }
        tokio::time::sleep_until(start + due).await;
        if sender.is_none() {
            sender = connect(addr).await.ok();
        }
        let sent = start.elapsed();
        let ok = match sender.as_mut() {
            Some(s) => tokio::time::timeout(REQUEST_TIMEOUT, one_request(s))
                .await
                .unwrap_or(false),
            None => false,
        };
        let done = start.elapsed();
        outcome.max_generator_lag = outcome
            .max_generator_lag
            .max(sent.saturating_sub(due.max(previous_done)));
        if !ok {
            outcome.errors += 1;
            sender = None;
            previous_done = done;
            continue;
        }
        outcome.answered += 1;
        if due >= plan.warmup {
            let latency = corrected_latency(due, previous_done, sent, done);
            outcome
                .latency_ns
                .saturating_record(latency.as_nanos().min(u128::from(HISTOGRAM_MAX_NS)) as u64);
            outcome.requests += 1;
            outcome.samples.push(Sample {
                due,
                connection,
                latency,
            });
        }
        previous_done = done;
    }
    outcome
}

/// One `GET /`; true when it was answered 200 with the full body.
async fn one_request(sender: &mut Sender) -> bool {
    if sender.ready().await.is_err() {
        return false;
    }
    let request = http::Request::get("/")
        .header(http::header::HOST, "bench")
        .body(Empty::<Bytes>::new());
    let Ok(request) = request else { return false };
    let Ok(response) = sender.send_request(request).await else {
        return false;
    };
    let ok = response.status() == http::StatusCode::OK;
    match response.into_body().collect().await {
        Ok(body) => ok && body.to_bytes().len() == crate::upstream::BODY_SIZE,
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: f64) -> Duration {
        Duration::from_secs_f64(v / 1000.0)
    }

    #[test]
    fn the_share_over_a_threshold_counts_only_slower_requests() {
        let mut outcome = Outcome::empty(Duration::from_secs(1));
        assert_eq!(outcome.percent_over(Duration::from_millis(1)), 0.0);
        // 196 requests at 300 µs, one at exactly 1 ms, three stalled for 2–4 ms.
        for ns in
            std::iter::repeat_n(300_000, 196).chain([1_000_000, 2_000_000, 3_000_000, 4_000_000])
        {
            outcome
                .latency_ns
                .record(ns)
                .expect("within the histogram's bounds");
        }
        assert!((outcome.percent_over(Duration::from_millis(1)) - 1.5).abs() < 1e-9);
        assert_eq!(outcome.percent_over(Duration::from_millis(5)), 0.0);
        assert!((outcome.percent_over(Duration::from_micros(100)) - 100.0).abs() < 1e-9);
    }

    #[test]
    fn connections_together_send_evenly() {
        let plan = Plan {
            rate: 1000.0,
            connections: 16,
            warmup: Duration::ZERO,
            duration: Duration::from_secs(1),
        };
        let mut due: Vec<Duration> = (0..16)
            .flat_map(|k| {
                let s = Schedule::for_connection(&plan, k);
                (0..10).map(move |i| s.due(i))
            })
            .collect();
        due.sort();
        assert_eq!(due.len(), 160);
        for (n, d) in due.iter().enumerate() {
            let expected = ms(n as f64);
            let error = d.abs_diff(expected);
            assert!(
                error < Duration::from_nanos(10),
                "request {n} due at {d:?}, expected {expected:?}"
            );
        }
        // Each connection on its own sends every 16 ms.
        let s = Schedule::for_connection(&plan, 3);
        assert!(s.due(1).abs_diff(s.due(0) + ms(16.0)) < Duration::from_nanos(10));
    }

    /// One connection at 100 rps against a server that answers in 1 ms except for one 100 ms
    /// stall: what a closed-loop generator and this one record.
    fn simulate(timer_lag: Duration) -> (Vec<Duration>, Vec<Duration>) {
        let plan = Plan {
            rate: 100.0,
            connections: 1,
            warmup: Duration::ZERO,
            duration: Duration::from_secs(1),
        };
        let schedule = Schedule::for_connection(&plan, 0);
        let (mut corrected, mut naive) = (vec![], vec![]);
        let mut previous_done = Duration::ZERO;
        for i in 0..100 {
            let due = schedule.due(i);
            // The generator sends when due (plus its own timer lag) or, if the previous answer
            // is late, the moment it arrives.
            let sent = (due + timer_lag).max(previous_done);
            let service = if i == 10 { ms(100.0) } else { ms(1.0) };
            let done = sent + service;
            corrected.push(corrected_latency(due, previous_done, sent, done));
            naive.push(done - sent);
            previous_done = done;
        }
        (corrected, naive)
    }

    #[test]
    fn a_stall_shows_in_every_request_queued_behind_it() {
        let (corrected, naive) = simulate(Duration::ZERO);
        let slow = |v: &[Duration]| v.iter().filter(|l| **l > ms(50.0)).count();
        assert_eq!(slow(&naive), 1, "a closed-loop view hides the queue");
        // 100, 91, 82, 73, 64, 55 ms: the requests that were due during the stall.
        assert_eq!(slow(&corrected), 6);
        assert_eq!(corrected[10], ms(100.0));
        assert!(corrected[11].abs_diff(ms(91.0)) < Duration::from_micros(1));
        assert!(
            corrected[30].abs_diff(ms(1.0)) < Duration::from_micros(1),
            "caught up again"
        );
    }

    #[test]
    fn the_generators_own_timer_lag_is_not_counted() {
        let (corrected, _) = simulate(ms(0.9));
        assert!(
            corrected[0].abs_diff(ms(1.0)) < Duration::from_micros(1),
            "{:?}",
            corrected[0]
        );
        // The stall still counts in full, from when each request was due. (The queue behind it
        // carries the one late tick of the request that stalled: 91.9 ms, not 91.)
        assert!(corrected[10].abs_diff(ms(100.0)) < Duration::from_micros(1));
        assert!(
            corrected[11].abs_diff(ms(91.9)) < Duration::from_micros(1),
            "{:?}",
            corrected[11]
        );
    }

    #[tokio::test]
    async fn runs_at_the_planned_rate_against_a_real_server() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(crate::upstream::serve(listener));
        let plan = Plan {
            rate: 200.0,
            connections: 4,
            warmup: ms(100.0),
            duration: ms(500.0),
        };
        let outcome = run(addr, plan).await.unwrap();
        assert_eq!(outcome.errors, 0);
        assert!(
            (95..=105).contains(&outcome.requests),
            "{} requests",
            outcome.requests
        );
        assert!(outcome.percentile_us(0.5) > 0.0);
        assert!(outcome.percentile_us(0.999) < 1_000_000.0);
        // One sample per recorded request, in due order, from every connection, after the
        // warm-up.
        assert_eq!(outcome.samples.len() as u64, outcome.requests);
        assert!(outcome.samples.windows(2).all(|w| w[0].due <= w[1].due));
        assert!((0..4).all(|k| outcome.samples.iter().any(|s| s.connection == k)));
        assert!(outcome.samples.iter().all(|s| s.due >= plan.warmup));
        let mut merged = outcome.clone();
        merged.merge(&outcome);
        assert_eq!(merged.requests, 2 * outcome.requests);
        assert_eq!(merged.duration, 2 * outcome.duration);
        assert_eq!(merged.latency_ns.len(), 2 * outcome.latency_ns.len());
        assert_eq!(merged.samples.len(), 2 * outcome.samples.len());
        assert!((merged.achieved_rate() - outcome.achieved_rate()).abs() < 1e-9);
    }
}
