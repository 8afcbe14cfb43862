//! `/healthz`, `/readyz` and `/metrics` over HTTP, for whatever runs the process (Kubernetes
//! probes, Prometheus, a load balancer's check). Off unless `--health-addr` is given.
//!
//! - `GET /healthz`: 200 while the process serves requests at all.
//! - `GET /readyz`: 200 once the component does its job (the watcher has published what the
//!   cluster holds, the renderer consumes its stream, the applier has converged on start-up),
//!   503 with the reason before that.
//! - `GET /metrics`: the component's counters and gauges in Prometheus' text format.
//!
//! A few lines of HTTP/1.1 by hand: two fixed answers do not need a web framework.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// Where to answer health checks.
#[derive(Debug, Clone, clap::Args)]
pub struct HealthArgs {
    /// Address to serve `/healthz`, `/readyz` and `/metrics` on (e.g. `0.0.0.0:8080` in a
    /// pod; `--metrics-addr` is the same flag). Unset: no endpoint.
    #[arg(long, env = "HAFLEET_HEALTH_ADDR", visible_alias = "metrics-addr")]
    pub health_addr: Option<SocketAddr>,
}

/// Whether the component is ready, and why not, and its counters; shared with the endpoint.
#[derive(Debug, Clone)]
pub struct Health {
    ready: Arc<Mutex<Result<(), String>>>,
    /// What keeps a component that did its start-up from being ready now (NATS lost, the API
    /// server unreachable), by source.
    blockers: Arc<Mutex<std::collections::BTreeMap<&'static str, String>>>,
    metrics: Arc<Mutex<Metrics>>,
    /// Labels every series carries (an applier's `fleet`), unless it names them itself.
    constant: Arc<Mutex<Vec<(&'static str, String)>>>,
}

/// Counters, gauges and histograms, written out in Prometheus' text format at `/metrics`.
#[derive(Debug, Default)]
struct Metrics {
    /// name → (help, kind `counter`, `gauge` or `histogram`, labels → value)
    families: std::collections::BTreeMap<&'static str, Family>,
}

type Family =
    (&'static str, &'static str, std::collections::BTreeMap<Vec<(&'static str, String)>, Value>);

/// Upper bounds (seconds) of the duration histograms' buckets: from a map-only change on one
/// host to a reload of a 10,000-Ingress fleet.
pub const DURATION_BUCKETS: [f64; 12] =
    [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];

/// One series' value.
#[derive(Debug, Clone, PartialEq)]
enum Value {
    Scalar(f64),
    /// Observations per bucket of [`DURATION_BUCKETS`] (not cumulative), their sum and count.
    Histogram {
        buckets: [u64; DURATION_BUCKETS.len()],
        sum: f64,
        count: u64,
    },
}

impl Health {
    /// The process's own: one component per process, its readiness and metrics written from
    /// wherever they happen. Starts not ready.
    pub fn global() -> &'static Health {
        static GLOBAL: std::sync::OnceLock<Health> = std::sync::OnceLock::new();
        GLOBAL.get_or_init(|| Health::new("starting"))
    }

    /// Not ready yet, for `why`.
    pub fn new(why: &str) -> Health {
        Health {
            ready: Arc::new(Mutex::new(Err(why.to_owned()))),
            blockers: Default::default(),
            metrics: Default::default(),
            constant: Default::default(),
        }
    }

    /// Gives every series the label `name="value"` (one that names `name` itself keeps its
    /// own): an applier's `fleet`, so that two fleets' `lb-1` do not collide.
    pub fn label_all(&self, name: &'static str, value: &str) {
        let mut constant = self.constant.lock().unwrap_or_else(|p| p.into_inner());
        constant.retain(|(n, _)| *n != name);
        constant.push((name, value.to_owned()));
    }

    pub fn ready(&self) {
        *self.ready.lock().unwrap_or_else(|p| p.into_inner()) = Ok(());
    }

    pub fn not_ready(&self, why: &str) {
        *self.ready.lock().unwrap_or_else(|p| p.into_inner()) = Err(why.to_owned());
    }

    /// Not ready while `source` says `why`, whatever the start-up did.
    pub fn block(&self, source: &'static str, why: &str) {
        self.blockers.lock().unwrap_or_else(|p| p.into_inner()).insert(source, why.to_owned());
    }

    /// `source` no longer keeps the component from being ready.
    pub fn clear_blocker(&self, source: &'static str) {
        self.blockers.lock().unwrap_or_else(|p| p.into_inner()).remove(source);
    }

    /// Ready, or the reason not: a blocker's (the more specific: what it waits for) first.
    fn state(&self) -> Result<(), String> {
        let blockers = self.blockers.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(why) = blockers.values().next() {
            return Err(why.clone());
        }
        self.ready.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Adds `by` to counter `name` with `labels`.
    pub fn count(
        &self,
        (name, help): (&'static str, &'static str),
        labels: &[(&'static str, &str)],
        by: f64,
    ) {
        self.write(name, help, "counter", labels, |v| *v += by);
    }

    /// Sets gauge `name` with `labels` to `value`.
    pub fn gauge(
        &self,
        (name, help): (&'static str, &'static str),
        labels: &[(&'static str, &str)],
        value: f64,
    ) {
        self.write(name, help, "gauge", labels, |v| *v = value);
    }

    /// Records a duration in histogram `name` (seconds, buckets [`DURATION_BUCKETS`]).
    pub fn observe(
        &self,
        (name, help): (&'static str, &'static str),
        labels: &[(&'static str, &str)],
        took: Duration,
    ) {
        let seconds = took.as_secs_f64();
        let mut m = self.metrics.lock().unwrap_or_else(|p| p.into_inner());
        let family = m.families.entry(name).or_insert((help, "histogram", Default::default()));
        let key = labels.iter().map(|(k, v)| (*k, (*v).to_owned())).collect();
        let empty = Value::Histogram { buckets: [0; DURATION_BUCKETS.len()], sum: 0.0, count: 0 };
        if let Value::Histogram { buckets, sum, count } = family.2.entry(key).or_insert(empty) {
            if let Some(i) = DURATION_BUCKETS.iter().position(|le| seconds <= *le) {
                buckets[i] += 1;
            }
            *sum += seconds;
            *count += 1;
        }
    }

    fn write(
        &self,
        name: &'static str,
        help: &'static str,
        kind: &'static str,
        labels: &[(&'static str, &str)],
        change: impl FnOnce(&mut f64),
    ) {
        let mut m = self.metrics.lock().unwrap_or_else(|p| p.into_inner());
        let family = m.families.entry(name).or_insert((help, kind, Default::default()));
        let key = labels.iter().map(|(k, v)| (*k, (*v).to_owned())).collect();
        if let Value::Scalar(v) = family.2.entry(key).or_insert(Value::Scalar(0.0)) {
            change(v);
        }
    }

    /// Drops every gauge series labelled `label="value"` (a host taken out of the inventory,
    /// whose gauges would otherwise say forever what it last ran); counters and histograms
    /// stay, as Prometheus expects of them.
    pub fn forget(&self, label: &str, value: &str) {
        let mut m = self.metrics.lock().unwrap_or_else(|p| p.into_inner());
        for (_, kind, series) in m.families.values_mut() {
            if *kind == "gauge" {
                series.retain(|labels, _| !labels.iter().any(|(k, v)| *k == label && v == value));
            }
        }
    }

    /// Every metric in Prometheus' text exposition format.
    pub fn exposition(&self) -> String {
        let m = self.metrics.lock().unwrap_or_else(|p| p.into_inner());
        let constant = self.constant.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let mut out = String::new();
        for (name, (help, kind, series)) in &m.families {
            out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n"));
            for (labels, value) in series {
                let own = |n: &&'static str| labels.iter().any(|(k, _)| k == n);
                let labels: Vec<String> = constant
                    .iter()
                    .filter(|(n, _)| !own(n))
                    .chain(labels.iter())
                    .map(|(k, v)| {
                        let v = v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n");
                        format!("{k}=\"{v}\"")
                    })
                    .collect();
                let line = |out: &mut String, suffix: &str, extra: Option<String>, value: f64| {
                    let all: Vec<&str> =
                        labels.iter().map(String::as_str).chain(extra.as_deref()).collect();
                    match all.is_empty() {
                        true => out.push_str(&format!("{name}{suffix} {value}\n")),
                        false => {
                            out.push_str(&format!("{name}{suffix}{{{}}} {value}\n", all.join(",")))
                        }
                    }
                };
                match value {
                    Value::Scalar(v) => line(&mut out, "", None, *v),
                    Value::Histogram { buckets, sum, count } => {
                        let mut cumulative = 0;
                        for (le, n) in DURATION_BUCKETS.iter().zip(buckets) {
                            cumulative += n;
                            let le = Some(format!("le=\"{le}\""));
                            line(&mut out, "_bucket", le, cumulative as f64);
                        }
                        line(&mut out, "_bucket", Some("le=\"+Inf\"".into()), *count as f64);
                        line(&mut out, "_sum", None, *sum);
                        line(&mut out, "_count", None, *count as f64);
                    }
                }
            }
        }
        // Readiness, as /readyz answers it, for alerts (`hafleet_ready == 0`).
        let ready = f64::from(u8::from(self.state().is_ok()));
        let labels: Vec<String> = constant.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
        let labels = match labels.is_empty() {
            true => String::new(),
            false => format!("{{{}}}", labels.join(",")),
        };
        out.push_str(&format!(
            "# HELP hafleet_ready 1 while /readyz answers 200.\n# TYPE hafleet_ready gauge\n\
             hafleet_ready{labels} {ready}\n"
        ));
        out
    }
}

/// The answer to a request's first line (`GET /readyz HTTP/1.1`), given readiness and the
/// metrics' text. Pure.
pub fn answer(request_line: &str, health: &Result<(), String>, metrics: &str) -> (u16, String) {
    let mut parts = request_line.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = path.split('?').next().unwrap_or("");
    match (method, path) {
        ("GET" | "HEAD", "/healthz") => (200, "ok\n".into()),
        ("GET" | "HEAD", "/readyz") => match health {
            Ok(()) => (200, "ready\n".into()),
            Err(why) => (503, format!("not ready: {why}\n")),
        },
        ("GET" | "HEAD", "/metrics") => (200, metrics.to_owned()),
        ("GET" | "HEAD", _) => (404, "not found: /healthz, /readyz or /metrics\n".into()),
        _ => (405, "only GET\n".into()),
    }
}

/// The process's [`Health`], not ready for `why` until its component says it is, served on
/// `args.health_addr` if that is set: what each binary calls first.
pub async fn start(args: &HealthArgs, why: &str) -> anyhow::Result<&'static Health> {
    let health = Health::global();
    health.not_ready(why);
    // Set before the endpoint serves, so a scrape never finds an empty exposition.
    const BUILD: (&str, &str) = ("hafleet_build_info", "1, labelled with the hafleet version.");
    health.gauge(BUILD, &[("version", env!("CARGO_PKG_VERSION"))], 1.0);
    let started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    const START: (&str, &str) =
        ("hafleet_process_start_time_seconds", "Start time of the process, in Unix seconds.");
    health.gauge(START, &[], started.floor());
    serve(args, health.clone())
        .await
        .map_err(|e| anyhow::anyhow!("cannot serve the health endpoint: {e}"))?;
    Ok(health)
}

/// Serves the endpoints on `args.health_addr`, if set, in the background; returns the address
/// bound (a port of 0 picks one).
pub async fn serve(args: &HealthArgs, health: Health) -> std::io::Result<Option<SocketAddr>> {
    let Some(addr) = args.health_addr else { return Ok(None) };
    let listener = TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    tracing::info!(addr = %bound, "serving /healthz and /readyz");
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else { continue };
            let health = health.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                let read = async {
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 8192 {
                        match stream.read(&mut buf).await {
                            Ok(0) | Err(_) => return false,
                            Ok(n) => head.extend_from_slice(&buf[..n]),
                        }
                    }
                    true
                };
                if !matches!(tokio::time::timeout(Duration::from_secs(5), read).await, Ok(true)) {
                    return;
                }
                let text = String::from_utf8_lossy(&head);
                let line = text.lines().next().unwrap_or("");
                let (status, body) = answer(line, &health.state(), &health.exposition());
                let reason = match status {
                    200 => "OK",
                    404 => "Not Found",
                    405 => "Method Not Allowed",
                    _ => "Service Unavailable",
                };
                let response = format!(
                    "HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\
                     Connection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.write_all(response.as_bytes()).await;
                let _ = stream.shutdown().await;
            });
        }
    });
    Ok(Some(bound))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn liveness_readiness_and_everything_else() {
        let ready = Ok(());
        let waiting = Err("caches not listed yet".to_owned());
        assert_eq!(answer("GET /healthz HTTP/1.1", &waiting, "").0, 200);
        assert_eq!(answer("GET /readyz HTTP/1.1", &ready, ""), (200, "ready\n".into()));
        let (status, body) = answer("GET /readyz?verbose HTTP/1.1", &waiting, "");
        assert_eq!((status, body.as_str()), (503, "not ready: caches not listed yet\n"));
        assert_eq!(answer("GET /metrics HTTP/1.1", &ready, "m 1\n"), (200, "m 1\n".into()));
        assert_eq!(answer("GET /other HTTP/1.1", &ready, "").0, 404);
        assert_eq!(answer("POST /readyz HTTP/1.1", &ready, "").0, 405);
        assert_eq!(answer("", &ready, "").0, 405);
    }

    #[test]
    fn a_label_of_the_process_goes_on_every_series_that_does_not_name_it() {
        let h = Health::new("x");
        h.label_all("fleet", "edge");
        h.gauge(("m", "help"), &[("host", "lb-1")], 2.0);
        h.gauge(("n", "help"), &[], 1.0);
        h.gauge(("o", "help"), &[("fleet", "core")], 3.0);
        let text = h.exposition();
        assert!(text.contains("m{fleet=\"edge\",host=\"lb-1\"} 2\n"), "{text}");
        assert!(text.contains("n{fleet=\"edge\"} 1\n"), "{text}");
        assert!(text.contains("o{fleet=\"core\"} 3\n"), "{text}");
        assert!(text.contains("hafleet_ready{fleet=\"edge\"} 0\n"), "{text}");
    }

    #[test]
    fn metrics_are_written_in_prometheus_text_format() {
        let h = Health::new("x");
        const APPLIES: (&str, &str) = ("hafleet_applies_total", "Applies by outcome.");
        h.count(APPLIES, &[("host", "lb-1"), ("outcome", "applied")], 1.0);
        h.count(APPLIES, &[("host", "lb-1"), ("outcome", "applied")], 2.0);
        h.gauge(("hafleet_leader", "1 while leading."), &[], 1.0);
        h.count(APPLIES, &[("host", "a\"b"), ("outcome", "failed")], 1.0);
        assert_eq!(
            h.exposition(),
            "# HELP hafleet_applies_total Applies by outcome.\n# TYPE hafleet_applies_total counter\n\
             hafleet_applies_total{host=\"a\\\"b\",outcome=\"failed\"} 1\n\
             hafleet_applies_total{host=\"lb-1\",outcome=\"applied\"} 3\n\
             # HELP hafleet_leader 1 while leading.\n# TYPE hafleet_leader gauge\nhafleet_leader 1\n\
             # HELP hafleet_ready 1 while /readyz answers 200.\n# TYPE hafleet_ready gauge\n\
             hafleet_ready 0\n"
        );
        h.ready();
        assert!(h.exposition().ends_with("hafleet_ready 1\n"));
    }

    #[test]
    fn a_blocker_makes_a_ready_component_not_ready_until_it_clears() {
        let h = Health::new("starting");
        h.block("nats", "NATS is unreachable");
        assert_eq!(h.state(), Err("NATS is unreachable".into()));
        h.clear_blocker("nats");
        assert_eq!(h.state(), Err("starting".into()));
        h.block("nats", "NATS is unreachable");
        h.ready();
        assert_eq!(h.state(), Err("NATS is unreachable".into()), "ready, but cut off");
        h.clear_blocker("nats");
        assert_eq!(h.state(), Ok(()));
    }

    #[test]
    fn durations_are_histograms_with_cumulative_buckets() {
        let h = Health::new("x");
        const TOOK: (&str, &str) = ("hafleet_apply_seconds", "Apply time.");
        h.observe(TOOK, &[("host", "lb-1")], Duration::from_millis(30));
        h.observe(TOOK, &[("host", "lb-1")], Duration::from_millis(700));
        h.observe(TOOK, &[("host", "lb-1")], Duration::from_secs(60));
        let text = h.exposition();
        for line in [
            "# TYPE hafleet_apply_seconds histogram",
            "hafleet_apply_seconds_bucket{host=\"lb-1\",le=\"0.025\"} 0",
            "hafleet_apply_seconds_bucket{host=\"lb-1\",le=\"0.05\"} 1",
            "hafleet_apply_seconds_bucket{host=\"lb-1\",le=\"1\"} 2",
            "hafleet_apply_seconds_bucket{host=\"lb-1\",le=\"30\"} 2",
            "hafleet_apply_seconds_bucket{host=\"lb-1\",le=\"+Inf\"} 3",
            "hafleet_apply_seconds_sum{host=\"lb-1\"} 60.73",
            "hafleet_apply_seconds_count{host=\"lb-1\"} 3",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing:\n{text}");
        }
    }
}
