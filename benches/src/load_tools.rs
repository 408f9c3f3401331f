//! The native load generators the throughput scenarios use (wrk for HTTP/1.1, h2load for h2c
//! and gRPC, iperf3 for bulk TCP): their command lines and the parsing of what they print.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

/// What wrk or h2load measured.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct HttpLoad {
    pub requests_per_second: f64,
    /// Successful (2xx) requests.
    pub requests: u64,
    /// Failed requests: errors, timeouts, non-2xx answers.
    pub errors: u64,
    pub mean_us: Option<f64>,
    /// wrk only (with `--latency`).
    pub p50_us: Option<f64>,
    pub p99_us: Option<f64>,
}

/// wrk: one thread, `connections` keep-alive connections, for `duration`.
pub fn wrk_args(target: SocketAddr, connections: usize, duration: Duration) -> Vec<String> {
    vec![
        "-t1".into(),
        format!("-c{connections}"),
        format!("-d{}s", duration.as_secs().max(1)),
        "--latency".into(),
        format!("http://{target}/"),
    ]
}

/// wrk as [`wrk_args`], but every request asks to close its connection (`Connection: close`),
/// so each one opens a new connection.
pub fn wrk_close_args(target: SocketAddr, connections: usize, duration: Duration) -> Vec<String> {
    let mut args = vec!["-H".into(), "Connection: close".into()];
    args.extend(wrk_args(target, connections, duration));
    args
}

/// Parses wrk's report.
pub fn parse_wrk(text: &str) -> Option<HttpLoad> {
    let mut load = HttpLoad::default();
    let mut total = None;
    let mut non_2xx = 0;
    for line in text.lines().map(str::trim) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if let Some(rest) = line.strip_prefix("Requests/sec:") {
            load.requests_per_second = rest.trim().parse().ok()?;
        } else if let Some(rest) = line.strip_prefix("Non-2xx or 3xx responses:") {
            non_2xx = rest.trim().parse().ok()?;
        } else if let Some(rest) = line.strip_prefix("Socket errors:") {
            // "connect 0, read 0, write 0, timeout 0"
            load.errors += rest
                .split(',')
                .filter_map(|part| part.split_whitespace().nth(1)?.parse::<u64>().ok())
                .sum::<u64>();
        } else if fields.len() >= 2 && fields[1] == "requests" && line.contains(" in ") {
            total = fields[0].parse::<u64>().ok();
        } else if fields.first() == Some(&"Latency") && fields.len() >= 5 {
            // The thread-stats line (not "Latency Distribution"): avg, stdev, max, +/- stdev.
            load.mean_us = parse_wrk_duration_us(fields[1]);
        } else if fields.len() == 2 && fields[0] == "50%" {
            load.p50_us = parse_wrk_duration_us(fields[1]);
        } else if fields.len() == 2 && fields[0] == "99%" {
            load.p99_us = parse_wrk_duration_us(fields[1]);
        }
    }
    let total = total?;
    load.errors += non_2xx;
    load.requests = total.saturating_sub(non_2xx);
    Some(load)
}

/// "620.12us", "1.05ms", "2.00s" → microseconds.
fn parse_wrk_duration_us(text: &str) -> Option<f64> {
    let split = text.find(|c: char| c.is_ascii_alphabetic())?;
    let value: f64 = text[..split].parse().ok()?;
    let scale = match &text[split..] {
        "us" => 1.0,
        "ms" => 1_000.0,
        "s" => 1_000_000.0,
        "m" => 60_000_000.0,
        _ => return None,
    };
    Some(value * scale)
}

/// h2load: h2c with prior knowledge, `connections` × `streams` concurrent requests for
/// `duration`: gRPC unary calls (POST of `grpc_body`, gRPC headers) when a body is given, plain
/// GETs of `/` otherwise.
pub fn h2load_args(
    target: SocketAddr,
    connections: usize,
    streams: usize,
    duration: Duration,
    grpc_body: Option<&Path>,
) -> Vec<String> {
    let mut args = vec![
        format!("-c{connections}"),
        format!("-m{streams}"),
        "-t1".into(),
        "-D".into(),
        duration.as_secs().max(1).to_string(),
    ];
    match grpc_body {
        Some(body) => args.extend([
            "-d".into(),
            body.display().to_string(),
            "-H".into(),
            "content-type: application/grpc".into(),
            "-H".into(),
            "te: trailers".into(),
            format!("http://{target}/bench.Bench/Unary"),
        ]),
        None => args.push(format!("http://{target}/")),
    }
    args
}

/// Parses h2load's report.
pub fn parse_h2load(text: &str) -> Option<HttpLoad> {
    let mut load = HttpLoad::default();
    let mut seen = false;
    for line in text.lines().map(str::trim) {
        if let Some(rest) = line.strip_prefix("finished in ") {
            // "10.00s, 51234.50 req/s, 56.12MB/s"
            let rps = rest.split(',').nth(1)?.split_whitespace().next()?;
            load.requests_per_second = rps.parse().ok()?;
            seen = true;
        } else if let Some(rest) = line.strip_prefix("requests:") {
            // "N total, N started, N done, N succeeded, N failed, N errored, N timeout"
            for part in rest.split(',') {
                let mut it = part.split_whitespace();
                let (Some(n), Some(what)) = (it.next(), it.next()) else {
                    continue;
                };
                let n: u64 = n.parse().ok()?;
                match what {
                    "succeeded" => load.requests = n,
                    "failed" | "errored" | "timeout" => load.errors += n,
                    _ => {}
                }
            }
        } else if let Some(rest) = line.strip_prefix("time for request:") {
            // min max mean sd +/-sd
            load.mean_us = rest
                .split_whitespace()
                .nth(2)
                .and_then(parse_wrk_duration_us);
        }
    }
    seen.then_some(load)
}

/// iperf3's server, on one port, until killed.
pub fn iperf3_server_args(listen: SocketAddr) -> Vec<String> {
    vec![
        "-s".into(),
        "-B".into(),
        listen.ip().to_string(),
        "-p".into(),
        listen.port().to_string(),
    ]
}

/// iperf3's client: one stream for `duration`, JSON report.
pub fn iperf3_client_args(target: SocketAddr, duration: Duration) -> Vec<String> {
    vec![
        "-c".into(),
        target.ip().to_string(),
        "-p".into(),
        target.port().to_string(),
        "-t".into(),
        duration.as_secs().max(1).to_string(),
        "-J".into(),
    ]
}

/// Received bits per second from iperf3's JSON report, or its error.
pub fn parse_iperf3(text: &str) -> Result<f64, String> {
    let json = match (text.find('{'), text.rfind('}')) {
        (Some(a), Some(b)) if a < b => &text[a..=b],
        _ => return Err(format!("no JSON report: {}", text.trim())),
    };
    let report: serde_json::Value = serde_json::from_str(json).map_err(|e| e.to_string())?;
    if let Some(error) = report.get("error").and_then(|e| e.as_str()) {
        return Err(error.to_string());
    }
    report["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .ok_or_else(|| "no end.sum_received.bits_per_second".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    const WRK: &str = "Running 10s test @ http://127.0.0.1:40000/
  1 threads and 64 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency   620.12us  100.00us   5.00ms   90.00%
    Req/Sec    98.00k     5.00k  105.00k    80.00%
  Latency Distribution
     50%  600.00us
     75%  650.00us
     90%  700.00us
     99%    1.05ms
  980000 requests in 10.00s, 1.10GB read
  Socket errors: connect 0, read 2, write 0, timeout 1
  Non-2xx or 3xx responses: 5
Requests/sec:  98000.00
Transfer/sec:    110.00MB
";

    #[test]
    fn wrk_report() {
        let load = parse_wrk(WRK).unwrap();
        assert_eq!(load.requests_per_second, 98000.0);
        assert_eq!(load.requests, 979_995);
        assert_eq!(load.errors, 8);
        assert_eq!(load.mean_us, Some(620.12));
        assert_eq!(load.p50_us, Some(600.0));
        assert_eq!(load.p99_us, Some(1050.0));
        assert_eq!(
            parse_wrk("unable to connect to 127.0.0.1:1 Connection refused"),
            None
        );
        let args = wrk_args(
            "127.0.0.1:40000".parse().unwrap(),
            64,
            Duration::from_secs(10),
        )
        .join(" ");
        assert_eq!(args, "-t1 -c64 -d10s --latency http://127.0.0.1:40000/");
        let args = wrk_close_args(
            "127.0.0.1:40000".parse().unwrap(),
            16,
            Duration::from_secs(2),
        );
        assert_eq!(
            args,
            [
                "-H",
                "Connection: close",
                "-t1",
                "-c16",
                "-d2s",
                "--latency",
                "http://127.0.0.1:40000/"
            ]
        );
    }

    const H2LOAD: &str = "starting benchmark...
finished in 10.00s, 51234.50 req/s, 56.12MB/s
requests: 512345 total, 512345 started, 512345 done, 512340 succeeded, 5 failed, 0 errored, 0 timeout
status codes: 512340 2xx, 0 3xx, 0 4xx, 5 5xx
traffic: 561.20MB (588460000) total, 4.89MB (5123450) headers (space savings 95.00%), 527.70MB (553330000) data
                     min         max         mean         sd        +/- sd
time for request:      112us     12.34ms      4.98ms       1.02ms    70.00%
";

    #[test]
    fn h2load_report() {
        let load = parse_h2load(H2LOAD).unwrap();
        assert_eq!(load.requests_per_second, 51234.5);
        assert_eq!((load.requests, load.errors), (512_340, 5));
        assert_eq!(load.mean_us, Some(4980.0));
        assert_eq!(parse_h2load("connect error"), None);
        let target = "127.0.0.1:1".parse().unwrap();
        let grpc = h2load_args(
            target,
            16,
            16,
            Duration::from_secs(3),
            Some(Path::new("/b")),
        );
        let grpc = grpc.join(" ");
        assert!(grpc.starts_with("-c16 -m16 -t1 -D 3 -d /b"), "{grpc}");
        assert!(
            grpc.ends_with("content-type: application/grpc -H te: trailers http://127.0.0.1:1/bench.Bench/Unary"),
            "{grpc}"
        );
        let get = h2load_args(target, 16, 16, Duration::from_secs(3), None).join(" ");
        assert_eq!(get, "-c16 -m16 -t1 -D 3 http://127.0.0.1:1/");
    }

    #[test]
    fn iperf3_report() {
        let text = r#"{"start":{},"end":{"sum_received":{"bits_per_second":2.5e10}}}"#;
        assert_eq!(parse_iperf3(text), Ok(2.5e10));
        assert_eq!(
            parse_iperf3(r#"{"error":"unable to connect"}"#),
            Err("unable to connect".into())
        );
        assert!(parse_iperf3("iperf3: error").is_err());
    }
}
