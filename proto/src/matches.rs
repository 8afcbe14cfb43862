//! What a route asks of a request besides its host and path, and how it shares requests among
//! backends: the Gateway API's HTTPRoute matches (headers, query parameters, method) and
//! weighted `backendRefs`. Ingresses have neither. Every string is an allowlisted newtype, as
//! in [`crate::filters`]: HAProxy reads each as a plain word or a double-quoted string.

use crate::values::{InvalidValue, check_len, rule};
use crate::{Backend, HeaderName, HeaderValue};
use serde::{Deserialize, Serialize};
use std::fmt;

crate::values::validated_string!(
    /// A query parameter's name a route matches on: 1 to 64 letters, digits, `-`, `_` and
    /// `.`.
    ParamName,
    "query parameter name",
    |what, value| {
        check_len(what, value, 64)?;
        let ok = |b: u8| b.is_ascii_alphanumeric() || b"-_.".contains(&b);
        if !value.bytes().all(ok) {
            return Err(rule(what, value, "only letters, digits, '-', '_' and '.'"));
        }
        Ok(())
    }
);

/// An HTTP method a route matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Method {
    Get,
    Head,
    Post,
    Put,
    Delete,
    Connect,
    Options,
    Trace,
    Patch,
}

impl Method {
    /// The Gateway API's spelling (`GET`, …), the only one taken.
    pub fn parse(value: &str) -> Option<Method> {
        serde_json::from_value(serde_json::Value::String(value.to_owned())).ok()
    }

    pub fn as_str(&self) -> &'static str {
        match self {
            Method::Get => "GET",
            Method::Head => "HEAD",
            Method::Post => "POST",
            Method::Put => "PUT",
            Method::Delete => "DELETE",
            Method::Connect => "CONNECT",
            Method::Options => "OPTIONS",
            Method::Trace => "TRACE",
            Method::Patch => "PATCH",
        }
    }
}

/// What a route asks of a request besides its host and path (all of it: the matches of one
/// HTTPRoute match), and the other backends that share its requests by weight. Of route
/// schema [`crate::GATEWAY_SCHEMA_VERSION`].
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct RouteMore {
    /// Headers whose value must be exactly this (names without case).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// Query parameters whose value must be exactly this.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub query: Vec<(ParamName, HeaderValue)>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<Method>,
    /// Only requests that came over TLS (an HTTPRoute attached to HTTPS listeners only).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub tls: bool,
    /// The weight of the route's own backend when `split` is not empty (absent: 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<u32>,
    /// Other backends sharing the route's requests, each with its weight (more than 0).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub split: Vec<(u32, Backend)>,
    /// The route takes TLS connections whose SNI is its host, unopened, to its backend (a
    /// TLSRoute's passthrough): its path is `/` and means nothing, it asks nothing of a
    /// request (there is none to read), and its backend speaks TCP
    /// ([`crate::BackendOptions::tcp`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub passthrough: bool,
    /// The route takes every TCP connection to this port of the fleet's hosts (a TCPRoute's,
    /// bound at `$HAFLEET_TCP_ADDR`): its host and path mean nothing, and its backends speak
    /// TCP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
}

impl RouteMore {
    /// Whether it asks nothing and shares nothing: the same as none.
    pub fn is_empty(&self) -> bool {
        *self == RouteMore::default() || (self.has_no_conditions() && self.split.is_empty())
    }

    /// Whether it asks nothing of a request (it may still share it). A passthrough route asks
    /// nothing: it is chosen by its host (the SNI) alone.
    pub fn has_no_conditions(&self) -> bool {
        self.headers.is_empty() && self.query.is_empty() && self.method.is_none() && !self.tls
    }

    /// How it ranks among routes of the same host and path, the Gateway API's way: a method
    /// first, then more header matches, then more query matches; of routes equal in those,
    /// the one only served over TLS (which the Gateway API leaves to listeners).
    pub fn precedence(&self) -> (bool, usize, usize, bool) {
        (self.method.is_some(), self.headers.len(), self.query.len(), self.tls)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn methods_and_parameter_names_take_only_their_allowlists() {
        assert_eq!(Method::parse("GET"), Some(Method::Get));
        assert_eq!(Method::parse("get"), None);
        assert_eq!(Method::parse("PATCH").map(|m| m.as_str()), Some("PATCH"));
        for ok in ["q", "page.size", "a-b_c"] {
            ParamName::new(ok).unwrap();
        }
        for bad in ["", "a b", "a=b", "a&b", "%61", "a\"b"] {
            assert!(ParamName::new(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn more_that_asks_and_shares_nothing_is_none() {
        assert!(RouteMore::default().is_empty());
        assert!(RouteMore { weight: Some(3), ..Default::default() }.is_empty());
        let get = RouteMore { method: Some(Method::Get), ..Default::default() };
        assert!(!get.is_empty());
        assert!(get.precedence() > RouteMore::default().precedence());
    }
}
