//! NATS JetStream plumbing shared by the binaries.

use async_nats::jetstream::{self, object_store, stream};
use hafleet_proto::{
    Body, Bundle, ConfigVersion, MSG_ID_HEADER, SCHEMA_HEADER, SCHEMA_VERSION, StreamSpec,
};
use std::time::Duration;
use tokio::io::AsyncReadExt as _;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Bytes kept free of payload for the headers hafleet sets (message id, schema).
const HEADER_ROOM: usize = 1024;

#[derive(Debug, thiserror::Error)]
pub enum BusError {
    #[error("cannot connect to NATS at {url}")]
    Connect { url: String, source: async_nats::ConnectError },
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
    #[error("object store {bucket}: {what} failed")]
    ObjectStore { bucket: String, what: String, source: BoxError },
    #[error("bundle {name} of version {version} in {bucket} is unusable")]
    BadBundle { bucket: String, name: String, version: u64, source: BoxError },
}

/// How an existing stream's configuration differs from what hafleet relies on: its subjects
/// (every message of a stream must be one of hafleet's, and all of hafleet's must land in it),
/// file storage (survives a restart) and limits retention (messages stay until they age out,
/// whoever has read them). Retention limits (age, bytes) may differ: operators and the
/// renderer set those. `None`: it is hafleet's stream.
pub fn stream_mismatch(spec: StreamSpec, config: &stream::Config) -> Option<String> {
    let mut found = Vec::new();
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
        let work = stream::Config { retention: stream::RetentionPolicy::WorkQueue, ..ours };
        assert!(stream_mismatch(spec, &work).unwrap().contains("retention"));
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

/// The NATS settings every binary takes (`#[command(flatten)]`).
#[derive(Debug, Clone, clap::Args)]
pub struct NatsArgs {
    /// NATS server URL. A user and password may be given in it
    /// (nats://user:password@host:4222, percent-encoded); they are passed as connect options
    /// and never shown in messages.
    #[arg(long, env = "HAFLEET_NATS_URL", default_value = "nats://127.0.0.1:4222")]
    pub nats_url: String,
}

impl NatsArgs {
    pub async fn connect(&self) -> Result<Bus, BusError> {
        Bus::connect(&self.nats_url).await
    }
}

/// A connection to NATS and its JetStream context.
#[derive(Debug, Clone)]
pub struct Bus {
    pub client: async_nats::Client,
    pub js: jetstream::Context,
}

impl Bus {
    /// Connects, naming the URL in the error.
    pub async fn connect(url: &str) -> Result<Bus, BusError> {
        let (address, credentials) = split_credentials(url);
        let mut options = async_nats::ConnectOptions::new();
        if let Some((user, password)) = credentials {
            options = options.user_and_password(user, password);
        }
        let client = options
            .connect(address)
            .await
            .map_err(|source| BusError::Connect { url: redact(url), source })?;
        Ok(Bus { js: jetstream::new(client.clone()), client })
    }

    /// Creates the stream if it does not exist. Every component calls this for the streams it
    /// touches, so they can start in any order.
    pub async fn ensure_stream(&self, spec: StreamSpec) -> Result<stream::Stream, BusError> {
        let stream = self
            .js
            .get_or_create_stream(stream::Config {
                name: spec.name.to_owned(),
                subjects: vec![spec.subjects.to_owned()],
                max_age: spec.max_age_secs.map(Duration::from_secs).unwrap_or_default(),
                storage: stream::StorageType::File,
                duplicate_window: Duration::from_secs(120),
                ..Default::default()
            })
            .await
            .map_err(|e| BusError::Stream { name: spec.name, source: Box::new(e) })?;
        // What `get_or_create_stream` read or created: no second request.
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
        let failed = |e: BoxError| BusError::PublishFailed { subject: subject.clone(), source: e };
        let ack = self
            .js
            .publish_with_headers(subject.clone(), headers, bytes::Bytes::from(payload))
            .await
            .map_err(|e| failed(Box::new(e)))?
            .await
            .map_err(|e| failed(Box::new(e)))?;
        Ok(ack.sequence)
    }

    /// The object store of large bundles, created if it does not exist yet.
    pub async fn bundle_store(&self) -> Result<object_store::ObjectStore, BusError> {
        let bucket = hafleet_proto::BUNDLES_BUCKET.to_owned();
        if let Ok(store) = self.js.get_object_store(&bucket).await {
            return Ok(store);
        }
        self.js
            .create_object_store(object_store::Config {
                bucket: bucket.clone(),
                description: Some("hafleet bundles too large for a message".into()),
                storage: stream::StorageType::File,
                ..Default::default()
            })
            .await
            .map_err(|e| BusError::ObjectStore {
                bucket,
                what: "create".into(),
                source: Box::new(e),
            })
    }

    /// Publishes a config version on its fleet's subject. Its id (`<fleet>-v<version>`) makes
    /// publishing it again after a crash a no-op within the duplicate window. A version whose
    /// message would be larger than NATS accepts goes with its bundle in the fleet's object store
    /// (by sha256, so storing it again changes nothing) and the message names it.
    pub async fn publish_version(&self, v: &ConfigVersion) -> Result<u64, BusError> {
        let id = format!("{}-v{}", v.fleet, v.version);
        let subject = hafleet_proto::configs_subject(&v.fleet);
        let encoded = v.encode();
        if encoded.len() <= self.payload_limit() {
            return self.publish(subject, &id, encoded).await;
        }
        let by_ref = self.stash_bundle(v).await?;
        self.publish(subject, &id, by_ref.encode()).await
    }

    /// Puts `v`'s bundle into the object store (by fleet and sha256, so storing it again
    /// changes nothing) and returns `v` naming it instead of carrying it.
    pub async fn stash_bundle(&self, v: &ConfigVersion) -> Result<ConfigVersion, BusError> {
        let Body::Inline { bundle } = &v.body else { return Ok(v.clone()) };
        let store = self.bundle_store().await?;
        let bucket = hafleet_proto::BUNDLES_BUCKET.to_owned();
        let name = hafleet_proto::bundle_object(&v.fleet, &v.sha256);
        let stored = match store.info(&name).await {
            Ok(info) => !info.deleted && info.size > 0,
            Err(_) => false,
        };
        if !stored {
            let json = serde_json::to_vec(bundle).expect("bundles serialize");
            store.put(name.as_str(), &mut json.as_slice()).await.map_err(|e| {
                BusError::ObjectStore {
                    bucket: bucket.clone(),
                    what: format!("put {name}"),
                    source: Box::new(e),
                }
            })?;
        }
        let mut by_ref = v.clone();
        by_ref.body = Body::Object { name };
        Ok(by_ref)
    }

    /// `v` with its bundle inline: as it came, or read from the fleet's object store and
    /// checked against the sha256 the version names.
    pub async fn fetch_bundle(&self, v: ConfigVersion) -> Result<ConfigVersion, BusError> {
        let Body::Object { name } = &v.body else { return Ok(v) };
        let name = name.clone();
        let bucket = hafleet_proto::BUNDLES_BUCKET.to_owned();
        let failed = |what: &str, e: BoxError| BusError::ObjectStore {
            bucket: bucket.clone(),
            what: format!("{what} {name}"),
            source: e,
        };
        let store =
            self.js.get_object_store(&bucket).await.map_err(|e| failed("open for", Box::new(e)))?;
        let mut object = store.get(&name).await.map_err(|e| failed("get", Box::new(e)))?;
        let mut json = Vec::new();
        object.read_to_end(&mut json).await.map_err(|e| failed("read", Box::new(e)))?;
        let version = v.version;
        let bad = |e: BoxError| BusError::BadBundle { bucket, name, version, source: e };
        match serde_json::from_slice::<Bundle>(&json) {
            Ok(bundle) => v.with_bundle(bundle).map_err(|e| bad(Box::new(e))),
            Err(e) => Err(bad(Box::new(e))),
        }
    }

    /// Flushes what is pending and closes: the last step of every shutdown.
    pub async fn drain(&self) {
        let _ = self.client.drain().await;
    }
}
