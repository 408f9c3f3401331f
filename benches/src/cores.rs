//! Each core's time from `/proc/stat`: how busy it was with the guest's own work, and how much
//! of it the hypervisor took (steal). Who set a throughput limit, and whether a round was noisy.

use std::fs;

/// One core's time from `/proc/stat`, in jiffies since boot.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CoreTime {
    /// Running anything of the guest's own: user, system, interrupts and softirqs.
    pub busy: u64,
    /// Wanted to run while the hypervisor ran something else (`steal`): the machine's
    /// neighbours, or its own housekeeping.
    pub stolen: u64,
    pub total: u64,
}

/// Every core's time, from `/proc/stat`.
pub fn core_times() -> Vec<CoreTime> {
    fs::read_to_string("/proc/stat")
        .map(|t| parse_core_times(&t))
        .unwrap_or_default()
}

fn parse_core_times(text: &str) -> Vec<CoreTime> {
    text.lines()
        .filter(|l| l.starts_with("cpu") && l.as_bytes().get(3).is_some_and(u8::is_ascii_digit))
        .map(|l| {
            let v: Vec<u64> = l
                .split_whitespace()
                .skip(1)
                .filter_map(|f| f.parse().ok())
                .collect();
            let field = |i: usize| v.get(i).copied().unwrap_or(0);
            // user nice system idle iowait irq softirq steal; guest time is already in user.
            let total: u64 = v.iter().take(8).sum();
            let (idle, stolen) = (field(3) + field(4), field(7));
            CoreTime {
                busy: total.saturating_sub(idle + stolen),
                stolen,
                total,
            }
        })
        .collect()
}

/// The fraction of `core`'s time between two [`core_times`] readings that `part` of it took.
fn core_share(
    before: &[CoreTime],
    after: &[CoreTime],
    core: usize,
    part: fn(&CoreTime) -> u64,
) -> Option<f64> {
    let (b, a) = (before.get(core)?, after.get(core)?);
    let total = a.total.checked_sub(b.total).filter(|t| *t > 0)?;
    Some(part(a).saturating_sub(part(b)) as f64 / total as f64)
}

/// Per core, the per cent of the time it had work between two readings that the hypervisor
/// took (steal ÷ (busy + steal)); 0 for a core that had none.
pub fn stolen_percent_of_wanted(before: &[CoreTime], after: &[CoreTime]) -> Vec<f64> {
    before
        .iter()
        .zip(after)
        .map(|(b, a)| {
            let stolen = a.stolen.saturating_sub(b.stolen);
            let wanted = a.busy.saturating_sub(b.busy) + stolen;
            if wanted == 0 {
                0.0
            } else {
                stolen as f64 * 100.0 / wanted as f64
            }
        })
        .collect()
}

/// The fraction of `core` busy with the guest's own work between two readings.
pub fn core_busy(before: &[CoreTime], after: &[CoreTime], core: usize) -> Option<f64> {
    core_share(before, after, core, |c| c.busy)
}

/// The fraction of `core` the hypervisor took away between two readings.
pub fn core_stolen(before: &[CoreTime], after: &[CoreTime], core: usize) -> Option<f64> {
    core_share(before, after, core, |c| c.stolen)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn core_busy_comes_from_proc_stat() {
        let before = parse_core_times("cpu  10 0 10 80 0 0 0 0 0 0\ncpu0 5 0 5 40 0 0 0 0 0 0\ncpu1 5 0 5 40 0 0 0 0 0 0\nintr 1\n");
        let after =
            parse_core_times("cpu  0\ncpu0 55 0 5 90 0 0 0 0 0 0\ncpu1 5 0 5 140 0 0 0 0 0 0\n");
        assert_eq!(before.len(), 2);
        assert_eq!(core_busy(&before, &after, 0), Some(0.5));
        assert_eq!(core_busy(&before, &after, 1), Some(0.0));
        assert_eq!(core_busy(&before, &after, 2), None);
        assert!(!core_times().is_empty());
    }

    #[test]
    fn stolen_time_is_its_own_share_and_not_busy() {
        // cpu0: 30 jiffies of work, 20 stolen, 50 idle (10 of them iowait) out of 100.
        let before = parse_core_times(
            "cpu0 100 0 100 1000 0 0 0 100 0 0
",
        );
        let after = parse_core_times(
            "cpu0 120 0 105 1040 10 2 3 120 7 0
",
        );
        assert_eq!(
            after[0],
            CoreTime {
                busy: 230,
                stolen: 120,
                total: 1400
            }
        );
        assert_eq!(core_busy(&before, &after, 0), Some(0.3));
        assert_eq!(core_stolen(&before, &after, 0), Some(0.2));
        // No time passed: no share.
        assert_eq!(core_stolen(&after, &after, 0), None);
        // Of the 50 jiffies cpu0 had work, 20 were stolen; cpu1 had none.
        let idle = parse_core_times("cpu1 0 0 0 500 0 0 0 0 0 0\n");
        let mut b = before.clone();
        b.extend(idle.clone());
        let mut a = after.clone();
        a.extend(parse_core_times("cpu1 0 0 0 600 0 0 0 0 0 0\n"));
        assert_eq!(stolen_percent_of_wanted(&b, &a), vec![40.0, 0.0]);
    }
}
