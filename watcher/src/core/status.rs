//! What an Ingress's `status.loadBalancer.ingress` should say. Pure.
//!
//! Each fleet may have published addresses (`--fleet-addresses`): where its HAProxy hosts, or
//! the load balancer or DNS name in front of them, take traffic. An Ingress routed on such a
//! fleet shows them, so `kubectl get ingress` says where it went live. The value depends only on
//! the fleet, so it never flaps between two watchers.

use hafleet_proto::{FleetName, HttpHost};
use k8s_openapi::api::networking::v1::{Ingress, IngressLoadBalancerIngress};
use std::collections::BTreeMap;
use std::net::IpAddr;

/// Each fleet's published addresses, as status entries (an `ip` or a `hostname` each).
pub type FleetAddresses = BTreeMap<FleetName, Vec<IngressLoadBalancerIngress>>;

/// Reads `edge=192.0.2.10,192.0.2.11 core=lb.example.com`: fleets separated by spaces (or
/// `;`), each `fleet=` and its addresses (IPs or hostnames) separated by commas, kept in the
/// order given.
pub fn parse(value: &str) -> Result<FleetAddresses, String> {
    let mut out = FleetAddresses::new();
    for entry in value.split([' ', ';', '\n']).map(str::trim).filter(|e| !e.is_empty()) {
        let (fleet, addresses) =
            entry.split_once('=').ok_or_else(|| format!("{entry:?} is not fleet=address,…"))?;
        let fleet = FleetName::new(fleet).map_err(|e| e.to_string())?;
        let mut list = Vec::new();
        for a in addresses.split(',').map(str::trim).filter(|a| !a.is_empty()) {
            list.push(match a.parse::<IpAddr>() {
                Ok(ip) => {
                    IngressLoadBalancerIngress { ip: Some(ip.to_string()), ..Default::default() }
                }
                Err(_) => {
                    let host = HttpHost::new(a).map_err(|e| e.to_string())?;
                    IngressLoadBalancerIngress {
                        hostname: Some(host.to_string()),
                        ..Default::default()
                    }
                }
            });
        }
        if list.is_empty() {
            return Err(format!("fleet {fleet} has no address"));
        }
        if out.insert(fleet.clone(), list).is_some() {
            return Err(format!("fleet {fleet} is given twice"));
        }
    }
    Ok(out)
}

/// Whether `ingress`'s status already says `want`.
pub fn shows(ingress: &Ingress, want: &[IngressLoadBalancerIngress]) -> bool {
    let have = ingress
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_deref())
        .unwrap_or_default();
    have == want
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fleets_addresses_are_read_and_written_as_kubernetes_shows_them() {
        let all = parse("edge=192.0.2.10,192.0.2.11 core=lb.example.com;x=2001:db8::1").unwrap();
        let edge = all[&FleetName::new("edge").unwrap()].clone();
        assert_eq!(edge.len(), 2);
        assert_eq!(edge[0].ip.as_deref(), Some("192.0.2.10"));
        let core = &all[&FleetName::new("core").unwrap()];
        assert_eq!(core[0].hostname.as_deref(), Some("lb.example.com"));
        assert!(parse("").unwrap().is_empty());
        for bad in ["edge", "edge=", "Edge=1.2.3.4", "edge=1.2.3.4 edge=1.2.3.5", "edge=a b}"] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
        let mut ing = Ingress::default();
        assert!(!shows(&ing, &edge));
        assert!(shows(&ing, &[]));
        ing.status = Some(k8s_openapi::api::networking::v1::IngressStatus {
            load_balancer: Some(k8s_openapi::api::networking::v1::IngressLoadBalancerStatus {
                ingress: Some(edge.clone()),
            }),
        });
        assert!(shows(&ing, &edge));
    }
}
