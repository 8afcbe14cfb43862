//! `hafleet-bench applier`: hafleet's applier against the Kopf + ansible-playbook design it
//! replaces, on the same hosts.

use super::*;
use hafleet_proto::{Bundle, ConfigVersion, FleetName, Signer};
use hafleet_tests::{
    ChildGuard, HaproxyHost, NatsServer, SigningKeys, SshClientKeys, TestDir, bin_path,
};

#[derive(Debug, clap::Args)]
pub struct ApplierArgs {
    /// Fleet sizes measured, each with its own applier (hosts are the first N of the
    /// largest).
    #[arg(long, value_delimiter = ',', default_value = "1,5,20")]
    hosts: Vec<usize>,
    /// Changes measured per fleet size and per tool, after one warm-up.
    #[arg(long, default_value_t = 10)]
    rounds: u64,
    /// Backends in the config (one `use_backend` rule and one server each).
    #[arg(long, default_value_t = 200)]
    backends: usize,
    /// Hosts the applier updates at once after the canary (its --parallelism).
    #[arg(long, default_value_t = 5)]
    parallelism: usize,
}

/// The config both tools put live: a frontend routing `backends` hosts, each to its own
/// backend. `round` (a Jinja2 expression for ansible, a number for hafleet) changes it.
fn config(backends: usize, round: &str) -> String {
    let mut c = format!(
        "# hafleet-bench applier, round {round}\nglobal\n    httpclient.ssl.verify none\n\ndefaults\n    mode http\n    \
         timeout connect 5s\n    timeout client 30s\n    timeout server 30s\n\n\
         frontend hafleet_http\n    bind \"${{HAFLEET_HTTP_BIND-:80}}\"\n"
    );
    for i in 0..backends {
        c.push_str(&format!("    use_backend be_{i} if {{ hdr(host) -i app-{i}.example.com }}\n"));
    }
    c.push_str(
        "    default_backend be_none\n\nbackend be_none\n    http-request return status 404\n",
    );
    // A backend of the round's own: every round's config needs a reload, as a new Service
    // does, with either tool.
    c.push_str(&format!("\nbackend be_round_{round}\n    server s1 127.0.0.1:19999\n"));
    for i in 0..backends {
        c.push_str(&format!("\nbackend be_{i}\n    server s1 127.0.0.1:{} weight 1\n", 20000 + i));
    }
    c
}

fn version(fleet: &FleetName, n: u64, config: String, signer: &Signer) -> ConfigVersion {
    let bundle = Bundle::new(config, vec![], vec![]);
    signer.sign(ConfigVersion {
        parent: n.checked_sub(1).filter(|p| *p > 0),
        created_unix_ms: hafleet_runtime::now_unix_ms(),
        ..ConfigVersion::inline(fleet.clone(), n, bundle)
    })
}

/// Publishes `v` and waits until every one of `hosts` reported it applied; returns the
/// time from the publish to the last host's finish.
async fn live_in(nats: &NatsServer, hosts: &[HaproxyHost], v: &ConfigVersion) -> Result<Duration> {
    let client = nats.client().await?;
    let bus = hafleet_runtime::nats::Bus::from_client(client);
    let start = hafleet_runtime::now_unix_ms();
    bus.publish_version(v).await?;
    let reports = bus.js.get_stream(hafleet_proto::REPORTS_STREAM).await?;
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut last = 0;
    for h in hosts {
        let subject =
            hafleet_proto::reports_subject(&v.fleet, &hafleet_proto::HostName::new(h.name())?);
        loop {
            let r = reports
                .get_last_raw_message_by_subject(&subject)
                .await
                .ok()
                .and_then(|m| hafleet_proto::ApplyReport::decode(&m.payload).ok());
            match r {
                Some(r) if r.version == v.version => {
                    anyhow::ensure!(
                        matches!(r.outcome, hafleet_proto::ApplyOutcome::Applied) && r.reloads == 1,
                        "{}: not applied with one reload: {r:?}",
                        h.name()
                    );
                    last = last.max(r.finished_unix_ms);
                    break;
                }
                _ if Instant::now() > deadline => {
                    anyhow::bail!("{} never applied v{}", h.name(), v.version)
                }
                _ => tokio::time::sleep(Duration::from_millis(5)).await,
            }
        }
    }
    Ok(Duration::from_millis(last.saturating_sub(start)))
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

pub async fn run(a: ApplierArgs) -> Result<()> {
    let dir = TestDir::new("hafleet-bench-applier")?;
    let most = a.hosts.iter().copied().max().unwrap_or(1);
    let keys = SshClientKeys::generate(dir.path())?;
    let signing = SigningKeys::generate(dir.path())?;
    let signer = Signer::from_pem(&std::fs::read_to_string(&signing.private)?)?;
    let nats = NatsServer::start().await?;
    // The streams the renderer would have made.
    let admin = nats.bus().await?;
    admin.ensure_stream(hafleet_proto::CONFIGS).await?;
    admin.ensure_stream(hafleet_proto::REPORTS).await?;
    let mut hosts = Vec::new();
    for i in 1..=most {
        hosts.push(HaproxyHost::start(&format!("lb-{i}"), &keys).await?);
    }
    println!(
        "{} backends per config, {} rounds after a warm-up; hafleet: publish -> last host's \
         report; ansible: ansible-playbook's wall time (forks = hosts, pipelining, \
         ControlPersist)",
        a.backends, a.rounds
    );
    println!(
        "{:>5}  {:>22}  {:>22}  {:>7}",
        "hosts", "hafleet p50 / p90", "ansible p50 / p90", "ratio"
    );
    for &n in &a.hosts {
        let fleet = FleetName::new(format!("bench-{n}"))?;
        let subset = &hosts[..n];
        // hafleet: its applier for these hosts, versions published as the renderer would.
        nats.add_applier(fleet.as_str()).await?;
        let inventory = dir.path().join(format!("inventory-{n}.toml"));
        hafleet_tests::stack::write_inventory(&inventory, subset)?;
        let mut cmd = std::process::Command::new(bin_path("hafleet-applier"));
        cmd.envs(nats.env_for(&format!("hafleet-applier-{fleet}")))
            .env("HAFLEET_FLEET", fleet.as_str())
            .env("HAFLEET_INVENTORY", &inventory)
            .env("HAFLEET_SSH_IDENTITY", &keys.identity)
            .env("HAFLEET_SSH_KNOWN_HOSTS", &keys.known_hosts)
            .env("HAFLEET_VERIFY_KEY", &signing.public)
            .env("HAFLEET_PARALLELISM", a.parallelism.to_string())
            .env("HAFLEET_DRIFT_CHECK", "0s")
            // RUST_LOG=hafleet_applier=debug shows each remote command's time in the log.
            .env("RUST_LOG", std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()));
        let log = dir.path().join(format!("applier-{n}.log"));
        let applier = ChildGuard::spawn("hafleet-applier", &mut cmd, &log)?;
        let mut ours = Vec::new();
        for round in 0..=a.rounds {
            let v =
                version(&fleet, round + 1, config(a.backends, &format!("{n}-{round}")), &signer);
            let took = live_in(&nats, subset, &v).await?;
            if round > 0 {
                ours.push(took);
            }
        }
        drop(applier);

        // ansible-playbook: the same hosts, the same config, one change per run.
        let play = hafleet_tests::ansible::Playbook::new(
            &dir.path().join(format!("ansible-{n}")),
            subset,
            &config(a.backends, "{{ round }}"),
        )?;
        let mut theirs = Vec::new();
        for round in 0..=a.rounds {
            let start = Instant::now();
            play.run(round + 1000, n)?;
            if round > 0 {
                theirs.push(start.elapsed());
            }
        }
        // Both really put their config live.
        for h in subset {
            let live = std::fs::read_to_string(h.config_path())?;
            anyhow::ensure!(
                live.contains(&format!("round {}", a.rounds + 1000)),
                "{}: {live:.80}",
                h.name()
            );
        }
        ours.sort();
        theirs.sort();
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        println!(
            "{n:>5}  {:>9.0} / {:>6.0} ms  {:>9.0} / {:>6.0} ms  {:>6.1}x",
            ms(percentile(&ours, 0.5)),
            ms(percentile(&ours, 0.9)),
            ms(percentile(&theirs, 0.5)),
            ms(percentile(&theirs, 0.9)),
            ms(percentile(&theirs, 0.5)) / ms(percentile(&ours, 0.5)).max(0.001),
        );
    }
    Ok(())
}
