//! Load shedding: how many downstream connections Remora keeps open at once, in all and per
//! listener, before it refuses new ones (Envoy's overload manager's
//! `global_downstream_max_connections` and its per-listener connection limit).

use serde::{Deserialize, Serialize};
use std::num::NonZeroU32;

/// Connection limits. Unset, each is computed at start from the open-file limit
/// (`RLIMIT_NOFILE`, after Remora raised its soft limit to the hard one), so that the limit is
/// reached before the descriptor table is full: see [`OverloadConfig::default_max_connections`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OverloadConfig {
    /// Downstream connections open at once over every data-path listener (the capture
    /// listeners and the explicit ones; not admin, metrics, readiness or agent, which have
    /// their own small cap). Past it, a new connection is accepted and reset at once.
    pub max_connections: Option<NonZeroU32>,
    /// Downstream connections open at once on any one data-path listener (a port, over all
    /// its addresses), so that a flood on one (inbound, from the network) leaves room for the
    /// others (outbound, the application's own calls).
    pub max_connections_per_listener: Option<NonZeroU32>,
}

impl OverloadConfig {
    /// The global limit when none is configured, for an open-file limit of `nofile`: 40 % of
    /// it. A proxied connection holds two descriptors (downstream and upstream), so at the
    /// limit 80 % of the table is in use and the rest is left for listeners, idle pooled
    /// upstream connections, the control plane, DNS and files; Envoy likewise advises a
    /// global limit well below the descriptor limit.
    pub fn default_max_connections(nofile: u64) -> u32 {
        u32::try_from(nofile / 5 * 2).unwrap_or(u32::MAX).max(1)
    }

    /// The per-listener limit when none is configured: three quarters of the global one, so
    /// one listener's flood leaves a quarter for the others.
    pub fn default_max_connections_per_listener(global: u32) -> u32 {
        (u64::from(global) * 3 / 4)
            .try_into()
            .unwrap_or(u32::MAX)
            .max(1)
    }

    /// The limits in force for an open-file limit of `nofile`: (global, per listener).
    pub fn limits(&self, nofile: u64) -> (u32, u32) {
        let global = self
            .max_connections
            .map_or_else(|| Self::default_max_connections(nofile), NonZeroU32::get);
        let per_listener = self.max_connections_per_listener.map_or_else(
            || Self::default_max_connections_per_listener(global),
            NonZeroU32::get,
        );
        (global, per_listener)
    }

    pub(crate) fn validate(&self) -> Result<(), (String, String)> {
        if let (Some(global), Some(listener)) =
            (self.max_connections, self.max_connections_per_listener)
        {
            if listener > global {
                return Err((
                    "overload.max_connections_per_listener".into(),
                    format!(
                        "{listener} is above overload.max_connections ({global}): the global \
                         limit would always be reached first"
                    ),
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_leave_room_for_the_upstream_leg() {
        // Two descriptors per proxied connection: the default stays below half the table.
        for nofile in [256, 1024, 65_536, 1_048_576] {
            let (global, listener) = OverloadConfig::default().limits(nofile);
            assert!(u64::from(global) * 2 < nofile, "{nofile}: {global}");
            assert!(listener < global);
        }
        assert_eq!(OverloadConfig::default().limits(1024), (408, 306));
    }

    #[test]
    fn configured_values_win() {
        let c = OverloadConfig {
            max_connections: NonZeroU32::new(100),
            max_connections_per_listener: None,
        };
        assert_eq!(c.limits(1_048_576), (100, 75));
    }
}
