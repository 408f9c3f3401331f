//! NDS: istiod's `istio.networking.nds.v1.NameTable` into [`model::NameTable`]. envoy-types
//! does not know the message, so its prost form is declared here, with the field numbers of
//! istio/istio's `pkg/dns/proto/nds.proto` (the descriptor the field check reads is in
//! `descriptors.rs`).

use crate::model::name_table::{NameInfo, NameTable};
use crate::refusal::Fault;
use std::collections::BTreeMap;

/// `istio.networking.nds.v1.NameTable`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct NameTableProto {
    /// Hostname to its facts.
    #[prost(btree_map = "string, message", tag = "1")]
    pub table: BTreeMap<String, NameInfoProto>,
    /// The facts of the hostname the resource is named after (per-name NDS, which a newer
    /// istiod may send one resource per host); refused: Remora asks for the whole table.
    #[prost(message, optional, tag = "2")]
    pub name_info: Option<NameInfoProto>,
}

/// `istio.networking.nds.v1.NameTable.NameInfo`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct NameInfoProto {
    #[prost(string, repeated, tag = "1")]
    pub ips: Vec<String>,
    #[prost(string, tag = "2")]
    pub registry: String,
    #[prost(string, tag = "3")]
    pub shortname: String,
    #[prost(string, tag = "4")]
    pub namespace: String,
    #[prost(string, repeated, tag = "5")]
    pub alt_hosts: Vec<String>,
}

/// Convert the table. An address that is not an IP is refused with its host and index named:
/// pilot-agent would drop it, but an answer that silently lacks an address is the kind of
/// quiet change this proxy does not make.
pub(super) fn name_table(proto: &NameTableProto) -> Result<NameTable, Fault> {
    if proto.name_info.is_some() {
        return Err(Fault::new(
            "name_info",
            "per-name name tables are not supported (Remora subscribes to the whole table)",
        ));
    }
    let mut hosts = BTreeMap::new();
    for (host, info) in &proto.table {
        let at = format!("table[{host}]");
        if host.is_empty() {
            return Err(Fault::new(at, "empty hostname"));
        }
        let ips = info
            .ips
            .iter()
            .enumerate()
            .map(|(i, ip)| {
                ip.parse().map_err(|_| {
                    Fault::new(
                        format!("{at}.ips[{i}]"),
                        format!("{ip:?} is not an IP address"),
                    )
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        hosts.insert(
            host.clone(),
            NameInfo {
                ips,
                registry: info.registry.clone(),
                shortname: info.shortname.clone(),
                namespace: info.namespace.clone(),
                alt_hosts: info.alt_hosts.clone(),
            },
        );
    }
    Ok(NameTable { hosts })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::convert::{from_bytes, from_json};
    use prost::Message;
    use serde_json::json;

    fn info(ips: &[&str], registry: &str) -> NameInfoProto {
        NameInfoProto {
            ips: ips.iter().map(|s| (*s).to_owned()).collect(),
            registry: registry.into(),
            shortname: "reviews".into(),
            namespace: "bookinfo".into(),
            alt_hosts: vec![],
        }
    }

    #[test]
    fn istiods_table_converts_from_bytes_and_json() {
        let mut proto = NameTableProto::default();
        proto.table.insert(
            "reviews.bookinfo.svc.cluster.local".into(),
            info(&["10.96.0.7", "fd00::7"], "Kubernetes"),
        );
        proto
            .table
            .insert("api.example.com".into(), info(&["240.240.0.1"], "External"));
        let converted = from_bytes::<NameTableProto>(&proto.encode_to_vec()).expect("accepted");
        let reviews = &converted.model.hosts["reviews.bookinfo.svc.cluster.local"];
        assert_eq!(
            reviews.ips,
            vec![
                "10.96.0.7".parse::<std::net::IpAddr>().unwrap(),
                "fd00::7".parse().unwrap()
            ]
        );
        assert!(reviews.is_kubernetes());
        assert!(!converted.model.hosts["api.example.com"].is_kubernetes());
        // istiod's JSON (`/debug/ndsz`) reads the same.
        let from_json = from_json::<NameTableProto>(&json!({"table": {
            "reviews.bookinfo.svc.cluster.local": {"ips": ["10.96.0.7", "fd00::7"],
                "registry": "Kubernetes", "shortname": "reviews", "namespace": "bookinfo"},
            "api.example.com": {"ips": ["240.240.0.1"], "registry": "External",
                "shortname": "reviews", "namespace": "bookinfo"}}}))
        .expect("accepted");
        assert_eq!(from_json.model, converted.model);
    }

    #[test]
    fn a_bad_address_and_per_name_tables_are_refused_by_field() {
        let mut proto = NameTableProto::default();
        proto
            .table
            .insert("a.example.com".into(), info(&["10.0.0.1", "ten"], ""));
        let refusal = from_bytes::<NameTableProto>(&proto.encode_to_vec()).expect_err("refused");
        assert_eq!(refusal.path, "table[a.example.com].ips[1]");
        assert!(
            refusal.to_string().starts_with("name_table : "),
            "{refusal}"
        );
        let per_name = NameTableProto {
            table: BTreeMap::new(),
            name_info: Some(info(&["10.0.0.1"], "")),
        };
        let refusal = from_bytes::<NameTableProto>(&per_name.encode_to_vec()).expect_err("refused");
        assert_eq!(refusal.path, "name_info");
        // A field istio/istio's proto does not have (say, a newer one) is refused too.
        let mut bytes = NameTableProto::default().encode_to_vec();
        prost::encoding::encode_key(9, prost::encoding::WireType::Varint, &mut bytes);
        prost::encoding::encode_varint(1, &mut bytes);
        let refusal = from_bytes::<NameTableProto>(&bytes).expect_err("refused");
        assert!(
            refusal.reason.contains("unknown field number 9"),
            "{refusal}"
        );
    }
}
