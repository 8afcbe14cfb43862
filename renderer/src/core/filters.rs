//! A backend's request and response filters as the template's `backend` macro sees them
//! (`b.filters`, `none` for a backend without any): every value in HAProxy's spelling, built
//! from allowlisted parts ([`hafleet_proto::filters`]). Pure.
//!
//! They live in the backend, so they cost nothing to requests for other routes: routing stays
//! a map lookup, and only the requests a backend serves run its rules.

use hafleet_proto::{BackendOptions, HeaderRules, HttpPath, PathRewrite, Redirect};
use serde::Serialize;

/// What the macro renders, in the order HAProxy runs it: who may come in (deny, rate), where
/// the request goes instead (redirect), what it looks like on the way (headers, path), and
/// what the answer looks like on the way out.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize)]
pub struct FiltersModel {
    /// Source networks that get 403.
    pub deny_source: Vec<String>,
    /// Most requests per second from one client address (429 beyond).
    pub rate_limit: Option<u32>,
    /// `prefix <origin> code <n>` or `location <url> code <n>` (log-format strings: a scheme
    /// or host the redirect leaves as the request's is read from it).
    pub redirect: Option<String>,
    /// `http-request` rules that rewrite the path before the redirect (one that replaces the
    /// route's prefix in the new location).
    pub redirect_rewrite: Vec<String>,
    pub request_headers: Vec<HeaderOp>,
    /// `http-request` rules that rewrite the path, in order.
    pub rewrite: Vec<String>,
    pub response_headers: Vec<HeaderOp>,
    pub timeout_tunnel: Option<String>,
}

/// One header rule: `<action> <name> ["<value>"]`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct HeaderOp {
    /// `del-header`, `set-header` or `add-header`.
    pub action: &'static str,
    pub name: String,
    pub value: Option<String>,
}

impl FiltersModel {
    /// `None` when `o` has no filter: most backends.
    pub fn of(o: &BackendOptions) -> Option<FiltersModel> {
        let f = FiltersModel {
            deny_source: o.deny_source.iter().map(|c| c.to_string()).collect(),
            rate_limit: o.rate_limit_rps,
            redirect: o.redirect.as_deref().filter(|r| r.check().is_ok()).map(redirect_of),
            redirect_rewrite: match o.redirect.as_deref() {
                Some(r) if r.check().is_ok() && r.path.is_none() => {
                    r.prefix_to.as_ref().map(rewrite_rules).unwrap_or_default()
                }
                _ => Vec::new(),
            },
            request_headers: header_ops(&o.request_headers),
            rewrite: o.rewrite.as_deref().map(rewrite_rules).unwrap_or_default(),
            response_headers: header_ops(&o.response_headers),
            timeout_tunnel: o.timeout_tunnel_ms.map(hafleet_proto::duration_text),
        };
        (f != FiltersModel::default()).then_some(f)
    }
}

/// A redirect as `http-request redirect` reads it. A scheme or host the redirect leaves out is
/// the request's (`ssl_fc`; the Host the frontend routed by, `txn.host`); a port that is the
/// scheme's own is left out of the Location.
fn redirect_of(r: &Redirect) -> String {
    let scheme = r.scheme.map_or("%[ssl_fc,iif(https,http)]", |s| s.as_str());
    let host = r.host.as_ref().map_or("%[var(txn.host)]", |h| h.as_str());
    let port = match r.port {
        Some(p) if !r.is_default_port(p) => format!(":{p}"),
        _ => String::new(),
    };
    match &r.path {
        None => format!("prefix {scheme}://{host}{port} code {}", r.code),
        Some(path) => {
            format!("location {scheme}://{host}{port}{} code {}", fmt_escaped(path), r.code)
        }
    }
}

fn header_ops(rules: &HeaderRules) -> Vec<HeaderOp> {
    let op =
        |action, name: &hafleet_proto::HeaderName, value: Option<&hafleet_proto::HeaderValue>| {
            HeaderOp { action, name: name.to_string(), value: value.map(|v| v.to_string()) }
        };
    (rules.remove.iter().map(|n| op("del-header", n, None)))
        .chain(rules.set.iter().map(|(n, v)| op("set-header", n, Some(v))))
        .chain(rules.add.iter().map(|(n, v)| op("add-header", n, Some(v))))
        .collect()
}

/// A path in a log-format argument (HAProxy's `redirect`, `set-path`, `replace-path`): `%`
/// (from a `%XX` escape) doubled. Nothing else in an [`HttpPath`] is special there, nor
/// inside single quotes.
fn fmt_escaped(path: &HttpPath) -> String {
    path.as_str().replace('%', "%%")
}

/// A path as a regular expression that matches it literally: the only characters of an
/// [`HttpPath`] PCRE reads specially are `.` and `+`.
fn literal_regex(path: &str) -> String {
    let mut out = String::with_capacity(path.len() + 8);
    for c in path.chars() {
        match c {
            '.' | '+' => {
                out.push('[');
                out.push(c);
                out.push(']');
            }
            c => out.push(c),
        }
    }
    out
}

/// The rules that replace `from` with `to` at the start of the path, whole segments only:
/// `/api` → `/v2` makes `/api` `/v2`, `/api/x` `/v2/x`, and leaves `/apix` alone. Both rules
/// test the path as it came ([`REWRITE_VAR`]), so the second cannot undo the first.
fn rewrite_rules(r: &PathRewrite) -> Vec<String> {
    let to = fmt_escaped(&r.to);
    if r.exact {
        return vec![format!("set-path '{to}'")];
    }
    let from = r.from.trimmed();
    let from = from.as_str().trim_end_matches('/');
    let to_base = to.trim_end_matches('/');
    let mut rules = vec![
        format!("set-var({REWRITE_VAR}) path"),
        format!(
            "replace-path '^{}(/.*)$' '{to_base}\\1' if {{ var({REWRITE_VAR}) -m beg {from}/ }}",
            literal_regex(from)
        ),
    ];
    if !from.is_empty() {
        rules.push(format!("set-path '{to}' if {{ var({REWRITE_VAR}) -m str {from} }}"));
    }
    rules
}

/// Options with every filter set: what a template is tried with when it is loaded, so that
/// one whose macro breaks on a filter is refused then.
pub fn every_filter() -> BackendOptions {
    use hafleet_proto::{HeaderName, HeaderValue, HttpHost, Scheme};
    let header = || (HeaderName::new("X-Check").unwrap(), HeaderValue::new("1").unwrap());
    let rules =
        || HeaderRules { remove: vec![header().0], set: vec![header()], add: vec![header()] };
    BackendOptions {
        deny_source: vec![hafleet_proto::Cidr::parse("10.0.0.0/8").unwrap()],
        rate_limit_rps: Some(10),
        timeout_tunnel_ms: Some(60_000),
        request_headers: Box::new(rules()),
        response_headers: Box::new(rules()),
        redirect: Some(Box::new(Redirect {
            scheme: Some(Scheme::Https),
            host: Some(HttpHost::new("check.invalid").unwrap()),
            port: Some(8443),
            path: Some(HttpPath::root()),
            prefix_to: None,
            code: 308,
        })),
        rewrite: Some(Box::new(PathRewrite {
            from: HttpPath::root(),
            to: HttpPath::root(),
            exact: false,
        })),
        ..Default::default()
    }
}

/// Where a rewrite keeps the path as it came.
const REWRITE_VAR: &str = "txn.hafleet_rewrite";

#[cfg(test)]
mod tests {
    use super::*;
    use hafleet_proto::{HeaderName, HeaderValue, HttpHost, Redirect, Scheme};

    #[test]
    fn no_filter_is_none_and_each_filter_is_spelled_as_haproxy_reads_it() {
        assert_eq!(FiltersModel::of(&BackendOptions::default()), None);
        let mut o = BackendOptions::default();
        o.request_headers.set =
            vec![(HeaderName::new("X-Env").unwrap(), HeaderValue::new("prod x").unwrap())];
        o.request_headers.remove = vec![HeaderName::new("X-Debug").unwrap()];
        o.redirect = Some(Box::new(Redirect {
            scheme: Some(Scheme::Https),
            host: Some(HttpHost::new("www.example.com").unwrap()),
            port: None,
            path: Some(HttpPath::new("/a%20b").unwrap()),
            prefix_to: None,
            code: 301,
        }));
        let f = FiltersModel::of(&o).unwrap();
        assert_eq!(f.redirect.as_deref(), Some("location https://www.example.com/a%%20b code 301"));
        let ops: Vec<_> = f.request_headers.iter().map(|h| (h.action, h.name.as_str())).collect();
        assert_eq!(ops, [("del-header", "X-Debug"), ("set-header", "X-Env")]);
        o.redirect.as_mut().unwrap().code = 200;
        assert_eq!(FiltersModel::of(&o).unwrap().redirect, None, "a bad code never renders");
    }

    /// An HTTPRoute's redirect may keep the request's scheme and host, names a port only
    /// where it is not the scheme's own, and may replace the route's prefix.
    #[test]
    fn a_redirect_keeps_what_it_leaves_out_from_the_request() {
        let mut o = BackendOptions::default();
        let redirect = Redirect {
            scheme: None,
            host: None,
            port: None,
            path: None,
            prefix_to: None,
            code: 302,
        };
        o.redirect = Some(Box::new(redirect.clone()));
        let f = FiltersModel::of(&o).unwrap();
        assert_eq!(
            f.redirect.as_deref(),
            Some("prefix %[ssl_fc,iif(https,http)]://%[var(txn.host)] code 302")
        );
        let https = Redirect { scheme: Some(Scheme::Https), port: Some(443), ..redirect.clone() };
        o.redirect = Some(Box::new(https));
        let f = FiltersModel::of(&o).unwrap();
        assert_eq!(f.redirect.as_deref(), Some("prefix https://%[var(txn.host)] code 302"));
        let prefix = Redirect {
            port: Some(8083),
            prefix_to: Some(PathRewrite {
                from: HttpPath::new("/original-prefix").unwrap(),
                to: HttpPath::new("/replacement-prefix").unwrap(),
                exact: false,
            }),
            ..redirect
        };
        o.redirect = Some(Box::new(prefix));
        let f = FiltersModel::of(&o).unwrap();
        assert!(f.redirect.as_deref().unwrap().contains("://%[var(txn.host)]:8083 code 302"));
        assert_eq!(f.redirect_rewrite.len(), 3, "{:?}", f.redirect_rewrite);
    }

    #[test]
    fn a_prefix_rewrite_replaces_whole_segments_and_escapes_what_pcre_reads() {
        let rw = |from: &str, to: &str, exact: bool| {
            rewrite_rules(&PathRewrite {
                from: HttpPath::new(from).unwrap(),
                to: HttpPath::new(to).unwrap(),
                exact,
            })
        };
        assert_eq!(
            rw("/api.v1/", "/v2/", false),
            [
                "set-var(txn.hafleet_rewrite) path",
                "replace-path '^/api[.]v1(/.*)$' '/v2\\1' if { var(txn.hafleet_rewrite) -m beg /api.v1/ }",
                "set-path '/v2/' if { var(txn.hafleet_rewrite) -m str /api.v1 }",
            ]
        );
        assert_eq!(
            rw("/", "/app", false)[1],
            "replace-path '^(/.*)$' '/app\\1' if { var(txn.hafleet_rewrite) -m beg / }"
        );
        assert_eq!(rw("/", "/app", false).len(), 2, "no path is empty");
        assert_eq!(
            rw("/old", "/", false)[1],
            "replace-path '^/old(/.*)$' '\\1' if { var(txn.hafleet_rewrite) -m beg /old/ }"
        );
        assert_eq!(rw("/exact", "/x", true), ["set-path '/x'"]);
    }
}
