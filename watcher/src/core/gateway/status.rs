//! What the status of hafleet's GatewayClasses, Gateways and HTTPRoutes should say. Pure: each
//! function returns the whole new `status`, or `None` when the object already says it (so a
//! pass writes only what changed, and a condition keeps its `lastTransitionTime` while its
//! status stays).

use super::route::{Condition, ParentStatus};
use super::spec::{GROUP, ParentRef};
use super::{CONTROLLER_NAME, GatewayView};
use crate::core::status::FleetAddresses;
use kube::api::DynamicObject;
use serde_json::{Value, json};
use std::collections::BTreeMap;

/// The status of one of hafleet's GatewayClasses.
pub fn class_status(class: &DynamicObject, now: &str) -> Option<Value> {
    let accepted = Condition {
        type_: "Accepted",
        ok: true,
        reason: "Accepted",
        message: "hafleet serves the Gateways of this class".into(),
    };
    let old = class.data.get("status");
    let conditions = conditions(&[accepted], generation(class), old, now);
    changed(old, json!({ "conditions": conditions }))
}

/// Why Secret (namespace, name) cannot be served, if it cannot.
pub type Unusable<'a> = dyn Fn(&str, &str) -> Option<String> + 'a;

/// The status of one of hafleet's Gateways: accepted when it names a fleet, its addresses the
/// fleet's (`--fleet-addresses`), and per listener whether it is served and how many routes
/// are attached to it (`attached`: by listener name).
///
/// `served`: the version its fleet's hosts all run and how many they are, once that version
/// holds what was last published for the routes attached to it (`Programmed`). `unusable`
/// says why a listener's certificate Secret (namespace, name) cannot be served, if it cannot.
pub fn gateway_status(
    gw: &GatewayView,
    attached: &BTreeMap<&str, usize>,
    addresses: &FleetAddresses,
    (served, unusable): (Option<(u64, usize)>, &Unusable<'_>),
    now: &str,
) -> Option<Value> {
    let object = &gw.object;
    let old = object.data.get("status");
    let observed = generation(object);
    let (accepted, programmed) = match &gw.fleet {
        Ok(fleet) => (
            Condition {
                type_: "Accepted",
                ok: true,
                reason: "Accepted",
                message: format!("served by fleet {fleet}"),
            },
            match served {
                Some((version, hosts)) => Condition {
                    type_: "Programmed",
                    ok: true,
                    reason: "Programmed",
                    message: format!("fleet {fleet} serves it: version {version} on {hosts} hosts"),
                },
                None => Condition {
                    type_: "Programmed",
                    ok: false,
                    reason: "Pending",
                    message: format!("waiting for every host of fleet {fleet} to serve it"),
                },
            },
        ),
        Err(why) => (
            Condition { type_: "Accepted", ok: false, reason: "Invalid", message: why.clone() },
            Condition { type_: "Programmed", ok: false, reason: "Invalid", message: why.clone() },
        ),
    };
    let old_listeners = old.and_then(|s| s.get("listeners")).and_then(Value::as_array);
    let listeners: Vec<Value> = gw
        .listeners
        .iter()
        .map(|l| {
            let name = l.spec.name.as_str();
            let old = old_listeners.and_then(|ls| {
                ls.iter().find(|o| o.get("name").and_then(Value::as_str) == Some(name))
            });
            let (ok, reason, message) = match &l.refused {
                None => (true, "Accepted", "served".to_owned()),
                Some((reason, message)) => (false, *reason, message.clone()),
            };
            let listener_accepted = Condition { type_: "Accepted", ok, reason, message };
            let unresolved = l.unresolved.clone().or_else(|| {
                let (ns, name) = l.cert.as_ref()?;
                let why = unusable(ns, name)?;
                Some(("InvalidCertificateRef", format!("Secret {ns}/{name}: {why}")))
            });
            let resolved = match (&unresolved, &l.cert) {
                (Some((reason, message)), _) => {
                    Condition { type_: "ResolvedRefs", ok: false, reason, message: message.clone() }
                }
                (None, Some((ns, name))) => Condition {
                    type_: "ResolvedRefs",
                    ok: true,
                    reason: "ResolvedRefs",
                    message: format!("its certificate is Secret {ns}/{name}'s"),
                },
                (None, None) => Condition {
                    type_: "ResolvedRefs",
                    ok: true,
                    reason: "ResolvedRefs",
                    message: "nothing to resolve".into(),
                },
            };
            let serves = ok && unresolved.is_none();
            let listener_programmed = Condition {
                type_: "Programmed",
                ok: programmed.ok && serves,
                reason: if serves { programmed.reason } else { "Invalid" },
                message: match &unresolved {
                    Some((_, why)) => why.clone(),
                    None => programmed.message.clone(),
                },
            };
            let conflicted = match &l.refused {
                Some((super::PORT_UNAVAILABLE, why)) => Condition {
                    type_: "Conflicted",
                    ok: true,
                    reason: "ProtocolConflict",
                    message: why.clone(),
                },
                _ => Condition {
                    type_: "Conflicted",
                    ok: false,
                    reason: "NoConflicts",
                    message: "no conflict".into(),
                },
            };
            let kinds: Vec<Value> = match super::RouteKind::of_protocol(&l.spec.protocol) {
                Some(kind) => vec![json!({"group": GROUP, "kind": kind.kind()})],
                None => vec![],
            };
            json!({
                "name": name,
                "supportedKinds": kinds,
                "attachedRoutes": attached.get(name).copied().unwrap_or(0),
                "conditions": conditions(
                    &[listener_accepted, resolved, listener_programmed, conflicted],
                    observed,
                    old,
                    now,
                ),
            })
        })
        .collect();
    let addresses: Vec<Value> = match &gw.fleet {
        Ok(fleet) => addresses
            .get(fleet)
            .into_iter()
            .flatten()
            .filter_map(|a| match (&a.ip, &a.hostname) {
                (Some(ip), _) => Some(json!({"type": "IPAddress", "value": ip})),
                (_, Some(h)) => Some(json!({"type": "Hostname", "value": h})),
                _ => None,
            })
            .collect(),
        Err(_) => vec![],
    };
    let mut status = json!({
        "conditions": conditions(&[accepted, programmed], observed, old, now),
        "listeners": listeners,
    });
    if !addresses.is_empty() {
        status["addresses"] = Value::Array(addresses);
    }
    changed(old, status)
}

/// The status of an HTTPRoute: hafleet's entry for each of `parents` (none: it no longer has
/// one, and hafleet's old entries go), the other controllers' entries kept as they are.
pub fn route_status(route: &DynamicObject, parents: &[ParentStatus], now: &str) -> Option<Value> {
    let old = route.data.get("status");
    let old_parents = old.and_then(|s| s.get("parents")).and_then(Value::as_array);
    let theirs = old_parents
        .into_iter()
        .flatten()
        .filter(|p| p.get("controllerName").and_then(Value::as_str) != Some(CONTROLLER_NAME));
    let observed = generation(route);
    let mut list: Vec<Value> = theirs.cloned().collect();
    for p in parents {
        let written = parent_ref_json(&p.parent_ref);
        let old = old_parents.into_iter().flatten().find(|o| {
            o.get("controllerName").and_then(Value::as_str) == Some(CONTROLLER_NAME)
                && o.get("parentRef") == Some(&written)
        });
        list.push(json!({
            "parentRef": written,
            "controllerName": CONTROLLER_NAME,
            "conditions": conditions(&p.conditions, observed, old, now),
        }));
    }
    if old.is_none() && list.is_empty() {
        return None;
    }
    changed(old, json!({ "parents": list }))
}

/// A parentRef as the status writes it back: the fields the route wrote, with the group and
/// kind filled in.
fn parent_ref_json(p: &ParentRef) -> Value {
    let mut v = json!({
        "group": p.group.as_deref().unwrap_or(GROUP),
        "kind": p.kind.as_deref().unwrap_or("Gateway"),
        "name": p.name,
    });
    if let Some(ns) = &p.namespace {
        v["namespace"] = json!(ns);
    }
    if let Some(s) = &p.section_name {
        v["sectionName"] = json!(s);
    }
    if let Some(port) = p.port {
        v["port"] = json!(port);
    }
    v
}

fn generation(object: &DynamicObject) -> i64 {
    object.metadata.generation.unwrap_or(0)
}

/// Conditions as the API writes them; each keeps the `lastTransitionTime` it had in `old`
/// (an object with a `conditions` list) while its status stays.
fn conditions(list: &[Condition], observed: i64, old: Option<&Value>, now: &str) -> Vec<Value> {
    let old = old.and_then(|o| o.get("conditions")).and_then(Value::as_array);
    list.iter()
        .map(|c| {
            let status = if c.ok { "True" } else { "False" };
            let since = old
                .into_iter()
                .flatten()
                .find(|o| o.get("type").and_then(Value::as_str) == Some(c.type_))
                .filter(|o| o.get("status").and_then(Value::as_str) == Some(status))
                .and_then(|o| o.get("lastTransitionTime").and_then(Value::as_str))
                .unwrap_or(now);
            json!({
                "type": c.type_,
                "status": status,
                "reason": c.reason,
                "message": c.message,
                "observedGeneration": observed,
                "lastTransitionTime": since,
            })
        })
        .collect()
}

fn changed(old: Option<&Value>, new: Value) -> Option<Value> {
    (old != Some(&new)).then_some(new)
}
