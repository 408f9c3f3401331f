//! Rounds: every contender measured several times, round by round, and the rounds reduced to
//! one row.

use crate::proxy_config::Proxy;

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

/// The best successful round by `score` (throughput: noise only ever slows a run down), with a
/// note when some rounds failed; the first error when all did.
pub fn best_round<R>(
    rounds: Vec<Result<R, String>>,
    score: impl Fn(&R) -> f64,
) -> Result<(R, Option<String>), String> {
    let total = rounds.len();
    let mut errors = vec![];
    let mut best: Option<R> = None;
    for round in rounds {
        match round {
            Ok(r) => {
                if best.as_ref().is_none_or(|b| score(&r) > score(b)) {
                    best = Some(r);
                }
            }
            Err(e) => errors.push(e),
        }
    }
    match best {
        Some(b) => {
            let note = (!errors.is_empty())
                .then(|| format!("{} of {total} rounds failed: {}", errors.len(), errors[0]));
            Ok((b, note))
        }
        None => Err(errors
            .into_iter()
            .next()
            .unwrap_or_else(|| "not run".into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_interleave_and_the_best_is_kept() {
        let mut order = vec![];
        let contenders = [Proxy::NoProxy, Proxy::Envoy, Proxy::Nginx];
        let results = interleaved("t", &contenders, 2, |p| {
            order.push(p);
            if p == Proxy::Nginx {
                Err("not installed".to_string())
            } else {
                Ok(order.len() as f64)
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
        assert_eq!(best_round(envoy.clone(), |v| *v), Ok((5.0, None)));
        let (_, nginx) = &results[2];
        assert_eq!(
            best_round(nginx.clone(), |v| *v),
            Err("not installed".into())
        );
        let mixed = vec![Ok(1.0), Err("reset".to_string())];
        assert_eq!(
            best_round(mixed, |v| *v),
            Ok((1.0, Some("1 of 2 rounds failed: reset".into())))
        );
    }
}
