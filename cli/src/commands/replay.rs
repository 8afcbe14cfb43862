//! `hafleet replay`: the config a fleet would have had at a point of the routes stream,
//! rebuilt on the operator's machine from the stream itself (and the newest checkpoint before
//! that point, once the stream has dropped its oldest messages). It needs neither the renderer's
//! store nor the renderer: only NATS, read as the `hafleet-operator` user.

use super::history::{Fleet, diff, print_bundle};
use crate::output::Output;
use crate::session::Session;
use anyhow::{Context as _, bail};
use async_nats::jetstream::consumer::{DeliverPolicy, push};
use futures::StreamExt as _;
use hafleet_proto::RouteMessage;
use hafleet_renderer::adapters::bus;
use hafleet_renderer::core::checkpoint::{Base, base_for};
use hafleet_renderer::core::state::{self, Applied, Desired};
use std::io::IsTerminal as _;
use std::time::Duration;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

/// A point of the routes stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Until {
    /// After this stream sequence.
    Seq(u64),
    /// After the last message stored at or before this time.
    Time(OffsetDateTime),
}

impl std::str::FromStr for Until {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if let Ok(n) = s.parse::<u64>() {
            return Ok(Until::Seq(n));
        }
        OffsetDateTime::parse(s, &Rfc3339).map(Until::Time).map_err(|_| {
            format!(
                "{s:?} is neither a stream sequence nor an RFC 3339 time (2026-11-23T10:00:00Z)"
            )
        })
    }
}

#[derive(Debug, clap::Args)]
pub struct ReplayArgs {
    /// Where to stop: a routes stream sequence (as `history why` shows them), or an RFC 3339
    /// time (the state after the last route event stored at or before it).
    #[arg(long)]
    pub until: Until,
    /// Show a unified diff from the newest version (asked of the running renderer) to the
    /// replayed config, instead of the config (-o json|yaml: the point, where replay
    /// started, the sha256 and the bundle).
    #[arg(long)]
    pub diff: bool,
    /// The renderer's own settings (template, servers per backend, node health, sweep guard),
    /// for points of the stream before any renderer recorded its own there (older releases):
    /// after that, the recorded ones are used and these are ignored.
    #[command(flatten)]
    pub render: hafleet_renderer::app::args::RenderArgs,
}

/// How long to wait for the next stream message before calling the stream stuck.
const READ_TIMEOUT: Duration = Duration::from_secs(20);

/// Runs `hafleet replay`.
pub async fn replay(session: &Session, args: ReplayArgs) -> anyhow::Result<()> {
    let bus = session.connect().await?;
    let fleet = match &session.fleet {
        Some(name) => name.clone(),
        None => session.fleet(&bus).await?,
    };
    let bounds = bus::routes_bounds(&bus).await?;
    let (first, last) = (bounds.first, bounds.last);
    let until = match args.until {
        Until::Seq(n) if n > last => {
            eprintln!("the routes stream ends at sequence {last}; replaying to there");
            last
        }
        Until::Seq(n) => n,
        Until::Time(t) => seq_at(&bus, t, &bounds).await?,
    };
    let bucket = bus::checkpoint_store(&bus, false).await?;
    let checkpoints = match &bucket {
        Some(b) => bus::list_checkpoints(b).await?,
        None => vec![],
    };
    let (mut desired, from) = match base_for(&checkpoints, until, first)? {
        Base::Empty => (Desired::new(), 1),
        Base::Checkpoint(seq) => {
            let b = bucket.as_ref().context("checkpoint bucket vanished")?;
            let c = bus::get_checkpoint(b, seq).await?;
            if c.routes_stream_created != bounds.created {
                bail!(
                    "checkpoint {seq} is of a routes stream that no longer exists (the stream \
                     was created anew); it cannot be replayed"
                );
            }
            (c.desired(), seq + 1)
        }
    };
    let events = apply_range(&bus, &mut desired, &args.render.guard(), from, until).await?;
    let Some(ingresses) = desired.fleets.get(&fleet) else {
        bail!("unknown fleet: {fleet} has no route events up to sequence {until}");
    };
    // With the renderer's settings of that point, as it recorded them in the stream.
    let renderer = match &desired.render {
        Some(settings) => {
            eprintln!(
                "rendering with the settings the renderer recorded (template {})",
                &settings.template_sha256()[..12]
            );
            hafleet_renderer::core::render::Renderer::from_settings(settings)?
        }
        None => {
            eprintln!("no render settings recorded before this point: rendering with the flags'");
            args.render.renderer()?
        }
    };
    // As the renderer builds a version: its certificates and default certificate included.
    let fleetwide = hafleet_renderer::core::render::Fleetwide::of(&desired, &fleet);
    let model = renderer.model(&fleet, ingresses, &desired.nodes, fleetwide);
    let bundle = renderer.render(&model).context("render failed")?;
    let sha256 = bundle.sha256();
    let started =
        if from > 1 { format!("checkpoint after {}", from - 1) } else { "the start".into() };
    eprintln!(
        "fleet {fleet} at routes sequence {until}: replayed {events} events from {started}; \
         sha256 {}",
        &sha256[..12]
    );
    if session.output != Output::Table {
        let mut out = serde_json::json!({
            "fleet": fleet, "until_seq": until, "from_seq": from, "events": events,
            "sha256": sha256, "bundle": bundle,
        });
        super::history::hide_sealed_keys(&mut out, "/bundle/certs");
        session.output.print(&out)?;
    } else if args.diff {
        let fleet = Fleet { session, bus, name: fleet };
        let newest = fleet.newest().await?;
        let (_, v) = fleet.version(newest).await?;
        let text = diff(
            (&format!("v{newest}"), v.bundle().context("bundle missing")?),
            (&format!("seq-{until}"), &bundle),
        );
        print!("{}", super::history::colour(&text, std::io::stdout().is_terminal()));
    } else {
        print_bundle(&bundle);
    }
    Ok(())
}

/// An ordered consumer of the routes stream from `start` (ephemeral, flow-controlled: what
/// the operator's NATS user may create).
async fn ordered(
    bus: &bus::Bus,
    start: DeliverPolicy,
) -> anyhow::Result<async_nats::jetstream::consumer::Consumer<push::OrderedConfig>> {
    let stream = bus.js.get_stream(hafleet_proto::ROUTES_STREAM).await?;
    bus.ordered(&stream, "", start).await.context("cannot read the routes stream")
}

/// The last sequence stored at or before `t`: one before the first message stored after it.
/// A time before the oldest message the stream still holds has no known sequence once the
/// stream has dropped messages: refused.
async fn seq_at(
    bus: &bus::Bus,
    t: OffsetDateTime,
    bounds: &bus::RoutesBounds,
) -> anyhow::Result<u64> {
    let after = t + time::Duration::nanoseconds(1);
    let last = bounds.last;
    if let Some(horizon) = bounds.horizon
        && t < horizon
    {
        bail!(
            "{} is older than the kept history: the routes stream dropped its events before \
             sequence {} and can place no time before {}",
            t.format(&Rfc3339).unwrap_or_default(),
            bounds.first,
            horizon.format(&Rfc3339).unwrap_or_default()
        );
    }
    let consumer = ordered(bus, DeliverPolicy::ByStartTime { start_time: after }).await?;
    if consumer.cached_info().num_pending == 0 {
        return Ok(last);
    }
    let mut messages = consumer.messages().await.context("cannot read the routes stream")?;
    let first = tokio::time::timeout(READ_TIMEOUT, messages.next())
        .await
        .context("the routes stream did not answer")?
        .context("the routes stream ended")??;
    let info = first.info().map_err(|e| anyhow::anyhow!("message without metadata: {e}"))?;
    Ok(info.stream_sequence.saturating_sub(1))
}

/// Applies the stream's messages `from..=until` to `desired`; returns how many it read.
/// Messages this build cannot read are skipped, as the renderer skips (and parks) them.
async fn apply_range(
    bus: &bus::Bus,
    desired: &mut Desired,
    guard: &state::SweepGuard,
    from: u64,
    until: u64,
) -> anyhow::Result<u64> {
    if from > until {
        return Ok(0);
    }
    let consumer = ordered(bus, DeliverPolicy::ByStartSequence { start_sequence: from }).await?;
    let mut messages = consumer.messages().await.context("cannot read the routes stream")?;
    let mut count = 0;
    let mut out = Applied::default();
    // Snapshot parts read since the last snapshot, for the snapshot that names them; a part
    // before `from` is read from the stream by itself.
    let mut parts: std::collections::BTreeMap<u64, bytes::Bytes> = Default::default();
    loop {
        let m = tokio::time::timeout(READ_TIMEOUT, messages.next())
            .await
            .context("the routes stream stopped answering")?
            .context("the routes stream ended")??;
        let info = m.info().map_err(|e| anyhow::anyhow!("message without metadata: {e}"))?;
        let seq = info.stream_sequence;
        if seq > until {
            break;
        }
        match RouteMessage::decode(&m.payload) {
            Ok(msg) if !msg.on_its_subject(m.subject.as_str()) => eprintln!(
                "sequence {seq} skipped: a message of the renderer's own on {} (the renderer \
                 parks such messages)",
                m.subject
            ),
            Ok(msg) => {
                if let RouteMessage::SnapshotPart(_) = &msg {
                    parts.insert(seq, m.payload.clone());
                }
                let is_snapshot = matches!(msg, RouteMessage::Snapshot(_));
                let read = async |part: u64| match parts.get(&part) {
                    Some(bytes) => Ok(Some(bytes.clone())),
                    None => read_at(bus, part).await,
                };
                match hafleet_renderer::core::snapshots::whole(msg, read).await? {
                    Ok(msg) => state::apply(desired, seq, &msg, guard, &mut out),
                    Err(e) => eprintln!(
                        "sequence {seq} skipped: snapshot in parts cannot be made whole: {e} \
                         (the renderer parks such messages)"
                    ),
                }
                if is_snapshot {
                    parts.clear();
                }
            }
            Err(e) => eprintln!("sequence {seq} skipped: {e} (the renderer parks such messages)"),
        }
        // Only the state matters here; what the renderer would write is dropped as it goes.
        out = Applied::default();
        count += 1;
        if seq >= until {
            break;
        }
    }
    Ok(count)
}

/// The routes stream's message at `seq` (`None`: no longer there), read with an ordered
/// consumer: the operator's NATS user reads the stream that way, not by direct get.
async fn read_at(bus: &bus::Bus, seq: u64) -> anyhow::Result<Option<bytes::Bytes>> {
    let consumer = ordered(bus, DeliverPolicy::ByStartSequence { start_sequence: seq }).await?;
    if consumer.cached_info().num_pending == 0 {
        return Ok(None);
    }
    let mut messages = consumer.messages().await.context("cannot read the routes stream")?;
    let m = tokio::time::timeout(READ_TIMEOUT, messages.next())
        .await
        .context("the routes stream stopped answering")?
        .context("the routes stream ended")??;
    let info = m.info().map_err(|e| anyhow::anyhow!("message without metadata: {e}"))?;
    Ok((info.stream_sequence == seq).then(|| m.payload.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_point_is_a_sequence_or_an_rfc3339_time() {
        assert_eq!("42".parse::<Until>(), Ok(Until::Seq(42)));
        let t: Until = "2026-11-23T10:00:00Z".parse().unwrap();
        assert!(matches!(t, Until::Time(t) if t.unix_timestamp() == 1_795_428_000));
        let e = "yesterday".parse::<Until>().unwrap_err();
        assert!(e.contains("neither a stream sequence nor an RFC 3339 time"), "{e}");
    }
}
