//! Kubernetes resource quantities (`100m`, `1Gi`, `1.5`, `2e3`): the syntax check the API
//! server applies, so that a bad `sidecar.istio.io/proxyCPU` fails injection instead of the
//! pod's creation, and their numeric value, for comparing `2000m` with `2`.

/// Checks that `q` is a quantity Kubernetes accepts.
pub fn check(q: &str) -> Result<(), String> {
    value(q).map(drop)
}

/// The quantity's value in base units (cores, bytes); `2000m` and `2` give the same.
pub fn value(q: &str) -> Result<f64, String> {
    let bad = || format!("`{q}` is not a Kubernetes quantity");
    if q.chars().any(char::is_control) {
        return Err(bad());
    }
    let unsigned = q.strip_prefix(['+', '-']).unwrap_or(q);
    let negative = q.starts_with('-');
    let split = unsigned
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(unsigned.len());
    let (number, suffix) = unsigned.split_at(split);
    let digits = number.bytes().filter(u8::is_ascii_digit).count();
    if digits == 0 || number.matches('.').count() > 1 {
        return Err(bad());
    }
    let mantissa: f64 = number.parse().map_err(|_| bad())?;
    let scale = match suffix {
        "" => 1.0,
        "n" => 1e-9,
        "u" => 1e-6,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024f64,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        exp => {
            let digits = exp.strip_prefix(['e', 'E']).ok_or_else(bad)?;
            let unsigned = digits.strip_prefix(['+', '-']).unwrap_or(digits);
            if unsigned.is_empty() || !unsigned.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad());
            }
            10f64.powi(digits.parse().map_err(|_| bad())?)
        }
    };
    let v = mantissa * scale;
    Ok(if negative { -v } else { v })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_forms_are_equal() {
        assert_eq!(value("2000m"), value("2"));
        assert_eq!(value("1024Mi"), value("1Gi"));
        assert_eq!(value("1e3"), value("1k"));
        assert!(check("0").is_ok());
        assert!(check("+1.5").is_ok());
        for bad in ["", "m", "1.2.3", "1x", "1e", "1Gi\n", "abc", "1 Gi"] {
            assert!(check(bad).is_err(), "{bad:?}");
        }
    }
}
