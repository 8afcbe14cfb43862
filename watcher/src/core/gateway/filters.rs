//! An HTTPRoute rule's filters, as backend options: header modifiers, a redirect and a URL
//! rewrite. Pure. Every value goes through proto's allowlists; one that does not pass refuses
//! the route (`UnsupportedValue`), as does a filter hafleet does not serve yet.

use super::spec::{HeaderModifier, PathModifier, RouteRule};
use hafleet_proto::{
    BackendOptions, HeaderName, HeaderRules, HeaderValue, HttpHost, HttpPath, PathKind,
    PathRewrite, REDIRECT_CODES, Redirect, Scheme,
};
use serde::Deserialize;

/// A path change of a redirect or rewrite, before it is tied to a route's own path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathChange {
    /// The whole path becomes this.
    Full(HttpPath),
    /// The route's matched prefix becomes this.
    Prefix(HttpPath),
}

/// What a rule's filters do.
#[derive(Debug, Clone, Default)]
pub struct RuleFilters {
    /// Header changes (and a rewritten Host).
    pub options: BackendOptions,
    /// A redirect instead of a backend, and its path change.
    pub redirect: Option<(Redirect, Option<PathChange>)>,
    /// The path change on the way to the backend.
    pub rewrite: Option<PathChange>,
}

impl RuleFilters {
    /// The options of the route of `path` and `kind`: path changes tied to its own path.
    pub fn for_route(&self, path: &HttpPath, kind: PathKind) -> BackendOptions {
        let mut options = self.options.clone();
        let tied = |change: &PathChange| match change {
            PathChange::Full(to) => {
                PathRewrite { from: path.trimmed(), to: to.clone(), exact: true }
            }
            PathChange::Prefix(to) => {
                PathRewrite { from: path.trimmed(), to: to.clone(), exact: kind == PathKind::Exact }
            }
        };
        if let Some((redirect, change)) = &self.redirect {
            let mut redirect = redirect.clone();
            match change {
                Some(PathChange::Full(to)) => redirect.path = Some(to.clone()),
                Some(prefix) => redirect.prefix_to = Some(tied(prefix)),
                None => {}
            }
            options.redirect = Some(Box::new(redirect));
        }
        options.rewrite = self.rewrite.as_ref().map(|c| Box::new(tied(c)));
        options
    }
}

/// What `rule`'s filters do, or `None` (its errors said).
pub fn of(rule: &RouteRule, at: &str, errors: &mut Vec<String>) -> Option<RuleFilters> {
    let before = errors.len();
    let mut out = RuleFilters::default();
    for (j, f) in rule.filters.iter().enumerate() {
        let at = format!("{at}.filters[{j}]");
        let missing = || format!("{at}: the filter of type {} is missing", f.type_);
        match f.type_.as_str() {
            "RequestHeaderModifier" | "ResponseHeaderModifier" => {
                let (modifier, into) = match f.type_.as_str() {
                    "RequestHeaderModifier" => {
                        (&f.request_header_modifier, &mut out.options.request_headers)
                    }
                    _ => (&f.response_header_modifier, &mut out.options.response_headers),
                };
                match modifier.as_ref().map(header_rules) {
                    Some(Ok(rules)) => {
                        let mut rules = rules;
                        // A Host rewrite (URLRewrite) stays.
                        rules.set.extend(std::mem::take(&mut into.set));
                        **into = rules;
                    }
                    Some(Err(e)) => errors.push(format!("{at}: {e}")),
                    None => errors.push(missing()),
                }
            }
            "RequestRedirect" => match &f.request_redirect {
                Some(r) => match redirect(r) {
                    Ok(r) => out.redirect = Some(r),
                    Err(e) => errors.push(format!("{at}.requestRedirect: {e}")),
                },
                None => errors.push(missing()),
            },
            "URLRewrite" => match &f.url_rewrite {
                Some(r) => {
                    if let Some(h) = &r.hostname {
                        match (HeaderName::new("Host"), HeaderValue::new(h.as_str())) {
                            (Ok(name), Ok(value)) if HttpHost::new(h.as_str()).is_ok() => {
                                out.options.request_headers.set.push((name, value))
                            }
                            _ => errors.push(format!(
                                "{at}.urlRewrite.hostname: {h:?} is not a host name"
                            )),
                        }
                    }
                    match r.path.as_ref().map(path_change) {
                        Some(Ok(change)) => out.rewrite = Some(change),
                        Some(Err(e)) => errors.push(format!("{at}.urlRewrite.path: {e}")),
                        None => {}
                    }
                }
                None => errors.push(missing()),
            },
            other => errors.push(format!("{at}: filter {other} is not served by hafleet yet")),
        }
    }
    for (field, given) in [
        ("retry", rule.retry.is_some()),
        ("sessionPersistence", rule.session_persistence.is_some()),
    ] {
        if given {
            errors.push(format!("{at}.{field} is not served by hafleet yet"));
        }
    }
    if let Some(t) = &rule.timeouts {
        match timeout(t) {
            Ok(ms) => out.options.timeout_server_ms = ms,
            Err(e) => errors.push(format!("{at}.timeouts: {e}")),
        }
    }
    (errors.len() == before).then_some(out)
}

/// The longest timeout a rule may ask for, and what `0s` (no timeout) becomes: a day.
pub const TIMEOUT_OFF_MS: u32 = 24 * 3_600_000;

/// What a rule's `timeouts` make of its backend's `timeout server` (how long HAProxy waits for
/// the backend's answer, and between its parts): the smaller of `request` and
/// `backendRequest`, `0s` being none ([`TIMEOUT_OFF_MS`]); `None` when neither is given.
fn timeout(t: &super::spec::Timeouts) -> Result<Option<u32>, String> {
    let request = t.request.as_deref().map(duration_ms).transpose()?;
    let backend = t.backend_request.as_deref().map(duration_ms).transpose()?;
    let off = |ms: u32| if ms == 0 { TIMEOUT_OFF_MS } else { ms };
    if let (Some(r), Some(b)) = (request.map(off), backend.map(off))
        && b > r
    {
        return Err(format!(
            "backendRequest ({b} ms) is longer than request ({r} ms); it may not be"
        ));
    }
    Ok(match (request, backend) {
        (None, None) => None,
        (r, b) => r.into_iter().chain(b).map(off).min(),
    })
}

/// A Gateway API duration (`^([0-9]{1,5}(h|m|s|ms)){1,4}$`) in milliseconds, at most a day.
pub fn duration_ms(text: &str) -> Result<u32, String> {
    let bad = || format!("{text:?} is not a duration such as 500ms, 10s or 1h30m");
    let mut total: u64 = 0;
    let mut rest = text;
    let mut parts = 0;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 || digits > 5 {
            return Err(bad());
        }
        let n: u64 = rest[..digits].parse().map_err(|_| bad())?;
        rest = &rest[digits..];
        let (unit, len) = match rest.as_bytes() {
            [b'm', b's', ..] => (1, 2),
            [b'h', ..] => (3_600_000, 1),
            [b'm', ..] => (60_000, 1),
            [b's', ..] => (1_000, 1),
            _ => return Err(bad()),
        };
        rest = &rest[len..];
        total += n * unit;
        parts += 1;
    }
    if parts == 0 || parts > 4 {
        return Err(bad());
    }
    match u32::try_from(total) {
        Ok(ms) if ms <= TIMEOUT_OFF_MS => Ok(ms),
        _ => Err(format!("{text:?} is longer than a day, the most hafleet takes")),
    }
}

fn redirect(r: &super::spec::RequestRedirect) -> Result<(Redirect, Option<PathChange>), String> {
    let scheme = match r.scheme.as_deref() {
        None => None,
        Some("http") => Some(Scheme::Http),
        Some("https") => Some(Scheme::Https),
        Some(other) => return Err(format!("scheme {other:?} is not http or https")),
    };
    let host = r.hostname.as_deref().map(HttpHost::new).transpose().map_err(|e| e.to_string())?;
    let code = r.status_code.unwrap_or(302);
    if !REDIRECT_CODES.contains(&code) {
        return Err(format!("statusCode {code} is not one of 301, 302, 303, 307, 308"));
    }
    let change = r.path.as_ref().map(path_change).transpose()?;
    let redirect = Redirect { scheme, host, port: r.port, path: None, prefix_to: None, code };
    redirect.check().map_err(|e| e.to_string())?;
    Ok((redirect, change))
}

fn path_change(m: &PathModifier) -> Result<PathChange, String> {
    let path = |v: &Option<String>| -> Result<HttpPath, String> {
        HttpPath::new(v.as_deref().unwrap_or("/")).map_err(|e| e.to_string())
    };
    match m.type_.as_str() {
        "ReplaceFullPath" => Ok(PathChange::Full(path(&m.replace_full_path)?)),
        "ReplacePrefixMatch" => Ok(PathChange::Prefix(path(&m.replace_prefix_match)?)),
        other => Err(format!("type {other:?} is not ReplaceFullPath or ReplacePrefixMatch")),
    }
}

/// What a backendRef's own `filters` do to the requests and responses it serves: its header
/// modifiers, as (request, response) rules. Other filters on a backendRef are not served yet.
pub fn backend_ref_headers(
    filters: &[serde_json::Value],
) -> Result<(HeaderRules, HeaderRules), String> {
    let mut rules = (HeaderRules::default(), HeaderRules::default());
    for (j, value) in filters.iter().enumerate() {
        let f = super::spec::RouteFilter::deserialize(value)
            .map_err(|e| format!("filters[{j}] does not read: {e}"))?;
        let (modifier, into) = match f.type_.as_str() {
            "RequestHeaderModifier" => (&f.request_header_modifier, &mut rules.0),
            "ResponseHeaderModifier" => (&f.response_header_modifier, &mut rules.1),
            other => {
                return Err(format!(
                    "filters[{j}]: filter {other} on a backendRef is not served by hafleet yet"
                ));
            }
        };
        let modifier = modifier
            .as_ref()
            .ok_or_else(|| format!("filters[{j}]: the filter of type {} is missing", f.type_))?;
        *into = layered(into, &header_rules(modifier).map_err(|e| format!("filters[{j}]: {e}"))?);
    }
    Ok(rules)
}

/// Header rules `then` applied after `first` (a backendRef's after its rule's), as one set
/// in HAProxy's order (remove, set, add): a header `then` sets or removes ends as `then` says,
/// so `first`'s changes to it go; one `then` adds to keeps `first`'s and gets one more value.
pub fn layered(first: &HeaderRules, then: &HeaderRules) -> HeaderRules {
    if then.is_empty() {
        return first.clone();
    }
    let decided = |n: &HeaderName| {
        then.remove
            .iter()
            .chain(then.set.iter().map(|(s, _)| s))
            .any(|d| d.as_str().eq_ignore_ascii_case(n.as_str()))
    };
    let mut out = HeaderRules {
        remove: first.remove.iter().filter(|n| !decided(n)).cloned().collect(),
        set: first.set.iter().filter(|(n, _)| !decided(n)).cloned().collect(),
        add: first.add.iter().filter(|(n, _)| !decided(n)).cloned().collect(),
    };
    out.remove.extend(then.remove.iter().cloned());
    out.set.extend(then.set.iter().cloned());
    out.add.extend(then.add.iter().cloned());
    out
}

fn header_rules(m: &HeaderModifier) -> Result<HeaderRules, String> {
    let pair = |p: &super::spec::HeaderPair| -> Result<(HeaderName, HeaderValue), String> {
        Ok((
            HeaderName::new(p.name.as_str()).map_err(|e| e.to_string())?,
            HeaderValue::new(p.value.as_str()).map_err(|e| e.to_string())?,
        ))
    };
    Ok(HeaderRules {
        remove: m
            .remove
            .iter()
            .map(|n| HeaderName::new(n.as_str()).map_err(|e| e.to_string()))
            .collect::<Result<_, _>>()?,
        set: m.set.iter().map(pair).collect::<Result<_, _>>()?,
        add: m.add.iter().map(pair).collect::<Result<_, _>>()?,
    })
}
