//! What a route does to a request besides choosing its backend: headers set, added or removed
//! on the request and on the response, a redirect, a path-prefix rewrite. Ingress annotations
//! fill them today (`hafleet.io/request-headers-set`, …), HTTPRoute filters next. Every string
//! is an allowlisted newtype: none can end a quoted HAProxy word, start a sample expression
//! (`%`), name an environment variable (`$`) or hold a control character.

use crate::values::{InvalidValue, check_len, rule};
use crate::{HttpHost, HttpPath};
use serde::{Deserialize, Serialize};
use std::fmt;

crate::values::validated_string!(
    /// An HTTP header name a route sets, adds or removes: 1 to 64 letters, digits, `-` and
    /// `_`. Never one that frames the message or the connection (`Content-Length`,
    /// `Transfer-Encoding`, `Connection`, `Upgrade`, …): a route cannot smuggle a request.
    HeaderName,
    "header name",
    |what, value| {
        check_len(what, value, 64)?;
        if !value.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') {
            return Err(rule(what, value, "only letters, digits, '-' and '_'"));
        }
        if FRAMING.iter().any(|f| f.eq_ignore_ascii_case(value)) {
            return Err(rule(what, value, "frames the message or the connection"));
        }
        Ok(())
    }
);

/// Headers no route may touch: they say where a message ends or what the connection is.
const FRAMING: &[&str] = &[
    "content-length",
    "transfer-encoding",
    "connection",
    "upgrade",
    "te",
    "trailer",
    "keep-alive",
    "proxy-connection",
];

crate::values::validated_string!(
    /// An HTTP header value a route sets or adds: 1 to 512 printable ASCII characters without
    /// `"`, `'`, `\`, `$` or `%`, not starting or ending with a space. HAProxy reads it inside
    /// double quotes as a plain string.
    HeaderValue,
    "header value",
    |what, value| {
        check_len(what, value, 512)?;
        let inert = |b: u8| (0x20..0x7f).contains(&b) && !b"\"'\\$%".contains(&b);
        if !value.bytes().all(inert) {
            return Err(rule(
                what,
                value,
                "only printable ASCII without '\"', ''', '\\', '$' and '%'",
            ));
        }
        if value.starts_with(' ') || value.ends_with(' ') {
            return Err(rule(what, value, "must not start or end with a space"));
        }
        Ok(())
    }
);

/// Header changes, in the order HAProxy applies them: remove, then set, then add.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct HeaderRules {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub remove: Vec<HeaderName>,
    /// Replaces every value the header had.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub set: Vec<(HeaderName, HeaderValue)>,
    /// Adds a value, keeping the ones there.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub add: Vec<(HeaderName, HeaderValue)>,
}

impl HeaderRules {
    pub fn is_empty(&self) -> bool {
        self.remove.is_empty() && self.set.is_empty() && self.add.is_empty()
    }
}

/// `http` or `https`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scheme {
    Http,
    Https,
}

impl Scheme {
    pub fn as_str(&self) -> &'static str {
        match self {
            Scheme::Http => "http",
            Scheme::Https => "https",
        }
    }
}

/// Where a route sends its requests instead of a backend.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Redirect {
    /// `None`: the request's (an HTTPRoute's redirect may leave it out; an Ingress's never
    /// does, so its messages keep their bytes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheme: Option<Scheme>,
    /// `None`: the request's host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<HttpHost>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// The path of the new location; `None`: the request's path and query, as they came
    /// (or with the route's prefix replaced, with `prefix_to`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<HttpPath>,
    /// The route's path prefix replaced in the new location (an HTTPRoute's
    /// `ReplacePrefixMatch`), the rest of the path kept. Of schema 8.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix_to: Option<PathRewrite>,
    /// 301, 302, 303, 307 or 308.
    pub code: u16,
}

/// The status codes a redirect may answer with.
pub const REDIRECT_CODES: [u16; 5] = [301, 302, 303, 307, 308];

impl Redirect {
    /// Checks what serde cannot: a status code HAProxy redirects with, and a host that is
    /// not a wildcard.
    pub fn check(&self) -> Result<(), InvalidValue> {
        if !REDIRECT_CODES.contains(&self.code) {
            return Err(rule(
                "redirect code",
                &self.code.to_string(),
                "must be 301, 302, 303, 307 or 308",
            ));
        }
        if let Some(host) = &self.host
            && host.as_str().starts_with('*')
        {
            return Err(rule("redirect host", host.as_str(), "must not be a wildcard"));
        }
        Ok(())
    }

    /// `scheme://host[:port]`, where the scheme and host are known (an Ingress's redirect);
    /// a port that is the scheme's own is left out.
    pub fn origin(&self) -> String {
        let scheme = self.scheme.map_or("http", |s| s.as_str());
        let host = self.host.as_ref().map_or("", |h| h.as_str());
        match self.port {
            Some(port) if !self.is_default_port(port) => format!("{scheme}://{host}:{port}"),
            _ => format!("{scheme}://{host}"),
        }
    }

    /// Whether `port` is the well-known port of the redirect's scheme (80 for http, 443 for
    /// https), which a Location leaves out.
    pub fn is_default_port(&self, port: u16) -> bool {
        matches!((self.scheme, port), (Some(Scheme::Http), 80) | (Some(Scheme::Https), 443))
    }
}

/// A route's path prefix replaced before the request reaches the backend: `from` (the route's
/// own path) becomes `to`, whole segments only, the rest of the path and the query kept.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct PathRewrite {
    pub from: HttpPath,
    pub to: HttpPath,
    /// The route matches `from` exactly: only that path is rewritten.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub exact: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_names_and_values_are_inert_and_framing_headers_are_refused() {
        for ok in ["X-Env", "x_team", "Cache-Control", "A1"] {
            HeaderName::new(ok).unwrap();
        }
        for bad in ["", "X Env", "X:Env", "Content-Length", "transfer-encoding", "Connection"] {
            assert!(HeaderName::new(bad).is_err(), "{bad}");
        }
        for ok in ["prod", "max-age=60, public", "a b", "<https://x.example>; rel=preload"] {
            HeaderValue::new(ok).unwrap();
        }
        for bad in ["", " a", "a ", "\"", "a'b", "a\\b", "${HOME}", "%[src]", "a\nb", "é"] {
            assert!(HeaderValue::new(bad).is_err(), "{bad:?}");
        }
        assert!(HeaderValue::new("x".repeat(513)).is_err());
    }

    #[test]
    fn a_redirect_takes_only_codes_haproxy_redirects_with() {
        let r = Redirect {
            scheme: Some(Scheme::Https),
            host: Some(HttpHost::new("www.example.com").unwrap()),
            port: Some(8443),
            path: None,
            prefix_to: None,
            code: 301,
        };
        r.check().unwrap();
        assert_eq!(r.origin(), "https://www.example.com:8443");
        assert!(Redirect { code: 200, ..r.clone() }.check().is_err());
        let wild = HttpHost::new("*.example.com").unwrap();
        assert!(Redirect { host: Some(wild), ..r }.check().is_err());
    }
}
