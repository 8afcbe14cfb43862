//! The settings of `hafleet-renderer run`: what it connects to, how it batches, what decides a
//! config ([`RenderArgs`], which `replay` takes too) and how much history NATS keeps.

use crate::core::render::Renderer;
use crate::core::state;
use std::path::PathBuf;
use std::time::Duration;

/// Settings of `hafleet-renderer run`.
#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub nats: hafleet_runtime::NatsArgs,
    #[command(flatten)]
    pub health: hafleet_runtime::health::HealthArgs,
    /// Directory of the renderer's state store (sled). Keep it on persistent storage: it holds
    /// every fleet's desired state and config history.
    #[arg(long, env = "HAFLEET_DATA_DIR", default_value = "/var/lib/hafleet/renderer")]
    pub data_dir: PathBuf,
    #[command(flatten)]
    pub render: RenderArgs,
    /// Most time to wait for more route events after one arrives, so that a burst of changes
    /// makes one version instead of many.
    #[arg(long, env = "HAFLEET_COALESCE", default_value = "200ms",
          value_parser = hafleet_runtime::settings::duration)]
    pub coalesce: Duration,
    /// Time without a route event after which a batch closes before --coalesce: a burst is
    /// folded for up to --coalesce. A batch that ends with the last route event of a
    /// watcher's pass, with nothing more in the stream, closes at once.
    #[arg(long, env = "HAFLEET_QUIET", default_value = "20ms",
          value_parser = hafleet_runtime::settings::duration)]
    pub quiet: Duration,
    /// Deprecated: --coalesce in milliseconds.
    #[arg(long, env = "HAFLEET_COALESCE_MS", hide = true, conflicts_with = "coalesce")]
    pub coalesce_ms: Option<u64>,
    /// Deprecated: --quiet in milliseconds.
    #[arg(long, env = "HAFLEET_QUIET_MS", hide = true, conflicts_with = "quiet")]
    pub quiet_ms: Option<u64>,
    /// Most route events folded into one batch.
    #[arg(long, env = "HAFLEET_MAX_BATCH", default_value_t = 1000)]
    pub max_batch: usize,
    /// How long to wait between tries to publish a version that could not be published.
    #[arg(long, env = "HAFLEET_PUBLISH_RETRY", default_value = "5s",
          value_parser = hafleet_runtime::settings::duration)]
    pub publish_retry: Duration,
    /// Deprecated: --publish-retry in seconds.
    #[arg(long, env = "HAFLEET_PUBLISH_RETRY_SECS", hide = true, conflicts_with = "publish_retry")]
    pub publish_retry_secs: Option<u64>,
    #[command(flatten)]
    pub retention: RetentionArgs,
    /// The renderer's ed25519 private key (PKCS#8 PEM, `openssl genpkey -algorithm ed25519`).
    /// Every version is signed with it when published; appliers apply only versions signed by
    /// a key they trust (their --verify-key), so NATS access alone cannot push a config. Keep
    /// it readable by the renderer only.
    #[arg(long, env = "HAFLEET_SIGNING_KEY")]
    pub signing_key: PathBuf,
    /// Release a sweep held by the guard (see --sweep-guard-percent) by itself this long after
    /// it was held (e.g. 30m); 0 (the default) holds it until an operator runs `hafleet-renderer
    /// sweep confirm`.
    #[arg(long, env = "HAFLEET_SWEEP_RELEASE_AFTER", default_value = "0s",
          value_parser = humantime::parse_duration)]
    pub sweep_release_after: Duration,
}

impl RunArgs {
    /// Takes the deprecated spellings of settings into the current ones; returns what was
    /// used, to log.
    pub fn settle(&mut self) -> hafleet_runtime::settings::Deprecations {
        let (ms, s) = (Duration::from_millis(1), Duration::from_secs(1));
        let mut d = hafleet_runtime::settings::Deprecations::default();
        d.renamed(self.coalesce_ms.take(), ms, &mut self.coalesce, ("coalesce-ms", "coalesce"));
        d.renamed(self.quiet_ms.take(), ms, &mut self.quiet, ("quiet-ms", "quiet"));
        let names = ("publish-retry-secs", "publish-retry");
        d.renamed(self.publish_retry_secs.take(), s, &mut self.publish_retry, names);
        d
    }
}

/// Everything that decides what a config looks like. `replay` takes the same flags (and reads
/// the same environment variables): it is byte for byte the renderer's output only with them.
#[derive(Debug, Clone, clap::Args)]
pub struct RenderArgs {
    /// minijinja template to render instead of the built-in one (see
    /// renderer/templates/haproxy.cfg.j2 for the model it receives).
    #[arg(long, env = "HAFLEET_TEMPLATE")]
    pub template: Option<PathBuf>,
    /// Most nodes listed in the backend of a Service with `externalTrafficPolicy: Cluster`
    /// (0: every Ready node). Any node forwards such a Service's traffic, so a bounded,
    /// deterministic subset (rendezvous hashing on Service and node names) keeps configs and
    /// health checks growing as Services + nodes rather than Services × nodes, and a node
    /// joining or leaving moves only the backends that hash to it. `Local` Services always
    /// list every node.
    #[arg(long, env = "HAFLEET_SERVERS_PER_BACKEND",
          default_value_t = crate::core::model::DEFAULT_SERVERS_PER_BACKEND)]
    pub servers_per_backend: usize,
    /// Empty backends (`hafleet_spare_0`, …) kept in every config while node health checks
    /// are on. A version whose only change HAProxy cannot take at runtime is new Services
    /// (up to this many) is served on each host through spares, at runtime, before the reload
    /// that gives each its own backend: at 10,000 Services a new one answers a reload's time
    /// sooner. 0: no spares (a new Service waits for its reload).
    #[arg(long, env = "HAFLEET_SPARE_BACKENDS",
          default_value_t = crate::core::model::DEFAULT_SPARE_BACKENDS)]
    pub spare_backends: usize,
    /// Check each node's health once per HAProxy host, on this port of the node (kube-proxy's
    /// `/healthz` answers on 10256, the default), and have the servers of `Cluster` backends
    /// track it (`track`) instead of checking each Service on each node. HAProxy hosts must
    /// reach it: a node whose check fails takes no `Cluster` traffic. 0: every server checks
    /// its own NodePort (for clusters whose nodes do not serve kube-proxy's health port).
    #[arg(long, env = "HAFLEET_NODE_HEALTH_PORT",
          default_value_t = crate::core::model::DEFAULT_NODE_HEALTH_PORT)]
    pub node_health_port: u16,
    /// The path node health checks ask for.
    #[arg(long, env = "HAFLEET_NODE_HEALTH_PATH",
          default_value = crate::core::model::DEFAULT_NODE_HEALTH_PATH)]
    pub node_health_path: hafleet_proto::HttpPath,
    /// Mass-deletion guard: a snapshot of the watcher (after its restart, or a resync that
    /// loses many Ingresses at once) that would withdraw more than this percentage of a
    /// fleet's routes at once withdraws none of them: the fleet keeps serving them, the
    /// renderer logs and counts the hold, and `hafleet sweep status` shows it until
    /// `sweep confirm` (or --sweep-release-after) releases it. 100 turns the guard off.
    #[arg(long, env = "HAFLEET_SWEEP_GUARD_PERCENT", default_value_t = 50,
          value_parser = clap::value_parser!(u8).range(1..=100))]
    pub sweep_guard_percent: u8,
    /// ...and only when it withdraws at least this many routes (small fleets change by more
    /// than half with a few deletions).
    #[arg(long, env = "HAFLEET_SWEEP_GUARD_MIN_ROUTES", default_value_t = 10)]
    pub sweep_guard_min_routes: usize,
}

impl RenderArgs {
    /// The settings these flags describe, the template's text read (or the built-in one), as
    /// the renderer records them in the routes stream.
    pub fn settings(&self) -> anyhow::Result<hafleet_proto::RenderSettings> {
        use anyhow::Context as _;
        let (template, builtin) = match &self.template {
            Some(path) => (
                std::fs::read_to_string(path)
                    .with_context(|| format!("cannot read template {}", path.display()))?,
                false,
            ),
            None => (crate::core::render::BUILTIN_TEMPLATE.to_owned(), true),
        };
        Ok(hafleet_proto::RenderSettings {
            schema: hafleet_proto::SCHEMA_VERSION,
            template,
            builtin,
            servers_per_backend: self.servers_per_backend,
            spare_backends: self.spare_backends,
            node_health: (self.node_health_port != 0)
                .then(|| (self.node_health_port, self.node_health_path.clone())),
            sweep_guard_percent: self.sweep_guard_percent,
            sweep_guard_min_routes: self.sweep_guard_min_routes,
        })
    }

    /// The mass-deletion guard these flags describe.
    pub fn guard(&self) -> state::SweepGuard {
        state::SweepGuard {
            percent: self.sweep_guard_percent,
            min_routes: self.sweep_guard_min_routes,
        }
    }

    /// The renderer these flags describe.
    pub fn renderer(&self) -> anyhow::Result<Renderer> {
        let settings = self.settings()?;
        let what = match &self.template {
            Some(path) => format!("template {}", path.display()),
            None => "the built-in template".to_owned(),
        };
        anyhow::Context::with_context(Renderer::from_settings(&settings), || what)
    }
}

/// How much history NATS keeps, and how often the renderer checkpoints its desired state so
/// that any point inside the kept history can be replayed (`hafleet replay`) and an
/// empty store can be rebuilt. The renderer owns the routes and configs streams' retention: it
/// sets them to these values at start-up.
///
/// Keep the routes stream's limits well above a checkpoint's span (`--checkpoint-every`
/// events, `--checkpoint-interval`) and above the longest time the renderer may be down:
/// messages the stream drops before the renderer applied them are lost to it.
#[derive(Debug, Clone, clap::Args)]
pub struct RetentionArgs {
    /// Oldest route event the routes stream keeps (e.g. 30d, 12h; 0 keeps them forever).
    #[arg(long, env = "HAFLEET_ROUTES_MAX_AGE", default_value = "30d",
          value_parser = humantime::parse_duration)]
    pub routes_max_age: Duration,
    /// Most bytes the routes stream keeps, oldest dropped first (e.g. 1GiB, 500MB; 0: no limit).
    #[arg(long, env = "HAFLEET_ROUTES_MAX_BYTES", default_value = "1GiB",
          value_parser = hafleet_runtime::parse_bytes)]
    pub routes_max_bytes: u64,
    /// Oldest config version the configs stream keeps. Appliers need only the newest;
    /// `history` reads the renderer's store, which keeps every version.
    #[arg(long, env = "HAFLEET_CONFIGS_MAX_AGE", default_value = "90d",
          value_parser = humantime::parse_duration)]
    pub configs_max_age: Duration,
    /// Most bytes the configs stream keeps.
    #[arg(long, env = "HAFLEET_CONFIGS_MAX_BYTES", default_value = "2GiB",
          value_parser = hafleet_runtime::parse_bytes)]
    pub configs_max_bytes: u64,
    /// Checkpoint the desired state after this many route events...
    #[arg(long, env = "HAFLEET_CHECKPOINT_EVERY", default_value_t = 10_000)]
    pub checkpoint_every: u64,
    /// ...or this long after the last checkpoint, if anything changed since.
    #[arg(long, env = "HAFLEET_CHECKPOINT_INTERVAL", default_value = "6h",
          value_parser = humantime::parse_duration)]
    pub checkpoint_interval: Duration,
}
