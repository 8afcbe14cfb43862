//! An Ingress's `hafleet.io/` annotations, read strictly. Pure.
//!
//! Every key under `hafleet.io/` must be one of [`KNOWN`]; each value has its own parser and
//! range, and a value out of range is an error, never clamped. Any error refuses the Ingress
//! (it keeps its last good routes, and the Event names the key and the reason); there is no
//! free-text snippet anywhere.

use crate::core::model::{SHARE_ANNOTATION, Sharing};
use hafleet_proto::{
    BackendOptions, Balance, Cidr, CookieName, HeaderName, HeaderValue, HttpHost, HttpPath,
    REDIRECT_CODES, Redirect, Scheme,
};
use std::collections::BTreeMap;

pub const PREFIX: &str = "hafleet.io/";

/// Every annotation hafleet reads, with what it takes: the reference for users (README) and for
/// the error that names an unknown key.
pub const KNOWN: &[(&str, &str)] = &[
    ("hafleet.io/fleet", "the fleet that serves the Ingress (an RFC 1123 label)"),
    (SHARE_ANNOTATION, "namespaces that may route this namespace's hosts: a,b or *"),
    ("hafleet.io/balance", "roundrobin, static-rr, leastconn, first, source or random"),
    ("hafleet.io/timeout-connect", "a duration from 1ms to 1h, e.g. 500ms, 5s, 2m"),
    ("hafleet.io/timeout-server", "a duration from 1ms to 1h"),
    (
        "hafleet.io/timeout-client",
        "a duration from 1s to 24h: the client's idle time on a request of this route \
         (HAProxy 3.0 and later; older HAProxy keeps the fleet's timeout-client)",
    ),
    ("hafleet.io/health-check-path", "an HTTP path servers are checked at (GET), e.g. /healthz"),
    ("hafleet.io/health-check-interval", "a duration from 100ms to 1h"),
    ("hafleet.io/sticky-cookie", "a cookie name (letters, digits, - and _; at most 64)"),
    ("hafleet.io/allow-source", "comma-separated IP addresses or networks (CIDR)"),
    ("hafleet.io/ssl-redirect", "true or false"),
    ("hafleet.io/max-conn", "most connections per server, 1 to 1000000"),
    ("hafleet.io/deny-source", "comma-separated IP addresses or networks (CIDR) that get 403"),
    ("hafleet.io/rate-limit", "most requests per second from one client address, 1 to 100000"),
    ("hafleet.io/timeout-tunnel", "idle time of an upgraded connection (WebSocket), 1s to 24h"),
    ("hafleet.io/request-headers-set", "lines of `Name: value`, set on the request"),
    ("hafleet.io/request-headers-add", "lines of `Name: value`, added to the request"),
    ("hafleet.io/request-headers-remove", "comma-separated header names, removed from the request"),
    ("hafleet.io/response-headers-set", "lines of `Name: value`, set on the response"),
    ("hafleet.io/response-headers-add", "lines of `Name: value`, added to the response"),
    (
        "hafleet.io/response-headers-remove",
        "comma-separated header names, removed from the response",
    ),
    (
        "hafleet.io/redirect-to",
        "a URL (http[s]://host[:port][/path]) every request is redirected to",
    ),
    ("hafleet.io/redirect-prefix", "http[s]://host[:port]: redirected there, path and query kept"),
    ("hafleet.io/redirect-code", "301, 302 (default), 303, 307 or 308"),
    ("hafleet.io/rewrite-path-prefix", "a path the route's path is replaced with on the way in"),
];

/// What an Ingress's annotations set.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Settings {
    pub options: BackendOptions,
    pub sharing: Sharing,
    /// `hafleet.io/rewrite-path-prefix`: each route's own path is replaced with this.
    pub rewrite_to: Option<HttpPath>,
}

/// Reads every `hafleet.io/` annotation; errors name the key and the reason.
pub fn read(annotations: Option<&BTreeMap<String, String>>) -> Result<Settings, Vec<String>> {
    let mut settings = Settings::default();
    let mut errors = Vec::new();
    let (mut redirect, mut redirect_prefix, mut code) = (None, None, None);
    let o = &mut settings.options;
    for (key, value) in annotations.into_iter().flatten() {
        let Some(name) = key.strip_prefix(PREFIX) else { continue };
        let v = value.trim();
        let result: Result<(), String> = match name {
            "fleet" => Ok(()), // read (and checked) with the rest of the Ingress
            "share-hosts-with" => Sharing::parse(v).map(|s| settings.sharing = s),
            "balance" => balance(v).map(|b| o.balance = Some(b)),
            "timeout-connect" => millis(v, 1, HOUR).map(|d| o.timeout_connect_ms = Some(d)),
            "timeout-server" => millis(v, 1, HOUR).map(|d| o.timeout_server_ms = Some(d)),
            "timeout-client" => millis(v, 1_000, 24 * HOUR).map(|d| o.timeout_client_ms = Some(d)),
            "health-check-path" => {
                HttpPath::new(v).map(|p| o.health_check_path = Some(p)).map_err(|e| e.to_string())
            }
            "health-check-interval" => {
                millis(v, 100, HOUR).map(|d| o.health_check_interval_ms = Some(d))
            }
            "sticky-cookie" => {
                CookieName::new(v).map(|c| o.sticky_cookie = Some(c)).map_err(|e| e.to_string())
            }
            "allow-source" => networks(v).map(|n| o.allow_source = n),
            "ssl-redirect" => match v {
                "true" | "false" => {
                    o.ssl_redirect = Some(v == "true");
                    Ok(())
                }
                _ => Err("must be true or false".into()),
            },
            "max-conn" => number(v, 1, 1_000_000).map(|n| o.max_conn = Some(n)),
            "deny-source" => networks(v).map(|n| o.deny_source = n),
            "rate-limit" => number(v, 1, 100_000).map(|n| o.rate_limit_rps = Some(n)),
            "timeout-tunnel" => millis(v, 1_000, 24 * HOUR).map(|d| o.timeout_tunnel_ms = Some(d)),
            "request-headers-set" => header_lines(v).map(|h| o.request_headers.set = h),
            "request-headers-add" => header_lines(v).map(|h| o.request_headers.add = h),
            "request-headers-remove" => header_names(v).map(|h| o.request_headers.remove = h),
            "response-headers-set" => header_lines(v).map(|h| o.response_headers.set = h),
            "response-headers-add" => header_lines(v).map(|h| o.response_headers.add = h),
            "response-headers-remove" => header_names(v).map(|h| o.response_headers.remove = h),
            "redirect-to" => redirect_url(v, true).map(|r| redirect = Some(r)),
            "redirect-prefix" => redirect_url(v, false).map(|r| redirect_prefix = Some(r)),
            "redirect-code" => redirect_code(v).map(|c| code = Some(c)),
            "rewrite-path-prefix" => {
                HttpPath::new(v).map(|p| settings.rewrite_to = Some(p)).map_err(|e| e.to_string())
            }
            _ => Err(format!(
                "is not a hafleet annotation (known: {})",
                KNOWN
                    .iter()
                    .map(|(k, _)| k.trim_start_matches(PREFIX))
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
        };
        if let Err(why) = result {
            errors.push(format!("annotation {key}={:?} {why}", shortened(value)));
        }
    }
    match (redirect, redirect_prefix) {
        (Some(_), Some(_)) => errors.push(format!(
            "annotations {PREFIX}redirect-to and {PREFIX}redirect-prefix cannot both be set"
        )),
        (Some(mut r), None) | (None, Some(mut r)) => {
            r.code = code.unwrap_or(302);
            o.redirect = Some(Box::new(r));
        }
        (None, None) if code.is_some() => errors.push(format!(
            "annotation {PREFIX}redirect-code needs {PREFIX}redirect-to or {PREFIX}redirect-prefix"
        )),
        (None, None) => {}
    }
    if o.redirect.is_some() && settings.rewrite_to.is_some() {
        errors.push(format!(
            "annotations {PREFIX}rewrite-path-prefix and a redirect cannot both be set: a \
             redirected request never reaches the backend"
        ));
    }
    match errors.is_empty() {
        true => Ok(settings),
        false => Err(errors),
    }
}

const HOUR: u32 = 3_600_000;

/// A value as an error quotes it: whole up to 64 characters, else its first 48 and how long it
/// is, so that the reason after it survives an Event's 1 KB note.
fn shortened(value: &str) -> String {
    if value.chars().count() <= 64 {
        return value.to_owned();
    }
    let head: String = value.chars().take(48).collect();
    format!("{head}… ({} characters)", value.chars().count())
}

fn balance(v: &str) -> Result<Balance, String> {
    Balance::ALL.iter().find(|(name, _)| *name == v).map(|(_, b)| *b).ok_or_else(|| {
        let all: Vec<&str> = Balance::ALL.iter().map(|(n, _)| *n).collect();
        format!("must be one of {}", all.join(", "))
    })
}

/// A whole number in `min..=max`.
pub(crate) fn number(v: &str, min: u32, max: u32) -> Result<u32, String> {
    let n: u32 = match v.bytes().all(|b| b.is_ascii_digit()) && !v.is_empty() && v.len() <= 10 {
        true => v.parse().map_err(|_| format!("must be a whole number from {min} to {max}"))?,
        false => return Err(format!("must be a whole number from {min} to {max}")),
    };
    match (min..=max).contains(&n) {
        true => Ok(n),
        false => Err(format!("must be from {min} to {max}")),
    }
}

/// A duration (`<whole number><ms|s|m|h>`) in milliseconds, in `min..=max`.
pub(crate) fn millis(v: &str, min: u32, max: u32) -> Result<u32, String> {
    let shape = || {
        format!(
            "must be a whole number with a unit (ms, s, m, h), from {} to {}",
            hafleet_proto::duration_text(min),
            hafleet_proto::duration_text(max)
        )
    };
    let split = v.find(|c: char| !c.is_ascii_digit()).ok_or_else(shape)?;
    let (n, unit) = v.split_at(split);
    if n.is_empty() || n.len() > 9 {
        return Err(shape());
    }
    let n: u64 = n.parse().map_err(|_| shape())?;
    let ms = match unit {
        "ms" => n,
        "s" => n * 1_000,
        "m" => n * 60_000,
        "h" => n * 3_600_000,
        _ => return Err(shape()),
    };
    match u32::try_from(ms) {
        Ok(ms) if (min..=max).contains(&ms) => Ok(ms),
        _ => Err(shape()),
    }
}

/// Lines of `Name: value` (at most 32), each name once.
fn header_lines(v: &str) -> Result<Vec<(HeaderName, HeaderValue)>, String> {
    let mut out: Vec<(HeaderName, HeaderValue)> = Vec::new();
    for line in v.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let (name, value) =
            line.split_once(':').ok_or_else(|| format!("line {line:?} is not `Name: value`"))?;
        let name = HeaderName::new(name.trim()).map_err(|e| e.to_string())?;
        let value = HeaderValue::new(value.trim()).map_err(|e| e.to_string())?;
        if out.iter().any(|(n, _)| n.as_str().eq_ignore_ascii_case(name.as_str())) {
            return Err(format!("names header {name} twice"));
        }
        out.push((name, value));
    }
    match out.len() {
        0 => Err("must have at least one `Name: value` line".into()),
        n if n > 32 => Err("has more than 32 headers".into()),
        _ => Ok(out),
    }
}

/// Comma-separated header names (at most 32).
fn header_names(v: &str) -> Result<Vec<HeaderName>, String> {
    let names: Vec<HeaderName> = v
        .split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .map(|n| HeaderName::new(n).map_err(|e| e.to_string()))
        .collect::<Result<_, _>>()?;
    match names.len() {
        0 => Err("must name at least one header".into()),
        n if n > 32 => Err("names more than 32 headers".into()),
        _ => Ok(names),
    }
}

/// `http[s]://host[:port]`, and with `path` a path after it (`/` when none is written).
fn redirect_url(v: &str, path: bool) -> Result<Redirect, String> {
    let shape = || match path {
        true => "must be http://HOST[:PORT][/PATH] or https://… (no query)".to_owned(),
        false => "must be http://HOST[:PORT] or https://HOST[:PORT] (the path is kept)".to_owned(),
    };
    let (scheme, rest) = match v.split_once("://") {
        Some(("http", rest)) => (Scheme::Http, rest),
        Some(("https", rest)) => (Scheme::Https, rest),
        _ => return Err(shape()),
    };
    let (authority, p) = match rest.find('/') {
        Some(i) => (&rest[..i], Some(&rest[i..])),
        None => (rest, None),
    };
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) => (h, Some(p.parse::<u16>().ok().filter(|p| *p > 0).ok_or_else(shape)?)),
        None => (authority, None),
    };
    let host = HttpHost::new(host).map_err(|e| e.to_string())?;
    if host.as_str().starts_with('*') {
        return Err("must not redirect to a wildcard host".into());
    }
    let path = match (path, p) {
        (true, p) => Some(HttpPath::new(p.unwrap_or("/")).map_err(|e| e.to_string())?),
        (false, None | Some("/")) => None,
        (false, Some(_)) => return Err(shape()),
    };
    Ok(Redirect { scheme: Some(scheme), host: Some(host), port, path, prefix_to: None, code: 302 })
}

fn redirect_code(v: &str) -> Result<u16, String> {
    v.parse::<u16>()
        .ok()
        .filter(|c| REDIRECT_CODES.contains(c))
        .ok_or_else(|| "must be 301, 302, 303, 307 or 308".into())
}

fn networks(v: &str) -> Result<Vec<Cidr>, String> {
    let mut out: Vec<Cidr> = v
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|n| Cidr::parse(n).map_err(|e| e.to_string()))
        .collect::<Result<_, _>>()?;
    if out.is_empty() {
        return Err("must list at least one network".into());
    }
    if out.len() > 256 {
        return Err("lists more than 256 networks".into());
    }
    out.sort();
    out.dedup();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_one(key: &str, value: &str) -> Result<Settings, Vec<String>> {
        read(Some(&[(format!("hafleet.io/{key}"), value.to_owned())].into()))
    }

    #[test]
    fn every_annotation_is_read_into_its_option() {
        let all: BTreeMap<String, String> = [
            ("hafleet.io/fleet", "edge"),
            ("hafleet.io/balance", "leastconn"),
            ("hafleet.io/timeout-connect", "500ms"),
            ("hafleet.io/timeout-server", "2m"),
            ("hafleet.io/health-check-path", "/healthz"),
            ("hafleet.io/health-check-interval", "5s"),
            ("hafleet.io/sticky-cookie", "SRV"),
            ("hafleet.io/allow-source", "10.0.0.0/8, 192.168.1.7,10.0.0.0/8"),
            ("hafleet.io/ssl-redirect", "true"),
            ("hafleet.io/max-conn", "100"),
            ("hafleet.io/share-hosts-with", "team-b"),
            ("nginx.ingress.kubernetes.io/rewrite-target", "/"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        let s = read(Some(&all)).unwrap();
        let o = &s.options;
        assert_eq!(o.balance, Some(Balance::Leastconn));
        assert_eq!((o.timeout_connect_ms, o.timeout_server_ms), (Some(500), Some(120_000)));
        assert_eq!(o.health_check_path.as_ref().map(|p| p.as_str()), Some("/healthz"));
        assert_eq!(o.health_check_interval_ms, Some(5_000));
        assert_eq!(o.sticky_cookie.as_ref().map(|c| c.as_str()), Some("SRV"));
        let nets: Vec<&str> = o.allow_source.iter().map(|c| c.as_str()).collect();
        assert_eq!(nets, ["10.0.0.0/8", "192.168.1.7/32"], "sorted, each once");
        assert_eq!(o.ssl_redirect, Some(true));
        assert_eq!(o.max_conn, Some(100));
        assert_ne!(s.sharing, Sharing::Nobody);
        assert!(read(None).unwrap().options.is_default());
    }

    #[test]
    fn unknown_keys_and_bad_values_name_the_key_and_the_reason() {
        for (key, value, says) in [
            ("balanse", "leastconn", "is not a hafleet annotation (known: fleet"),
            ("balance", "fastest", "must be one of roundrobin"),
            ("timeout-connect", "5", "with a unit"),
            ("timeout-connect", "2h", "from 1ms to 1h"),
            ("timeout-server", "0s", "from 1ms"),
            ("timeout-server", "-5s", "with a unit"),
            ("timeout-client", "500ms", "from 1s to 24h"),
            ("timeout-client", "25h", "from 1s to 24h"),
            ("timeout-client", "90", "with a unit"),
            ("health-check-interval", "10ms", "from 100ms"),
            ("health-check-path", "/a b", "path"),
            ("sticky-cookie", "a;b", "cookie name"),
            ("allow-source", "10.0.0.0/33", "source network"),
            ("allow-source", " , ", "at least one network"),
            ("ssl-redirect", "yes", "true or false"),
            ("max-conn", "0", "from 1 to 1000000"),
            ("max-conn", "1e3", "whole number"),
            ("share-hosts-with", "Team", "namespace"),
            ("allow-source", &"10.0.0.1,".repeat(300), "… (2700 characters)\" lists more than 256"),
        ] {
            let errors = read_one(key, value).unwrap_err();
            assert_eq!(errors.len(), 1, "{key}: {errors:?}");
            assert!(errors[0].starts_with(&format!("annotation hafleet.io/{key}=")), "{errors:?}");
            assert!(errors[0].contains(says), "{key}={value}: {errors:?}");
        }
    }

    #[test]
    fn header_redirect_rewrite_deny_and_rate_annotations_are_read_strictly() {
        let all: BTreeMap<String, String> = [
            ("hafleet.io/request-headers-set", "X-Env: prod\nX-Team:  shop \n"),
            ("hafleet.io/request-headers-add", "Via: hafleet"),
            ("hafleet.io/request-headers-remove", "X-Debug, Cookie2"),
            ("hafleet.io/response-headers-set", "Cache-Control: max-age=60, public"),
            ("hafleet.io/response-headers-remove", "Server"),
            ("hafleet.io/deny-source", "10.1.0.0/16"),
            ("hafleet.io/rate-limit", "50"),
            ("hafleet.io/timeout-tunnel", "2h"),
            ("hafleet.io/timeout-client", "90s"),
            ("hafleet.io/rewrite-path-prefix", "/v2"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        let s = read(Some(&all)).unwrap();
        let o = &s.options;
        let pairs = |h: &[(HeaderName, HeaderValue)]| {
            h.iter().map(|(n, v)| format!("{n}={v}")).collect::<Vec<_>>()
        };
        assert_eq!(pairs(&o.request_headers.set), ["X-Env=prod", "X-Team=shop"]);
        assert_eq!(pairs(&o.request_headers.add), ["Via=hafleet"]);
        assert_eq!(o.request_headers.remove.len(), 2);
        assert_eq!(pairs(&o.response_headers.set), ["Cache-Control=max-age=60, public"]);
        assert_eq!((o.rate_limit_rps, o.timeout_tunnel_ms), (Some(50), Some(7_200_000)));
        assert_eq!(o.timeout_client_ms, Some(90_000));
        assert_eq!(o.deny_source.len(), 1);
        assert_eq!(s.rewrite_to.as_ref().map(|p| p.as_str()), Some("/v2"));

        let redirect = |pairs: &[(&str, &str)]| {
            let a: BTreeMap<String, String> =
                pairs.iter().map(|(k, v)| (format!("hafleet.io/{k}"), v.to_string())).collect();
            read(Some(&a))
        };
        let r = redirect(&[("redirect-to", "https://www.example.com:8443/new")]).unwrap();
        let r = r.options.redirect.unwrap();
        assert_eq!(
            (r.origin().as_str(), r.path.unwrap().as_str(), r.code),
            ("https://www.example.com:8443", "/new", 302)
        );
        let r = redirect(&[("redirect-prefix", "http://a.example.com"), ("redirect-code", "301")])
            .unwrap();
        let r = r.options.redirect.unwrap();
        assert_eq!((r.path, r.code), (None, 301));
        for (pairs, says) in [
            (&[("redirect-to", "ftp://x.example.com")][..], "must be http://HOST"),
            (&[("redirect-to", "https://x.example.com/a?b=c")], "path"),
            (&[("redirect-to", "https://*.example.com")], "wildcard"),
            (&[("redirect-prefix", "https://x.example.com/a")], "the path is kept"),
            (&[("redirect-code", "301")], "needs hafleet.io/redirect-to"),
            (&[("redirect-to", "https://a.example.com"), ("redirect-code", "200")], "301, 302"),
            (
                &[
                    ("redirect-to", "https://a.example.com"),
                    ("redirect-prefix", "https://b.example.com"),
                ],
                "cannot both",
            ),
            (
                &[("redirect-to", "https://a.example.com"), ("rewrite-path-prefix", "/x")],
                "never reaches",
            ),
            (&[("request-headers-set", "X-A prod")], "not `Name: value`"),
            (&[("request-headers-set", "X-A: %[src]")], "header value"),
            (&[("request-headers-set", "X-A: ${SECRET}")], "header value"),
            (&[("request-headers-set", "Content-Length: 0")], "frames the message"),
            (&[("request-headers-set", "X-A: 1\nx-a: 2")], "twice"),
            (&[("response-headers-remove", "Transfer-Encoding")], "frames the message"),
            (&[("response-headers-remove", " , ")], "at least one"),
            (&[("rate-limit", "0")], "from 1 to 100000"),
            (&[("timeout-tunnel", "2d")], "from 1s to 24h"),
            (&[("rewrite-path-prefix", "v2")], "must start with '/'"),
        ] {
            let errors = redirect(pairs).unwrap_err();
            assert!(errors.iter().any(|e| e.contains(says)), "{pairs:?}: {errors:?}");
        }
    }
}
