//! The programs under test: started pinned to a core (`taskset`), measured through `/proc`
//! (CPU time in nanoseconds from each thread's `schedstat`, falling back to `stat`'s 10 ms ticks;
//! `VmRSS` from `status`; summed over the process and its children, so nginx's master and worker
//! count together), and ended by PID when dropped, on error too. A
//! [`Registry`] of live PIDs lets a signal handler end them if the harness itself is stopped.

use anyhow::Context;
use nix::sys::signal::{kill, SigSet, Signal};
use nix::unistd::Pid;
use std::fs;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The core the proxy under test runs on.
pub const PROXY_CPU: usize = 0;
/// The core the load generators and the upstream share.
pub const LOAD_CPU: usize = 1;
/// `/proc/<pid>/stat` counts CPU time in USER_HZ ticks, which Linux fixes at 100 per second for
/// user space whatever the kernel's own tick rate.
pub const TICKS_PER_SECOND: u64 = 100;
/// How long a program gets to exit after SIGTERM before SIGKILL.
const TERMINATE_GRACE: Duration = Duration::from_secs(3);

/// PIDs of the programs the harness started and has not yet ended.
#[derive(Debug, Clone, Default)]
pub struct Registry(Arc<Mutex<Vec<u32>>>);

impl Registry {
    fn add(&self, pid: u32) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).push(pid);
    }

    fn remove(&self, pid: u32) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|p| *p != pid);
    }

    /// SIGKILLs every registered program and its children.
    pub fn kill_all(&self) {
        let pids = self.0.lock().unwrap_or_else(|e| e.into_inner()).clone();
        for pid in pids {
            for p in descendants(pid).into_iter().chain([pid]) {
                let _ = kill(pid_of(p), Signal::SIGKILL);
            }
        }
    }
}

/// Blocks SIGINT, SIGTERM and SIGHUP in the calling thread (and so in every thread started after
/// it: call this first) and ends the registered programs when one arrives. Children do not
/// inherit the mask: std resets it before `exec`.
pub fn end_children_on_signal(registry: Registry) -> anyhow::Result<()> {
    let mut signals = SigSet::empty();
    for s in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        signals.add(s);
    }
    signals.thread_block().context("blocking signals")?;
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            if let Ok(signal) = signals.wait() {
                eprintln!("harness: {signal}, ending the programs it started");
                registry.kill_all();
                std::process::exit(128 + signal as i32);
            }
        })
        .context("starting the signal thread")?;
    Ok(())
}

/// Pins the calling process (all its threads from now on) to one core.
pub fn pin_self(cpu: usize) -> anyhow::Result<()> {
    let mut set = nix::sched::CpuSet::new();
    set.set(cpu).context("cpu index")?;
    nix::sched::sched_setaffinity(Pid::from_raw(0), &set).context("sched_setaffinity")?;
    Ok(())
}

/// A program the harness started; ended (SIGTERM, then SIGKILL) when dropped.
#[derive(Debug)]
pub struct Spawned {
    name: String,
    child: Child,
    log: PathBuf,
    registry: Registry,
}

/// Starts `program` with `args`, on core `cpu` when one is given, stdout and stderr to `log`.
pub fn spawn(
    registry: &Registry,
    name: &str,
    cpu: Option<usize>,
    program: &Path,
    args: &[String],
    log: &Path,
) -> anyhow::Result<Spawned> {
    let out = fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
    let err = out.try_clone()?;
    let mut command = match cpu {
        // taskset execs the program, so the PID is the program's own.
        Some(cpu) => {
            let mut c = Command::new("taskset");
            c.arg("-c").arg(cpu.to_string()).arg(program);
            c
        }
        None => Command::new(program),
    };
    let child = command
        .args(args)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .with_context(|| format!("starting {name} ({})", program.display()))?;
    registry.add(child.id());
    Ok(Spawned {
        name: name.to_string(),
        child,
        log: log.to_path_buf(),
        registry: registry.clone(),
    })
}

impl Spawned {
    /// The program's PID.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The exit status, if it has already exited.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// The last `lines` lines of its output, for error messages.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// CPU time and memory of the program and its children now.
    pub fn usage(&self) -> Usage {
        tree_usage(self.pid())
    }

    /// Waits for the program to exit on its own, at most `limit`; kills it after that.
    pub fn wait_bounded(mut self, limit: Duration) -> anyhow::Result<ExitStatus> {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if let Some(status) = self.exited() {
                return Ok(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        anyhow::bail!("{} did not finish within {limit:?}; killed", self.name)
    }

    fn terminate(&mut self) {
        let pid = self.pid();
        if self.exited().is_none() {
            let children = descendants(pid);
            let _ = kill(pid_of(pid), Signal::SIGTERM);
            let deadline = Instant::now() + TERMINATE_GRACE;
            while self.exited().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            for p in children.into_iter().chain([pid]) {
                let _ = kill(pid_of(p), Signal::SIGKILL);
            }
            let _ = self.child.wait();
        }
        self.registry.remove(pid);
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        self.terminate();
    }
}

fn pid_of(pid: u32) -> Pid {
    Pid::from_raw(pid as i32)
}

/// CPU time and resident memory of a process tree at one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Usage {
    /// utime + stime, in [`TICKS_PER_SECOND`] ticks (threads that have ended included).
    pub cpu_ticks: u64,
    /// Each live thread's scheduler counters (`/proc/<pid>/task/<tid>/schedstat`); empty if
    /// any thread's could not be read.
    pub threads: Vec<ThreadClock>,
    /// VmRSS, in KiB.
    pub rss_kib: u64,
}

impl Usage {
    /// CPU seconds spent between `earlier` and `self`: from the threads' nanosecond counters
    /// when every thread seen earlier is still there (a 2 s run at 1000 rps costs a proxy about
    /// ten 10 ms ticks, too coarse to compare proxies by), from the ticks otherwise (an ended
    /// thread's nanoseconds are gone; its ticks stay in the process's `stat`).
    pub fn cpu_seconds_since(&self, earlier: &Usage) -> f64 {
        match self.threads_since(earlier, |t| t.on_cpu_ns) {
            Some(ns) => ns as f64 / 1e9,
            None => {
                self.cpu_ticks.saturating_sub(earlier.cpu_ticks) as f64 / TICKS_PER_SECOND as f64
            }
        }
    }

    /// How many times the scheduler put one of the threads on a CPU between `earlier` and
    /// `self`: for a proxy that sleeps in `epoll_wait` between events, its wake-ups. `None`
    /// when a thread seen earlier has ended (its count went with it) or schedstat is missing.
    pub fn slices_since(&self, earlier: &Usage) -> Option<u64> {
        self.threads_since(earlier, |t| t.slices)
    }

    /// The growth of one per-thread counter summed over the threads, if every thread seen
    /// earlier is still there; a thread started in between counts from zero.
    fn threads_since(&self, earlier: &Usage, counter: fn(&ThreadClock) -> u64) -> Option<u64> {
        let all_still_there = !earlier.threads.is_empty()
            && !self.threads.is_empty()
            && earlier
                .threads
                .iter()
                .all(|e| self.threads.iter().any(|t| t.tid == e.tid));
        all_still_there.then(|| {
            self.threads
                .iter()
                .map(|t| {
                    let before = earlier.threads.iter().find(|e| e.tid == t.tid);
                    counter(t).saturating_sub(before.map_or(0, counter))
                })
                .sum()
        })
    }

    /// Two process trees together (the mTLS scenario's pair of sidecars).
    pub fn plus(mut self, other: Usage) -> Usage {
        self.cpu_ticks += other.cpu_ticks;
        self.rss_kib += other.rss_kib;
        if self.threads.is_empty() || other.threads.is_empty() {
            self.threads.clear();
        } else {
            self.threads.extend(other.threads);
        }
        self
    }
}

/// Usage of `pid` and all its descendants.
pub fn tree_usage(pid: u32) -> Usage {
    let mut total = Usage::default();
    let mut threads_readable = true;
    for p in descendants(pid).into_iter().chain([pid]) {
        if let Some((_, ticks)) = fs::read_to_string(format!("/proc/{p}/stat"))
            .ok()
            .as_deref()
            .and_then(parse_stat)
        {
            total.cpu_ticks += ticks;
        }
        match thread_times(p) {
            Some(threads) => total.threads.extend(threads),
            None => threads_readable = false,
        }
        if let Some(kib) = fs::read_to_string(format!("/proc/{p}/status"))
            .ok()
            .as_deref()
            .and_then(parse_vm_rss)
        {
            total.rss_kib += kib;
        }
    }
    if !threads_readable {
        total.threads.clear();
    }
    total
}

/// One thread's scheduler counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ThreadClock {
    pub tid: u32,
    /// Time on a CPU, in nanoseconds.
    pub on_cpu_ns: u64,
    /// Times it was put on a CPU.
    pub slices: u64,
}

/// Each thread of `pid` with its scheduler counters; `None` if any is unreadable (a kernel
/// without schedstat, or the process gone).
fn thread_times(pid: u32) -> Option<Vec<ThreadClock>> {
    let mut threads = Vec::new();
    for entry in fs::read_dir(format!("/proc/{pid}/task")).ok()?.flatten() {
        let tid: u32 = entry.file_name().to_str()?.parse().ok()?;
        let text = fs::read_to_string(entry.path().join("schedstat")).ok()?;
        let (on_cpu_ns, slices) = parse_schedstat(&text)?;
        threads.push(ThreadClock {
            tid,
            on_cpu_ns,
            slices,
        });
    }
    (!threads.is_empty()).then_some(threads)
}

/// The calling thread's time on a CPU in nanoseconds and the times it was put on one.
pub fn own_thread_clock() -> Option<(u64, u64)> {
    parse_schedstat(&fs::read_to_string("/proc/thread-self/schedstat").ok()?)
}

/// Time on a CPU in nanoseconds and the number of times the thread was put on one: the first
/// and third of `schedstat`'s fields (the second is time spent waiting on a run queue).
fn parse_schedstat(text: &str) -> Option<(u64, u64)> {
    let mut fields = text.split_whitespace().map(str::parse::<u64>);
    let on_cpu = fields.next()?.ok()?;
    let slices = fields.nth(1)?.ok()?;
    Some((on_cpu, slices))
}

/// All descendants of `pid` (children, their children…).
pub fn descendants(pid: u32) -> Vec<u32> {
    let mut parent_of = Vec::new();
    if let Ok(entries) = fs::read_dir("/proc") {
        for entry in entries.flatten() {
            let Some(p) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            if let Some((ppid, _)) = fs::read_to_string(format!("/proc/{p}/stat"))
                .ok()
                .as_deref()
                .and_then(parse_stat)
            {
                parent_of.push((p, ppid));
            }
        }
    }
    let mut found = vec![];
    let mut frontier = vec![pid];
    while let Some(parent) = frontier.pop() {
        for &(p, ppid) in &parent_of {
            if ppid == parent && !found.contains(&p) {
                found.push(p);
                frontier.push(p);
            }
        }
    }
    found
}

/// `(ppid, utime + stime)` from a `/proc/<pid>/stat` line. The command name may contain spaces
/// and parentheses, so fields are counted from the last `)`.
fn parse_stat(text: &str) -> Option<(u32, u64)> {
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state(3) ppid(4) … utime(14) stime(15), numbered as in proc(5).
    let ppid = fields.get(1)?.parse().ok()?;
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some((ppid, utime + stime))
}

/// `VmRSS` in KiB from `/proc/<pid>/status`.
fn parse_vm_rss(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Whether something listens on TCP `port` of 127.0.0.1 (or of every address), from
/// `/proc/net/tcp`: a readiness check that sends nothing through the listener.
pub fn is_listening(port: u16) -> bool {
    fs::read_to_string("/proc/net/tcp").is_ok_and(|table| listening_in(&table, port))
}

fn listening_in(table: &str, port: u16) -> bool {
    const LISTEN: &str = "0A";
    table.lines().skip(1).any(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (Some(local), Some(state)) = (fields.get(1), fields.get(3)) else {
            return false;
        };
        let Some((ip, p)) = local.split_once(':') else {
            return false;
        };
        *state == LISTEN
            && u16::from_str_radix(p, 16).ok() == Some(port)
            && (ip == "0100007F" || ip == "00000000")
    })
}

/// `n` distinct free loopback ports (all held open until every one is chosen).
pub fn free_ports(n: usize) -> anyhow::Result<Vec<u16>> {
    let listeners = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<Vec<_>, _>>()
        .context("binding a free loopback port")?;
    Ok(listeners
        .iter()
        .map(|l| l.local_addr().map(|a| a.port()).unwrap_or(0))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_counted_from_the_last_parenthesis() {
        let line = "4242 (nginx: worker (x) 1) S 4241 4241 4241 0 -1 4194624 100 0 0 0 \
                    37 12 0 0 20 0 1 0 12345 1000000 250 18446744073709551615";
        assert_eq!(parse_stat(line), Some((4241, 49)));
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn vm_rss_is_read_in_kib() {
        let status = "Name:\tremora\nVmPeak:\t  20000 kB\nVmRSS:\t    5120 kB\nThreads:\t4\n";
        assert_eq!(parse_vm_rss(status), Some(5120));
        assert_eq!(parse_vm_rss("Name:\tx\n"), None);
    }

    #[test]
    fn our_own_usage_is_readable() {
        let me = tree_usage(std::process::id());
        assert!(me.rss_kib > 0);
        assert!(!me.threads.is_empty(), "this kernel has schedstat");
        let (on_cpu, slices) = own_thread_clock().expect("this thread's schedstat");
        assert!(on_cpu > 0 && slices > 0);
        let ticks = Usage {
            cpu_ticks: 150,
            ..Usage::default()
        };
        assert_eq!(ticks.cpu_seconds_since(&Usage::default()), 1.5);
    }

    #[test]
    fn cpu_time_comes_from_thread_nanoseconds_while_no_thread_has_ended() {
        let usage = |ticks, threads: &[(u32, u64)]| Usage {
            cpu_ticks: ticks,
            threads: threads
                .iter()
                .map(|&(tid, on_cpu_ns)| ThreadClock {
                    tid,
                    on_cpu_ns,
                    slices: on_cpu_ns / 1000,
                })
                .collect(),
            rss_kib: 0,
        };
        let before = usage(10, &[(1, 1_000_000_000), (2, 500_000_000)]);
        // Thread 3 started in between: all of its time counts.
        let after = usage(99, &[(1, 1_250_000_000), (2, 500_000_000), (3, 5_000_000)]);
        assert_eq!(after.cpu_seconds_since(&before), 0.255);
        // Slices are summed the same way (here one per µs on a CPU).
        assert_eq!(after.slices_since(&before), Some(255_000));
        // Thread 2 ended: its nanoseconds are gone, so the ticks decide.
        let ended = usage(40, &[(1, 1_250_000_000)]);
        assert_eq!(ended.cpu_seconds_since(&before), 0.3);
        assert_eq!(
            ended.slices_since(&before),
            None,
            "no ticks to fall back on"
        );
        // No schedstat: ticks.
        assert_eq!(usage(40, &[]).cpu_seconds_since(&before), 0.3);
        let pair = usage(1, &[(1, 7)]).plus(usage(2, &[(2, 8)]));
        assert_eq!((pair.cpu_ticks, pair.threads.len()), (3, 2));
        assert!(usage(1, &[(1, 7)]).plus(usage(2, &[])).threads.is_empty());
        assert_eq!(parse_schedstat("123456 789 10\n"), Some((123456, 10)));
        assert_eq!(parse_schedstat("123456 789\n"), None);
        assert_eq!(parse_schedstat(""), None);
    }

    #[test]
    fn listeners_are_found_in_proc_net_tcp() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0 10 0
   1: 0100007F:1F91 0100007F:1F90 01 00000000:00000000 00:00000000 00000000     0        0 2 1 0 10 0
   2: 00000000:0050 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 3 1 0 10 0";
        assert!(listening_in(table, 8080));
        assert!(
            !listening_in(table, 8081),
            "an established connection is not a listener"
        );
        assert!(listening_in(table, 80));
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        assert!(is_listening(l.local_addr().unwrap().port()));
    }

    #[test]
    fn free_ports_are_distinct() {
        let ports = free_ports(5).unwrap();
        let mut unique = ports.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), 5);
        assert!(ports.iter().all(|p| *p != 0));
    }
}
