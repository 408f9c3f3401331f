//! Tests of the ext_authz filter's pure parts.
