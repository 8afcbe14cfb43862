//! The renderer's side of the history API: answers `hafleet.history.<fleet>` requests from its
//! own store, between batches, so a rollback is ordered with route events.

use super::publish::{publish_confirm, publish_unpublished};
use crate::adapters::store::Store;
use crate::core::render::Renderer;
use crate::core::state::Desired;
use crate::core::versions::{Latest, next_version};
use hafleet_proto::{Cause, FleetName, HistoryErrorKind, HistoryReply, HistoryRequest};
use hafleet_runtime::nats::Bus;

/// Everything a request may read or change.
#[derive(Clone, Copy)]
pub struct Ctx<'a> {
    pub bus: &'a Bus,
    pub store: &'a Store,
    pub renderer: &'a Renderer,
    pub desired: &'a Desired,
    pub signer: &'a hafleet_proto::Signer,
}

fn error(kind: HistoryErrorKind, message: impl Into<String>) -> HistoryReply {
    HistoryReply::Error { kind, message: message.into() }
}

/// Answers one request. Failures become error replies; nothing here stops the renderer.
pub async fn handle(ctx: &Ctx<'_>, fleet: &FleetName, request: HistoryRequest) -> HistoryReply {
    match answer(ctx, fleet, request).await {
        Ok(reply) => reply,
        Err(e) => error(HistoryErrorKind::Internal, format!("{e:#}")),
    }
}

async fn answer(
    ctx: &Ctx<'_>,
    fleet: &FleetName,
    request: HistoryRequest,
) -> anyhow::Result<HistoryReply> {
    let store = ctx.store;
    if !store.knows(fleet)? {
        return Ok(error(HistoryErrorKind::UnknownFleet, format!("fleet {fleet} has no versions")));
    }
    let no_such = |n: u64| {
        error(HistoryErrorKind::NoSuchVersion, format!("fleet {fleet} has no version {n}"))
    };
    match request {
        HistoryRequest::List { limit } => Ok(HistoryReply::List {
            versions: store.summaries(fleet, limit.max(1))?,
            pinned: store.pinned(fleet)?,
        }),
        HistoryRequest::Show { version } => {
            let (Some(summary), Some(v)) =
                (store.summary(fleet, version)?, store.version(fleet, version)?)
            else {
                return Ok(no_such(version));
            };
            let limit = ctx.bus.payload_limit();
            let whole =
                HistoryReply::Version { summary: summary.clone(), version: Box::new(v.clone()) };
            if whole.encode().len() <= limit {
                return Ok(whole);
            }
            // A bundle too large for a reply goes to the object store (the reply names it),
            // and its causes are cut too if they alone are more than a reply takes.
            let stashed = ctx.bus.stash_bundle(&v).await?;
            Ok(HistoryReply::version_within(summary, &stashed, limit).unwrap_or_else(|| {
                error(
                    HistoryErrorKind::Internal,
                    format!("version {version}'s record does not fit a reply of {limit} bytes"),
                )
            }))
        }
        HistoryRequest::Rollback { version } => {
            let Some(old) = store.version(fleet, version)? else { return Ok(no_such(version)) };
            let latest = store.latest_summary(fleet)?.map(|l| l.number).unwrap_or(0);
            let mut v = old;
            v.version = latest + 1;
            v.parent = Some(latest);
            v.created_unix_ms = hafleet_runtime::now_unix_ms();
            v.restores = Some(version);
            v.causes = vec![Cause {
                stream_seq: store.applied_seq()?,
                ingress: None,
                what: "rollback".into(),
                resource_version: None,
                added: vec![],
                removed: vec![],
                note: None,
            }];
            v.notes = vec![format!(
                "rolled back to version {version} by an operator; the fleet stays on it until \
                 `hafleet resume --fleet {fleet}`"
            )];
            let number = v.version;
            store.commit(&[], &[v], store.applied_seq()?)?;
            store.set_pinned(fleet, Some(number))?;
            super::publish::fleet_gauges(store, fleet, None)?;
            publish_unpublished(ctx.bus, store, ctx.signer, None).await?;
            tracing::info!(fleet = %fleet, version = number, restores = version, "rolled back; fleet pinned");
            Ok(HistoryReply::Done { version: Some(number), pinned: Some(number) })
        }
        HistoryRequest::Resume => {
            let Some(pinned) = store.pinned(fleet)? else {
                return Ok(HistoryReply::Done { version: None, pinned: None });
            };
            let pinned_sha = store.summary(fleet, pinned)?.map(|s| s.sha256).unwrap_or_default();
            let latest = store.latest_summary(fleet)?.map(|l| l.number).unwrap_or(0);
            store.set_pinned(fleet, None)?;
            store.set_resumed(fleet)?;
            super::publish::fleet_gauges(store, fleet, None)?;
            let cause = Cause {
                stream_seq: store.applied_seq()?,
                ingress: None,
                what: "resume".into(),
                resource_version: None,
                added: vec![],
                removed: vec![],
                note: None,
            };
            let made = next_version(
                ctx.renderer,
                fleet,
                ctx.desired,
                Some(Latest { version: latest, sha256: &pinned_sha }),
                0,
                vec![cause],
                hafleet_runtime::now_unix_ms(),
            )?;
            let number = made.as_ref().map(|v| v.version);
            if let Some(v) = made {
                store.commit(&[], &[v], store.applied_seq()?)?;
                publish_unpublished(ctx.bus, store, ctx.signer, None).await?;
            }
            tracing::info!(fleet = %fleet, version = ?number, "resumed");
            Ok(HistoryReply::Done { version: number, pinned: None })
        }
        HistoryRequest::HeldSweep => {
            let mut held = ctx.desired.held_in(fleet).cloned();
            Ok(HistoryReply::Held { sweep: held.next(), more: held.collect() })
        }
        HistoryRequest::ConfirmSweep { snapshot_seq } => {
            let held = ctx.desired.held_in(fleet).find(|h| h.snapshot_seq == snapshot_seq);
            let Some(held) = held else {
                let seqs: Vec<String> =
                    ctx.desired.held_in(fleet).map(|h| h.snapshot_seq.to_string()).collect();
                let now = match seqs.as_slice() {
                    [] => "no sweep is held".to_owned(),
                    [one] => format!("the sweep held is the snapshot at {one}"),
                    _ => format!("the sweeps held are the snapshots at {}", seqs.join(", ")),
                };
                return Ok(error(
                    HistoryErrorKind::NoSuchSweep,
                    format!("fleet {fleet}: no sweep held for snapshot {snapshot_seq}; {now}"),
                ));
            };
            let epoch = ctx.desired.epoch(held.cluster.as_ref());
            let stream_seq = publish_confirm(ctx.bus, fleet, held, epoch, "operator").await?;
            Ok(HistoryReply::Confirmed { stream_seq })
        }
    }
}

/// Answers one history request and replies; a request without a reply subject is dropped.
pub(crate) async fn answer_history(ctx: Ctx<'_>, request: async_nats::Message) {
    use hafleet_proto::{HistoryErrorKind, HistoryReply, HistoryRequest};
    let Some(reply_to) = request.reply.clone() else { return };
    if request.subject.as_str() == hafleet_proto::DEADLETTER_REPUBLISH_SUBJECT {
        let reply = match serde_json::from_slice(&request.payload) {
            Ok(hafleet_proto::RepublishRequest { deadletter_seq }) => {
                republish(ctx.bus, ctx.desired, deadletter_seq).await.unwrap_or_else(|e| {
                    HistoryReply::Error {
                        kind: HistoryErrorKind::Internal,
                        message: format!("{e:#}"),
                    }
                })
            }
            Err(e) => HistoryReply::Error {
                kind: HistoryErrorKind::BadRequest,
                message: format!("not a republish request: {e}"),
            },
        };
        if let Err(e) = ctx.bus.client.publish(reply_to, reply.encode().into()).await {
            tracing::warn!(error = %e, "republish reply lost");
        }
        return;
    }
    if request.subject.as_str() == hafleet_proto::FLEETS_SUBJECT {
        let reply = fleets(&ctx).unwrap_or_else(|e| HistoryReply::Error {
            kind: HistoryErrorKind::Internal,
            message: format!("{e:#}"),
        });
        if let Err(e) = ctx.bus.client.publish(reply_to, reply.encode().into()).await {
            tracing::warn!(error = %e, "fleets reply lost");
        }
        return;
    }
    // hafleet.history.<fleet>, or hafleet.history.<fleet>.change for what changes the fleet.
    let mut tokens = request.subject.as_str().split('.').skip(2);
    let (fleet, on_change) = (tokens.next().unwrap_or_default(), tokens.next() == Some("change"));
    let reply =
        match (FleetName::new(fleet), serde_json::from_slice::<HistoryRequest>(&request.payload)) {
            (Ok(fleet), Ok(req)) if req.changes() != on_change => HistoryReply::Error {
                kind: HistoryErrorKind::BadRequest,
                message: format!(
                    "{} goes on {}: a rollback, resume or sweep release on \
                     hafleet.history.<fleet>.change (which NATS may grant per fleet), the rest \
                     on hafleet.history.<fleet>; an older CLI than this renderer sends them \
                     all on the latter: upgrade it",
                    req.encode_name(),
                    req.subject(&fleet)
                ),
            },
            (Ok(fleet), Ok(req)) => handle(&ctx, &fleet, req).await,
            (Err(e), _) => {
                HistoryReply::Error { kind: HistoryErrorKind::BadRequest, message: e.to_string() }
            }
            (_, Err(e)) => HistoryReply::Error {
                kind: HistoryErrorKind::BadRequest,
                message: format!("not a history request: {e}"),
            },
        };
    if let Err(e) = ctx.bus.client.publish(reply_to, reply.encode().into()).await {
        tracing::warn!(error = %e, "history reply lost");
    }
}

/// Every fleet with versions or desired state, by name.
fn fleets(ctx: &Ctx<'_>) -> anyhow::Result<HistoryReply> {
    let store = ctx.store;
    let mut names: std::collections::BTreeSet<FleetName> =
        store.fleets_with_versions()?.into_iter().collect();
    names.extend(ctx.desired.fleets.keys().cloned());
    let mut fleets = Vec::with_capacity(names.len());
    for name in names {
        let newest = store.latest_summary(&name)?;
        fleets.push(hafleet_proto::FleetSummary {
            newest: newest.as_ref().map(|v| v.number),
            newest_unix_ms: newest.as_ref().map(|v| v.created_unix_ms),
            published: store.published(&name)?,
            pinned: store.pinned(&name)?,
            held_sweeps: ctx.desired.held_in(&name).count(),
            objects: ctx.desired.ingresses(&name).len(),
            name,
        });
    }
    Ok(HistoryReply::Fleets { fleets })
}

/// Publishes the route message parked at `seq` of the dead-letter stream again, on
/// [`hafleet_proto::ROUTES_REPUBLISH_SUBJECT`], if this build can read it: into the routes
/// stream, so it is applied in order with every other event, and replayed. Its message id
/// names the parked message: asking twice within the stream's duplicate window publishes once.
///
/// Only a route event is republished, and only one that is still the newest word on its
/// object: not one whose watcher run is over (it would be ignored), nor one older than the
/// event the renderer last applied for its object (it would undo a later change). A snapshot,
/// a node set or settings are superseded by the watcher's next ones: restarting the watcher
/// restates them.
async fn republish(bus: &Bus, desired: &Desired, seq: u64) -> anyhow::Result<HistoryReply> {
    use anyhow::Context as _;
    let Some(parked) = crate::adapters::bus::deadletter_message(bus, seq).await? else {
        return Ok(error(
            HistoryErrorKind::NoSuchMessage,
            format!("the dead-letter stream has no message {seq}"),
        ));
    };
    if parked.subject.as_str() != hafleet_proto::ROUTES_DEADLETTER_SUBJECT {
        return Ok(error(
            HistoryErrorKind::BadRequest,
            format!("message {seq} is not a parked route message (subject {})", parked.subject),
        ));
    }
    let event = match hafleet_proto::RouteMessage::decode(&parked.payload) {
        Err(e) => {
            return Ok(error(
                HistoryErrorKind::BadRequest,
                format!("this renderer still cannot read message {seq}: {e}; upgrade it first"),
            ));
        }
        Ok(hafleet_proto::RouteMessage::Event(event)) => event,
        Ok(_) => {
            return Ok(error(
                HistoryErrorKind::BadRequest,
                format!(
                    "message {seq} is no route event: a snapshot, node set or settings message \
                     is superseded by the watcher's next one; restart the watcher to restate \
                     everything instead"
                ),
            ));
        }
    };
    let refuse = |why: String| Ok(error(HistoryErrorKind::BadRequest, why));
    let newest_epoch = desired.epoch(event.ingress.cluster.as_ref());
    if event.epoch < newest_epoch {
        return refuse(format!(
            "message {seq} comes from a watcher run (epoch {}) that is over (now {newest_epoch}): \
             it would be ignored, and that run's successor restated {}",
            event.epoch, event.ingress
        ));
    }
    let source: Option<u64> =
        parked.headers.get(hafleet_proto::SOURCE_SEQ_HEADER).and_then(|v| v.as_str().parse().ok());
    let applied = desired.ingresses(&event.fleet).get(&event.ingress).map(|e| e.seq);
    if let (Some(source), Some(applied)) = (source, applied)
        && applied > source
    {
        return refuse(format!(
            "a newer event of {} (routes sequence {applied}) was applied after message {seq} \
             (sequence {source}): republishing it would undo that change",
            event.ingress
        ));
    }
    let seq_text = seq.to_string();
    let stream_seq = bus
        .publish_with_headers(
            hafleet_proto::ROUTES_REPUBLISH_SUBJECT.to_owned(),
            &format!("republish-{seq}"),
            parked.payload.to_vec(),
            &[(hafleet_proto::DEADLETTER_SEQ_HEADER, &seq_text)],
        )
        .await
        .with_context(|| format!("cannot republish parked message {seq}"))?;
    tracing::info!(deadletter_seq = seq, stream_seq, "parked route message republished");
    Ok(HistoryReply::Republished { stream_seq })
}
