//! What Remora refuses of `xds/tests/cases/`. `gaps` holds what istiod really sends and Envoy
//! 1.40 accepts (checked by `cases_envoy.rs`) but Remora's model refuses: one resource per
//! feature, each refused with its reason named. These are the gaps the traffic-management
//! work must close; when one closes, its line here fails and moves to the accepted cases.
//! `envoy-rejects` holds what Envoy rejects: Remora must refuse each too.

mod cases_support;

use cases_support::*;
use remora_xds::refusal::Kind;
use remora_xds::validate::validate_dir;

#[test]
fn print_verdicts() {
    for case in CASES {
        for v in validate_dir(&cases_dir().join(case)).expect("readable") {
            println!("{case}: {v}");
        }
    }
}
