//! The commands the injected proxy container's lifecycle hooks run, since its image has no
//! shell or curl: `remora wait` (postStart, holding the application until the proxy is
//! ready) and `remora drain` (preStop of a native sidecar, draining before the pod stops).

use bytes::Bytes;
use clap::Args;
use http_body_util::Empty;
use hyper::{Method, Request};
use hyper_util::rt::TokioIo;
use std::net::{Ipv4Addr, SocketAddr};
use std::process::ExitCode;
use std::time::Duration;

/// Flags of `remora wait`.
#[derive(Debug, Clone, Args)]
pub struct WaitArgs {
    /// Give up (exit 1) after this long.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
    /// Pause between attempts.
    #[arg(long, default_value = "500ms", value_parser = humantime::parse_duration)]
    pub period: Duration,
    /// The readiness port on this host.
    #[arg(long, default_value_t = 15021)]
    pub port: u16,
    /// The readiness path.
    #[arg(long, default_value = "/healthz/ready")]
    pub path: String,
}

/// Flags of `remora drain`.
#[derive(Debug, Clone, Args)]
pub struct DrainArgs {
    /// The agent port on this host.
    #[arg(long, default_value_t = 15020)]
    pub port: u16,
    /// Bound on the request.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
}

/// Bound on one readiness request, so that a hung connection cannot eat the whole timeout.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(1);

/// `remora wait`: exits 0 once `GET <path>` on the readiness port answers 200.
pub fn wait(args: WaitArgs) -> ExitCode {
    let Some(runtime) = runtime() else {
        return ExitCode::FAILURE;
    };
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, args.port));
    let ready = runtime.block_on(async {
        let attempts = async {
            loop {
                match tokio::time::timeout(ATTEMPT_TIMEOUT, request(Method::GET, addr, &args.path))
                    .await
                {
                    Ok(Ok(200)) => return,
                    Ok(Ok(status)) => eprintln!("remora wait: {addr}{}: {status}", args.path),
                    Ok(Err(e)) => eprintln!("remora wait: {addr}{}: {e}", args.path),
                    Err(_) => eprintln!("remora wait: {addr}{}: no answer", args.path),
                }
                tokio::time::sleep(args.period).await;
            }
        };
        tokio::time::timeout(args.timeout, attempts).await.is_ok()
    });
    if ready {
        ExitCode::SUCCESS
    } else {
        eprintln!("remora wait: not ready after {:?}", args.timeout);
        ExitCode::FAILURE
    }
}

/// `remora drain`: asks the local agent to start draining (`POST /drain`).
pub fn drain(args: DrainArgs) -> ExitCode {
    let Some(runtime) = runtime() else {
        return ExitCode::FAILURE;
    };
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, args.port));
    let result = runtime.block_on(tokio::time::timeout(
        args.timeout,
        request(Method::POST, addr, "/drain"),
    ));
    match result {
        Ok(Ok(200)) => ExitCode::SUCCESS,
        Ok(Ok(status)) => {
            eprintln!("remora drain: {addr}: {status}");
            ExitCode::FAILURE
        }
        Ok(Err(e)) => {
            eprintln!("remora drain: {addr}: {e}");
            ExitCode::FAILURE
        }
        Err(_) => {
            eprintln!("remora drain: {addr}: no answer in {:?}", args.timeout);
            ExitCode::FAILURE
        }
    }
}

fn runtime() -> Option<tokio::runtime::Runtime> {
    match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => Some(r),
        Err(e) => {
            eprintln!("remora: starting the runtime: {e}");
            None
        }
    }
}

/// One request; the response status.
async fn request(method: Method, addr: SocketAddr, path: &str) -> Result<u16, String> {
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| e.to_string())?;
    let driver = tokio::spawn(async move {
        let _ = conn.await;
    });
    let req = Request::builder()
        .method(method)
        .uri(path)
        .header(hyper::header::HOST, addr.to_string())
        .header(hyper::header::USER_AGENT, "remora-lifecycle")
        .body(Empty::<Bytes>::new())
        .map_err(|e| e.to_string())?;
    let status = sender
        .send_request(req)
        .await
        .map_err(|e| e.to_string())?
        .status();
    driver.abort();
    Ok(status.as_u16())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wait_returns_once_ready_and_fails_after_the_timeout() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        // Answer 503 once, then 200.
        let server = std::thread::spawn(move || {
            use std::io::{Read, Write};
            for status in ["503 Service Unavailable", "200 OK"] {
                let (mut s, _) = listener.accept().expect("accept");
                let mut buf = [0u8; 1024];
                let _ = s.read(&mut buf);
                let _ = write!(
                    s,
                    "HTTP/1.1 {status}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                );
            }
        });
        let args = WaitArgs {
            timeout: Duration::from_secs(10),
            period: Duration::from_millis(10),
            port,
            path: "/healthz/ready".into(),
        };
        assert_eq!(wait(args.clone()), ExitCode::SUCCESS);
        server.join().expect("server");
        let closed = WaitArgs {
            timeout: Duration::from_millis(100),
            ..args
        };
        assert_eq!(wait(closed), ExitCode::FAILURE);
    }
}
