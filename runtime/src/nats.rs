//! NATS JetStream plumbing shared by the binaries.

use async_nats::jetstream::{self, stream};
use hafleet_proto::{
    CHUNKS_HEADER, ConfigVersion, MSG_ID_HEADER, SCHEMA_HEADER, SCHEMA_VERSION, StreamSpec,
};
use std::time::Duration;

mod bundles;
mod options;
pub use options::NatsArgs;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// NATS errors by kind (`disconnected`, `publish`), in every binary's metrics.
const NATS_ERRORS: (&str, &str) =
    ("hafleet_nats_errors_total", "NATS errors: connections lost, publishes failed.");

/// Bytes kept free of payload for the headers hafleet sets (message id, schema).
const HEADER_ROOM: usize = 1024;

#[derive(Debug, thiserror::Error)]
pub enum BusError {
    #[error("cannot connect to NATS at {url}")]
    Connect { url: String, source: BoxError },
    #[error("NATS settings: {what}")]
    Settings { what: String },
    #[error("cannot create or open stream {name}")]
    Stream { name: &'static str, source: BoxError },
    #[error(
        "stream {name} already exists with another configuration ({what}); refusing to reuse \
         it: fix or delete it, and hafleet creates it as it needs it"
    )]
    StreamMismatch { name: &'static str, what: String },
    #[error("cannot create or open consumer {name}")]
    Consumer { name: String, source: BoxError },
    #[error("publishing to {subject} failed")]
    PublishFailed { subject: String, source: BoxError },
    #[error(
        "a {size}-byte message on {subject} is more than NATS accepts ({max}); raise max_payload"
    )]
    TooLarge { subject: String, size: usize, max: usize },
    #[error("reading chunk {index} of version {version}'s bundle ({subject}) failed")]
    BundleRead { subject: String, index: u32, version: u64, source: BoxError },
    #[error("reading certificate {subject} of version {version}'s bundle failed")]
    CertRead { subject: String, version: u64, source: BoxError },
    #[error("the bundle of version {version} of fleet {fleet} is unusable")]
    BadBundle { fleet: String, version: u64, source: BoxError },
}

/// How an existing stream's configuration differs from what hafleet relies on: its subjects
/// (every message of a stream must be one of hafleet's, and all of hafleet's must land in it),
/// file storage (survives a restart) and limits retention (messages stay until they age out,
/// whoever has read them), reads by subject (direct get) where the spec needs them, and one
/// message per subject where it says so. Retention limits (age, bytes) may differ: operators
/// and the renderer set those. `None`: it is hafleet's stream.
pub fn stream_mismatch(spec: StreamSpec, config: &stream::Config) -> Option<String> {
    let mut found = Vec::new();
    // Anything that copies or sends messages elsewhere would let whoever created the stream
    // read what it may not (another fleet's configs), or drop acks.
    if config.republish.is_some() {
        found.push("republishes its messages".to_owned());
    }
    if config.mirror.is_some() || config.sources.as_ref().is_some_and(|s| !s.is_empty()) {
        found.push("mirrors or sources another stream".to_owned());
    }
    if config.subject_transform.is_some() {
        found.push("transforms subjects".to_owned());
    }
    if config.no_ack {
        found.push("does not acknowledge publishes".to_owned());
    }
    if spec.direct && !config.allow_direct {
        found.push("allow_direct off".to_owned());
    }
    if spec.last_per_subject && config.max_messages_per_subject != 1 {
        found.push(format!("max_msgs_per_subject {}, not 1", config.max_messages_per_subject));
    }
    if config.subjects != [spec.subjects] {
        found.push(format!("subjects {:?}, not [{:?}]", config.subjects, spec.subjects));
    }
    if config.storage != stream::StorageType::File {
        found.push(format!("{:?} storage, not file", config.storage));
    }
    if config.retention != stream::RetentionPolicy::Limits {
        found.push(format!("{:?} retention, not limits", config.retention));
    }
    (!found.is_empty()).then(|| found.join(", "))
}

/// Runs a JetStream request until it succeeds, for at most a minute: a cluster answers only
/// once it has a leader for the stream or consumer (a few seconds after it starts, or after a
/// node is lost), and a request made meanwhile times out or fails. Each failure is logged as
/// what the component waits for; the last one is returned.
pub async fn retrying<T, E, F>(what: &str, mut request: impl FnMut() -> F) -> Result<T, E>
where
    E: std::fmt::Display,
    F: std::future::Future<Output = Result<T, E>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let mut delay = Duration::from_millis(250);
    loop {
        match request().await {
            Ok(value) => return Ok(value),
            Err(e) if tokio::time::Instant::now() + delay < deadline => {
                tracing::warn!(error = %e, retry_in = ?delay, "waiting for {what}");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(5));
            }
            Err(e) => return Err(e),
        }
    }
}

/// Splits a comma-separated list of server URLs into the URLs without credentials and the
/// credentials, which the first URL that has any gives for all (a cluster has one user list).
pub fn split_url_list(urls: &str) -> (Vec<String>, Option<(String, String)>) {
    let mut credentials = None;
    let mut addresses = Vec::new();
    for url in urls.split(',').map(str::trim).filter(|u| !u.is_empty()) {
        let (address, found) = split_credentials(url);
        credentials = credentials.or(found);
        addresses.push(address);
    }
    (addresses, credentials)
}

/// The chunk count a bundle's chunk 0 carries.
fn chunk_count(m: &jetstream::message::StreamMessage) -> Option<u32> {
    m.headers.get(CHUNKS_HEADER)?.as_str().parse().ok()
}

/// The URL without any `user:password@`, for messages and logs.
pub fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}***{}", &url[..scheme + 3], &url[at..])
        }
        (None, Some(at)) => format!("***{}", &url[at..]),
        _ => url.to_owned(),
    }
}

/// Splits `nats://user:password@host:port` into the URL without credentials and the
/// (percent-decoded) user and password. async-nats does not send credentials written in the
/// URL itself, so they go through its connect options instead.
pub fn split_credentials(url: &str) -> (String, Option<(String, String)>) {
    let Ok(mut parsed) = url::Url::parse(url) else { return (url.to_owned(), None) };
    if parsed.username().is_empty() {
        return (url.to_owned(), None);
    }
    let decode = |s: &str| percent_encoding::percent_decode_str(s).decode_utf8_lossy().into_owned();
    let user = decode(parsed.username());
    let password = decode(parsed.password().unwrap_or_default());
    let _ = parsed.set_username("");
    let _ = parsed.set_password(None);
    (parsed.to_string(), Some((user, password)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_never_reach_messages() {
        assert_eq!(redact("nats://u:secret@nats:4222"), "nats://***@nats:4222");
        assert_eq!(redact("u:secret@nats:4222"), "***@nats:4222");
        assert_eq!(redact("nats://nats:4222"), "nats://nats:4222");
    }

    #[test]
    fn a_stream_configured_otherwise_is_told_apart_but_not_for_its_limits() {
        let spec = hafleet_proto::REPORTS;
        let ours = stream::Config {
            name: spec.name.into(),
            subjects: vec![spec.subjects.into()],
            storage: stream::StorageType::File,
            max_age: Duration::from_secs(60),
            max_bytes: 1 << 20,
            ..Default::default()
        };
        assert_eq!(stream_mismatch(spec, &ours), None, "other limits are the operator's call");
        let narrower =
            stream::Config { subjects: vec!["hafleet.reports.edge.>".into()], ..ours.clone() };
        assert!(stream_mismatch(spec, &narrower).unwrap().contains("subjects"));
        let memory = stream::Config { storage: stream::StorageType::Memory, ..ours.clone() };
        assert!(stream_mismatch(spec, &memory).unwrap().contains("Memory storage"));
        let work = stream::Config { retention: stream::RetentionPolicy::WorkQueue, ..ours.clone() };
        assert!(stream_mismatch(spec, &work).unwrap().contains("retention"));
        let leaky = stream::Config {
            republish: Some(stream::Republish {
                source: "hafleet.reports.>".into(),
                destination: "_INBOX_edge.leak.>".into(),
                headers_only: false,
            }),
            ..ours.clone()
        };
        assert!(stream_mismatch(spec, &leaky).unwrap().contains("republishes"));
        let unacked = stream::Config { no_ack: true, ..ours };
        assert!(stream_mismatch(spec, &unacked).unwrap().contains("acknowledge"));
    }

    #[test]
    fn a_list_of_servers_shares_the_first_credentials_given() {
        let (urls, creds) =
            split_url_list("nats://u:p@nats-1:4222, nats://nats-2:4222,nats-3:4222");
        assert_eq!(urls, ["nats://nats-1:4222", "nats://nats-2:4222", "nats-3:4222"]);
        assert_eq!(creds, Some(("u".into(), "p".into())));
        assert_eq!(
            redact("nats://u:p@nats-1:4222,nats-2:4222"),
            "nats://***@nats-1:4222,nats-2:4222"
        );
    }

    #[test]
    fn credentials_come_out_of_the_url_decoded() {
        let (url, creds) =
            split_credentials("nats://hafleet-watcher:p%40ss%3Aw@nats.internal:4222");
        assert_eq!(url, "nats://nats.internal:4222");
        assert_eq!(creds, Some(("hafleet-watcher".into(), "p@ss:w".into())));
        assert_eq!(split_credentials("nats://nats:4222"), ("nats://nats:4222".into(), None));
    }
}

/// A connection to NATS and its JetStream context.
#[derive(Debug, Clone)]
pub struct Bus {
    pub client: async_nats::Client,
    pub js: jetstream::Context,
    /// Replicas of the streams this connection creates.
    pub replicas: usize,
    /// Certificates this connection has stored or read in the bundles stream, by id
    /// ([`bundles::CertShelf`]); shared by its clones.
    certs: std::sync::Arc<std::sync::Mutex<bundles::CertShelf>>,
}

impl Bus {
    /// A bus over a connection made elsewhere (tests, benches), creating single-copy streams.
    pub fn from_client(client: async_nats::Client) -> Bus {
        Bus { js: jetstream::new(client.clone()), client, replicas: 1, certs: Default::default() }
    }

    /// This bus, creating streams with `replicas` copies.
    pub fn with_replicas(mut self, replicas: u8) -> Bus {
        self.replicas = usize::from(replicas.max(1));
        self
    }

    /// Connects once, naming the URL in the error.
    pub async fn connect(url: &str) -> Result<Bus, BusError> {
        Bus::connect_with(url, async_nats::ConnectOptions::new(), false).await
    }

    /// [`Bus::connect`] with other options (an inbox prefix, say); with `wait`, tries until
    /// NATS answers ([`crate::wait_for`]).
    pub async fn connect_with(
        url: &str,
        mut options: async_nats::ConnectOptions,
        wait: bool,
    ) -> Result<Bus, BusError> {
        let (addresses, credentials) = split_url_list(url);
        // Readiness follows the connection: a component cut off from NATS is not ready.
        options = options.event_callback(|event| async move {
            let health = crate::health::Health::global();
            match event {
                async_nats::Event::Connected => health.clear_blocker("nats"),
                async_nats::Event::Disconnected => {
                    health.block("nats", "NATS is unreachable; reconnecting");
                    health.count(NATS_ERRORS, &[("what", "disconnected")], 1.0);
                }
                other => tracing::info!(event = %other, "NATS"),
            }
        });
        if let Some((user, password)) = credentials {
            options = options.user_and_password(user, password);
        }
        let failed = |source: BoxError| BusError::Connect { url: redact(url), source };
        let client = if wait {
            // A certificate the CA given does not vouch for, or a key the server does not
            // take, is not fixed by waiting: said at once.
            let what = format!("NATS at {}", redact(url));
            let attempt = || async {
                match options.clone().connect(addresses.clone()).await {
                    Ok(client) => Ok(Ok(client)),
                    Err(e) if options::is_permanent(&e) => Ok(Err(e)),
                    Err(e) => Err(e),
                }
            };
            crate::wait_for(&what, attempt)
                .await
                .map_err(|e| failed(e.into()))?
                .map_err(|e| failed(Box::new(options::Explained(e))))?
        } else {
            options.connect(addresses).await.map_err(|e| failed(Box::new(options::Explained(e))))?
        };
        Ok(Bus::from_client(client))
    }

    /// Creates the stream if it does not exist. Every component calls this for the streams it
    /// touches, so they can start in any order.
    pub async fn ensure_stream(&self, spec: StreamSpec) -> Result<stream::Stream, BusError> {
        let failed = |e: BoxError| BusError::Stream { name: spec.name, source: e };
        let config = stream::Config {
            name: spec.name.to_owned(),
            subjects: vec![spec.subjects.to_owned()],
            max_age: spec.max_age_secs.map(Duration::from_secs).unwrap_or_default(),
            storage: stream::StorageType::File,
            duplicate_window: Duration::from_secs(120),
            allow_direct: spec.direct,
            num_replicas: self.replicas,
            max_messages_per_subject: if spec.last_per_subject { 1 } else { -1 },
            ..Default::default()
        };
        let what = format!("JetStream to create or open stream {}", spec.name);
        let stream = retrying(&what, || self.js.get_or_create_stream(config.clone()))
            .await
            .map_err(|e| failed(Box::new(e)))?;
        // What `get_or_create_stream` read or created: no second request.
        let config = &stream.cached_info().config;
        let Some(what) = stream_mismatch(spec, config) else { return Ok(stream) };
        // A stream made before hafleet read by subject only lacks direct gets: turned on
        // where this component may update the stream (the renderer), refused elsewhere.
        let only_direct = spec.direct
            && stream_mismatch(spec, &stream::Config { allow_direct: true, ..config.clone() })
                .is_none();
        if only_direct
            && self
                .js
                .update_stream(stream::Config { allow_direct: true, ..config.clone() })
                .await
                .is_ok()
        {
            tracing::info!(stream = spec.name, "turned on direct gets");
            return self.js.get_stream(spec.name).await.map_err(|e| failed(Box::new(e)));
        }
        Err(BusError::StreamMismatch { name: spec.name, what })
    }

    /// An ordered consumer of `stream` (ephemeral and flow-controlled: what readers such as
    /// the operator's and the watcher's NATS users may create) over `filter` (empty: every
    /// subject), delivering from `start`.
    pub async fn ordered(
        &self,
        stream: &stream::Stream,
        filter: &str,
        start: jetstream::consumer::DeliverPolicy,
    ) -> Result<jetstream::consumer::Consumer<jetstream::consumer::push::OrderedConfig>, BusError>
    {
        stream
            .create_consumer(jetstream::consumer::push::OrderedConfig {
                deliver_subject: self.client.new_inbox(),
                filter_subject: filter.to_owned(),
                deliver_policy: start,
                ..Default::default()
            })
            .await
            .map_err(|e| BusError::Consumer {
                name: format!("ordered consumer of {}", stream.cached_info().config.name),
                source: Box::new(e),
            })
    }

    /// Opens a stream another component creates (the applier's configs stream, which only
    /// the renderer may create), waiting for it with backoff ([`crate::wait_for`]), and checks
    /// it as [`Bus::ensure_stream`] does.
    pub async fn open_stream(&self, spec: StreamSpec) -> Result<stream::Stream, BusError> {
        let what = format!("stream {} (created by the renderer)", spec.name);
        let stream = crate::wait_for(&what, || self.js.get_stream(spec.name))
            .await
            .map_err(|e| BusError::Stream { name: spec.name, source: e.into() })?;
        match stream_mismatch(spec, &stream.cached_info().config) {
            Some(what) => Err(BusError::StreamMismatch { name: spec.name, what }),
            None => Ok(stream),
        }
    }

    /// The largest payload [`Bus::publish`] accepts: the server's `max_payload` less room for
    /// the headers, which count against the same limit.
    pub fn payload_limit(&self) -> usize {
        self.client.server_info().max_payload.saturating_sub(HEADER_ROOM)
    }

    /// Publishes and waits for JetStream's ack; returns the stream sequence. `msg_id` makes a
    /// retried publish a no-op within the duplicate window; the schema header names proto's
    /// schema.
    pub async fn publish(
        &self,
        subject: String,
        msg_id: &str,
        payload: Vec<u8>,
    ) -> Result<u64, BusError> {
        self.publish_with_headers(subject, msg_id, payload, &[]).await
    }

    /// [`Bus::publish`] with extra headers (values must be single lines).
    pub async fn publish_with_headers(
        &self,
        subject: String,
        msg_id: &str,
        payload: Vec<u8>,
        extra: &[(&str, &str)],
    ) -> Result<u64, BusError> {
        let max = self.payload_limit();
        if payload.len() > max {
            return Err(BusError::TooLarge { subject, size: payload.len(), max });
        }
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(MSG_ID_HEADER, msg_id);
        headers.insert(SCHEMA_HEADER, SCHEMA_VERSION.to_string().as_str());
        for (name, value) in extra {
            headers.insert(*name, *value);
        }
        let failed = |e: BoxError| {
            crate::health::Health::global().count(NATS_ERRORS, &[("what", "publish")], 1.0);
            BusError::PublishFailed { subject: subject.clone(), source: e }
        };
        let ack = self
            .js
            .publish_with_headers(subject.clone(), headers, bytes::Bytes::from(payload))
            .await
            .map_err(|e| failed(Box::new(e)))?
            .await
            .map_err(|e| failed(Box::new(e)))?;
        Ok(ack.sequence)
    }

    /// Publishes a config version on its fleet's subject. Its id (`<fleet>-v<version>`) makes
    /// publishing it again after a crash a no-op within the duplicate window. A version with
    /// certificates, or whose message would be larger than NATS accepts, goes with its bundle
    /// in the bundles stream (by fleet and sha256, so storing it again changes nothing; each
    /// certificate by id, stored once) and the message says so: a version message never
    /// carries a sealed key, and a rotation moves one certificate, not the fleet's every one.
    pub async fn publish_version(&self, v: &ConfigVersion) -> Result<u64, BusError> {
        let id = format!("{}-v{}", v.fleet, v.version);
        let subject = hafleet_proto::configs_subject(&v.fleet);
        let certs = v.bundle().is_some_and(|b| !b.certs.is_empty());
        if !certs {
            let encoded = v.encode();
            if encoded.len() <= self.payload_limit() {
                return self.publish(subject, &id, encoded).await;
            }
        }
        let by_ref = self.stash_bundle(v).await?.fitted(self.payload_limit());
        self.publish(subject, &id, by_ref.encode()).await
    }

    /// Flushes what is pending and closes: the last step of every shutdown.
    pub async fn drain(&self) {
        let _ = self.client.drain().await;
    }
}
