//! Validated values. Every string that can reach `haproxy.cfg` or a NATS subject is one of these
//! newtypes, and the only ways to build one (`new`, `FromStr`, serde) run an allowlist check.
//! Allowlists, not denylists: a value is accepted only if every character is known to be inert
//! in HAProxy's config grammar (no spaces, quotes, `#`, `\`, `$`, braces or control characters).

use serde::{Deserialize, Serialize};
use std::fmt;

/// Why a value was refused. Messages name the value and the rule it broke, so they can be put in
/// a Kubernetes Event as they are.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidValue {
    #[error("{what} {value:?} is empty")]
    Empty { what: &'static str, value: String },
    #[error("{what} {value:?} is longer than {max} characters")]
    TooLong { what: &'static str, value: String, max: usize },
    #[error("{what} {value:?} is not allowed: {rule}")]
    Rule { what: &'static str, value: String, rule: &'static str },
}

pub(crate) fn rule(what: &'static str, value: &str, rule: &'static str) -> InvalidValue {
    InvalidValue::Rule { what, value: value.to_owned(), rule }
}

pub(crate) fn check_len(what: &'static str, value: &str, max: usize) -> Result<(), InvalidValue> {
    if value.is_empty() {
        return Err(InvalidValue::Empty { what, value: value.to_owned() });
    }
    if value.len() > max {
        return Err(InvalidValue::TooLong { what, value: value.to_owned(), max });
    }
    Ok(())
}

/// RFC 1123 label: lowercase alphanumerics and `-`, starting and ending alphanumeric, ≤ 63.
fn check_label(what: &'static str, value: &str) -> Result<(), InvalidValue> {
    check_len(what, value, 63)?;
    let ok_char = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-';
    if !value.chars().all(ok_char) {
        return Err(rule(what, value, "only lowercase letters, digits and '-' (RFC 1123 label)"));
    }
    if value.starts_with('-') || value.ends_with('-') {
        return Err(rule(what, value, "must start and end with a letter or digit"));
    }
    Ok(())
}

/// RFC 1123 subdomain: dot-separated labels, ≤ 253 in all.
fn check_subdomain(what: &'static str, value: &str) -> Result<(), InvalidValue> {
    check_len(what, value, 253)?;
    for label in value.split('.') {
        check_label(what, label).map_err(|_| {
            rule(what, value, "must be dot-separated RFC 1123 labels (lowercase, digits, '-')")
        })?;
    }
    Ok(())
}

macro_rules! validated_string {
    ($(#[$doc:meta])* $name:ident, $what:literal, $check:expr) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub struct $name(String);

        impl $name {
            /// Checks `value` against the allowlist; the only way in.
            pub fn new(value: impl Into<String>) -> Result<Self, InvalidValue> {
                let value = value.into();
                let check: fn(&'static str, &str) -> Result<(), InvalidValue> = $check;
                check($what, &value)?;
                Ok(Self(value))
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl TryFrom<String> for $name {
            type Error = InvalidValue;
            fn try_from(value: String) -> Result<Self, Self::Error> {
                Self::new(value)
            }
        }

        impl From<$name> for String {
            fn from(value: $name) -> String {
                value.0
            }
        }

        impl std::str::FromStr for $name {
            type Err = InvalidValue;
            fn from_str(value: &str) -> Result<Self, Self::Err> {
                Self::new(value)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }
    };
}

pub(crate) use validated_string;

validated_string!(
    /// A fleet: a set of HAProxy servers that run the same config. An RFC 1123 label, so it is
    /// one NATS subject token and a safe file and consumer name.
    FleetName,
    "fleet name",
    check_label
);

validated_string!(
    /// One HAProxy server of a fleet, as the applier's inventory names it. An RFC 1123 label.
    HostName,
    "host name",
    check_label
);

validated_string!(
    /// One Kubernetes cluster among several feeding the same fleets (`hafleet-watcher
    /// --cluster-id`). An RFC 1123 label, so it is one token in message ids, sled keys and the
    /// HAProxy names it qualifies (`be_shop_web_80:east`, server `node-1:east`).
    ClusterId,
    "cluster id",
    check_label
);

validated_string!(
    /// A Kubernetes namespace (RFC 1123 label).
    Namespace,
    "namespace",
    check_label
);

/// A Kubernetes object name as the API server checks it (`IsDNS1123Subdomain`): at most 253
/// characters of lowercase letters, digits, `-` and `.`, dot-separated parts that start and end
/// with a letter or digit, and no limit per part (unlike a host name's 63).
fn check_object_name(what: &'static str, value: &str) -> Result<(), InvalidValue> {
    check_len(what, value, 253)?;
    let ok_char = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-';
    for part in value.split('.') {
        let alnum =
            |c: Option<char>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
        if !part.chars().all(ok_char) || !alnum(part.chars().next()) || !alnum(part.chars().last())
        {
            return Err(rule(
                what,
                value,
                "must be lowercase letters, digits, '-' and '.', each part between dots \
                 starting and ending with a letter or digit (RFC 1123 subdomain)",
            ));
        }
    }
    Ok(())
}

validated_string!(
    /// A Kubernetes object name (RFC 1123 subdomain, as Kubernetes checks it: no limit per
    /// part): Ingress, Service, Secret or Node names.
    ObjectName,
    "object name",
    check_object_name
);

validated_string!(
    /// An HTTP host an Ingress rule matches: an RFC 1123 hostname in lowercase, or a wildcard
    /// host as Kubernetes defines it: `*.` and a hostname (`*.example.com` matches exactly one
    /// more label: `a.example.com`, not `example.com` nor `a.b.example.com`). `*` appears
    /// nowhere else.
    HttpHost,
    "host",
    |what, value| {
        let name = value.strip_prefix("*.").unwrap_or(value);
        check_subdomain(what, name).map_err(|_| {
            rule(
                what,
                value,
                "must be a lowercase RFC 1123 hostname, or '*.' followed by one (a wildcard)",
            )
        })
    }
);

validated_string!(
    /// A cookie name HAProxy inserts for stickiness: 1 to 64 ASCII letters, digits, `-` or `_`
    /// (a subset of RFC 6265's token).
    CookieName,
    "cookie name",
    |what, value| {
        check_len(what, value, 64)?;
        if !value.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') {
            return Err(rule(what, value, "only letters, digits, '-' and '_'"));
        }
        Ok(())
    }
);

validated_string!(
    /// A source network: an IPv4 or IPv6 address, or one with a prefix length (`10.0.0.0/8`,
    /// `2001:db8::/32`), written back in canonical form so equal networks compare equal.
    Cidr,
    "source network",
    |what, value| match parse_cidr(value) {
        Some(canonical) if canonical == value => Ok(()),
        Some(_) => Err(rule(what, value, "must be written in canonical form (use Cidr::parse)")),
        None => Err(rule(what, value, "must be an IP address or address/prefix-length")),
    }
);

/// `value` as `address/prefix` with the address canonical, or `None` if it is not a network.
fn parse_cidr(value: &str) -> Option<String> {
    let (addr, len) = match value.split_once('/') {
        Some((a, l)) => (a, Some(l)),
        None => (value, None),
    };
    let addr: std::net::IpAddr = addr.parse().ok()?;
    let max = if addr.is_ipv4() { 32 } else { 128 };
    let len: u8 = match len {
        Some(l) if !l.is_empty() && l.bytes().all(|b| b.is_ascii_digit()) && l.len() <= 3 => {
            l.parse().ok()?
        }
        Some(_) => return None,
        None => max,
    };
    (len <= max).then(|| format!("{addr}/{len}"))
}

impl Cidr {
    /// Reads a network as users write it (`10.0.0.0/8`, `192.168.1.1`, `2001:DB8::/32`).
    pub fn parse(value: &str) -> Result<Cidr, InvalidValue> {
        let canonical = parse_cidr(value.trim()).ok_or_else(|| {
            rule("source network", value, "must be an IP address or address/prefix-length")
        })?;
        Cidr::new(canonical)
    }
}

validated_string!(
    /// An HTTP path an Ingress rule matches. Starts with `/`; characters limited to RFC 3986
    /// unreserved characters, `/`, a few inert sub-delimiters (`+ , ; = : @ !`) and `%` followed
    /// by two hex digits. Nothing HAProxy's config parser treats specially.
    HttpPath,
    "path",
    |what, value| {
        check_len(what, value, 1024)?;
        if !value.starts_with('/') {
            return Err(rule(what, value, "must start with '/'"));
        }
        let bytes = value.as_bytes();
        let mut i = 0;
        while i < bytes.len() {
            let b = bytes[i];
            match b {
                b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' => {}
                b'-' | b'.' | b'_' | b'~' | b'/' | b'+' | b',' | b';' | b'=' | b':' | b'@'
                | b'!' => {}
                b'%' => {
                    let hex = |j: usize| bytes.get(j).is_some_and(|c| c.is_ascii_hexdigit());
                    if !(hex(i + 1) && hex(i + 2)) {
                        return Err(rule(what, value, "'%' must start a %XX escape"));
                    }
                    i += 2;
                }
                _ => {
                    return Err(rule(
                        what,
                        value,
                        "only letters, digits, '/', '-', '.', '_', '~', '+', ',', ';', '=', ':', \
                         '@', '!' and %XX escapes",
                    ));
                }
            }
            i += 1;
        }
        Ok(())
    }
);

impl HttpPath {
    /// The root path `/`.
    pub fn root() -> Self {
        Self("/".to_owned())
    }

    /// The path without a trailing `/` (except for the root). Kubernetes `Prefix` matching
    /// ignores a trailing slash: `/foo/` and `/foo` match the same requests.
    pub fn trimmed(&self) -> HttpPath {
        if self.0.len() > 1 && self.0.ends_with('/') {
            HttpPath(self.0.trim_end_matches('/').to_owned()).non_empty()
        } else {
            self.clone()
        }
    }

    fn non_empty(self) -> HttpPath {
        if self.0.is_empty() { HttpPath::root() } else { self }
    }
}

/// How a path matches, as Kubernetes defines it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum PathKind {
    /// The request path equals the rule's path.
    Exact,
    /// The request path's segments start with the rule's segments: `/foo` matches `/foo` and
    /// `/foo/bar`, not `/foobar`.
    Prefix,
}

impl PathKind {
    /// Parses Kubernetes' `pathType`. `ImplementationSpecific` is hafleet's choice to make; it
    /// means `Prefix` here, the behaviour users of other controllers expect most often.
    pub fn from_k8s(path_type: &str) -> Result<Self, InvalidValue> {
        match path_type {
            "Exact" => Ok(PathKind::Exact),
            "Prefix" | "ImplementationSpecific" => Ok(PathKind::Prefix),
            other => {
                Err(rule("pathType", other, "must be Exact, Prefix or ImplementationSpecific"))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_accept_rfc1123_and_refuse_the_rest() {
        for ok in ["edge", "a", "lb-1", "x0", &"a".repeat(63)] {
            assert!(FleetName::new(ok).is_ok(), "{ok}");
        }
        for bad in ["", "Edge", "-a", "a-", "a.b", "a b", "a_b", "é", &"a".repeat(64), "_x"] {
            assert!(FleetName::new(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn hosts_are_lowercase_hostnames_or_a_wildcard_first_label() {
        for ok in ["example.com", "a.b-c.d", "localhost", "x1.io", "*.example.com", "*.io"] {
            assert!(HttpHost::new(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "Example.com",
            "*",
            "*.",
            "*example.com",
            "a.*.example.com",
            "*.*.example.com",
            "**.example.com",
            "*.Example.com",
            "a..b",
            ".a",
            "a.",
            "a b",
            "a;b",
            "a\nuse_backend x",
            "a}",
            "exa\"mple",
            "ex$ample",
        ] {
            assert!(HttpHost::new(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn object_names_are_what_kubernetes_accepts() {
        let long_part = format!("w00000-{}", "x".repeat(240));
        let longest = format!("{}.{}", "a".repeat(126), "b".repeat(126));
        for ok in ["web", "a.b", "a-1.b-2", long_part.as_str(), longest.as_str()] {
            assert!(ObjectName::new(ok).is_ok(), "{ok}");
        }
        let too_long = "a".repeat(254);
        for bad in
            ["", "A", "a..b", ".a", "a.", "-a", "a-", "a.-b", "a_b", "a b", too_long.as_str()]
        {
            assert!(ObjectName::new(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn networks_are_read_as_users_write_them_and_kept_canonical() {
        assert_eq!(Cidr::parse("10.0.0.0/8").unwrap().as_str(), "10.0.0.0/8");
        assert_eq!(Cidr::parse(" 192.168.1.7 ").unwrap().as_str(), "192.168.1.7/32");
        assert_eq!(Cidr::parse("2001:DB8::/32").unwrap().as_str(), "2001:db8::/32");
        for bad in
            ["", "10.0.0.0/33", "10.0.0/8", "x", "10.0.0.0/", "10.0.0.0/+8", "::/129", "1.2.3.4 }"]
        {
            assert!(Cidr::parse(bad).is_err(), "{bad:?}");
        }
        assert!(Cidr::new("10.0.0.0/08").is_err(), "only canonical forms deserialize");
        assert!(CookieName::new("SERVERID").is_ok());
        for bad in ["", "a b", "a;b", "a=b", "x\n"] {
            assert!(CookieName::new(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn paths_refuse_everything_haproxy_could_read_as_syntax() {
        for ok in ["/", "/foo", "/foo/bar/", "/a-b_c.d~e", "/%2Fx", "/v1;x=1,y:2@h!", "/a+b"] {
            assert!(HttpPath::new(ok).is_ok(), "{ok}");
        }
        for bad in [
            "", "foo", "/a b", "/a#b", "/a\"b", "/a'b", "/a\\b", "/a$b", "/a{b}", "/a\nb", "/a\tb",
            "/%zz", "/%2", "/ü", "/a?b", "/a*b", "/a(b)", "/a&b",
        ] {
            assert!(HttpPath::new(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn trimmed_drops_trailing_slashes_but_keeps_the_root() {
        assert_eq!(HttpPath::new("/foo/").unwrap().trimmed().as_str(), "/foo");
        assert_eq!(HttpPath::new("/foo//").unwrap().trimmed().as_str(), "/foo");
        assert_eq!(HttpPath::new("/").unwrap().trimmed().as_str(), "/");
        assert_eq!(HttpPath::new("//").unwrap().trimmed().as_str(), "/");
        assert_eq!(HttpPath::new("/foo").unwrap().trimmed().as_str(), "/foo");
    }

    #[test]
    fn deserializing_runs_the_same_checks() {
        let ok: HttpHost = serde_json::from_str("\"example.com\"").unwrap();
        assert_eq!(ok.as_str(), "example.com");
        let bad = serde_json::from_str::<HttpHost>("\"evil.com\\nuse_backend x\"");
        assert!(bad.is_err());
        let bad = serde_json::from_str::<HttpPath>("\"/x y\"");
        assert!(bad.is_err());
    }

    #[test]
    fn path_types_follow_kubernetes() {
        assert_eq!(PathKind::from_k8s("Exact").unwrap(), PathKind::Exact);
        assert_eq!(PathKind::from_k8s("Prefix").unwrap(), PathKind::Prefix);
        assert_eq!(PathKind::from_k8s("ImplementationSpecific").unwrap(), PathKind::Prefix);
        assert!(PathKind::from_k8s("Regex").is_err());
    }
}
