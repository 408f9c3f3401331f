//! Rounds: every contender measured several times, round by round, and the rounds reduced to
//! one row.

use crate::proxy_config::Proxy;
use crate::report::{Figure, Table};

/// Each contender's rounds as [`interleaved`] returns them, each round already its row's values.
pub type RoundValues = Vec<(Proxy, Vec<Result<Vec<Option<f64>>, String>>)>;

/// Each contender's rounds reduced to its row of `table` ([`summarize`]), or to the reason it
/// has none; `progress` makes the line printed for each row from its name and its medians
/// (by column).
pub fn push_rows(
    table: &mut Table,
    results: RoundValues,
    progress: impl Fn(&str, &dyn Fn(usize) -> f64) -> String,
) {
    for (proxy, rounds) in results {
        match summarize(rounds) {
            Ok((values, note)) => {
                let median = |i: usize| Figure::median_of(&values[i]);
                eprintln!("{}", progress(proxy.name(), &median));
                table.push(proxy.name(), values, note);
            }
            Err(why) => table.push_missing(proxy.name(), why),
        }
    }
}

/// Measures every contender `rounds` times, round by round, so that a burst of outside load
/// hits all contenders alike rather than whichever ran at that moment. Returns each
/// contender's results, in contender order. A contender whose every round so far failed (not
/// installed, not in this build) is not tried again.
pub fn interleaved<R>(
    scenario: &str,
    contenders: &[Proxy],
    rounds: usize,
    mut measure_one: impl FnMut(Proxy) -> Result<R, String>,
) -> Vec<(Proxy, Vec<Result<R, String>>)> {
    let mut results: Vec<(Proxy, Vec<Result<R, String>>)> =
        contenders.iter().map(|p| (*p, vec![])).collect();
    for round in 1..=rounds {
        for (proxy, done) in results.iter_mut() {
            if !done.is_empty() && done.iter().all(Result::is_err) {
                continue;
            }
            eprintln!("{scenario}: {} (round {round}/{rounds})", proxy.name());
            done.push(measure_one(*proxy));
        }
    }
    results
}

/// One contender's rounds reduced to a row: per column, the median of the rounds that measured
/// it and their spread, with a note when some rounds failed; the first error when all did.
/// Each round gives one value per column (`None` where that round did not measure it).
pub fn summarize(
    rounds: Vec<Result<Vec<Option<f64>>, String>>,
) -> Result<(Vec<Option<Figure>>, Option<String>), String> {
    let total = rounds.len();
    let mut errors = vec![];
    let mut measured = vec![];
    for round in rounds {
        match round {
            Ok(values) => measured.push(Some(values)),
            Err(e) => {
                errors.push(e);
                measured.push(None);
            }
        }
    }
    // Round i's value sits at index i of every column (NaN where it has none), so that a
    // figure's rounds line up with another column's.
    let width = measured.iter().flatten().map(Vec::len).max().unwrap_or(0);
    let columns: Vec<Vec<f64>> = (0..width)
        .map(|c| {
            measured
                .iter()
                .map(|round| {
                    round
                        .as_ref()
                        .and_then(|values| values.get(c).copied().flatten())
                        .unwrap_or(f64::NAN)
                })
                .collect()
        })
        .collect();
    if errors.len() == total {
        return Err(errors
            .into_iter()
            .next()
            .unwrap_or_else(|| "not run".into()));
    }
    let note = (!errors.is_empty())
        .then(|| format!("{} of {total} rounds failed: {}", errors.len(), errors[0]));
    Ok((columns.iter().map(|c| Figure::of(c)).collect(), note))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_interleave_and_reduce_to_medians() {
        let mut order = vec![];
        let contenders = [Proxy::NoProxy, Proxy::Envoy, Proxy::Nginx];
        let results = interleaved("t", &contenders, 2, |p| {
            order.push(p);
            if p == Proxy::Nginx {
                Err("not installed".to_string())
            } else {
                Ok(vec![Some(order.len() as f64), None])
            }
        });
        // Round by round; nginx failed in round 1, so it is not tried in round 2.
        assert_eq!(
            order,
            vec![
                Proxy::NoProxy,
                Proxy::Envoy,
                Proxy::Nginx,
                Proxy::NoProxy,
                Proxy::Envoy
            ]
        );
        let (_, envoy) = &results[1];
        let (row, note) = summarize(envoy.clone()).unwrap();
        assert_eq!(
            row[0].as_ref().map(|f| (f.median, f.min, f.max)),
            Some((3.5, 2.0, 5.0))
        );
        assert_eq!(row[1], None, "a column no round measured");
        assert_eq!(note, None);
        let (_, nginx) = &results[2];
        assert_eq!(summarize(nginx.clone()), Err("not installed".into()));
        let mixed = vec![
            Ok(vec![Some(1.0)]),
            Err("reset".to_string()),
            Ok(vec![Some(3.0)]),
        ];
        let (row, note) = summarize(mixed).unwrap();
        assert_eq!(row[0].as_ref().map(|f| f.median), Some(2.0));
        assert_eq!(note.as_deref(), Some("1 of 3 rounds failed: reset"));
        // The failed round keeps its place among the rounds.
        let each = &row[0].as_ref().unwrap().each;
        assert_eq!((each.len(), each[0], each[2]), (3, 1.0, 3.0));
        assert!(each[1].is_nan());
    }
}
