//! `hafleet deadletter list|show|republish`: the route messages the renderer could
//! not read (a newer watcher's schema, a value outside an allowlist), parked on the
//! dead-letter stream. `list` and `show` read the stream; `republish` asks the running
//! renderer to publish a parked message again into the routes stream, once an upgrade lets it
//! read it.

use crate::output::Output;
use crate::session::Session;
use anyhow::{Context as _, bail};
use hafleet_proto::{
    DEADLETTER_REPUBLISH_SUBJECT, DEADLETTER_STREAM, ERROR_HEADER, HistoryReply, RepublishRequest,
    SOURCE_SEQ_HEADER,
};
use hafleet_renderer::adapters::bus::{deadletter_message, stream_message};
use hafleet_runtime::nats::Bus;
use std::collections::BTreeMap;

#[derive(Debug, clap::Subcommand)]
pub enum DeadLetterCommand {
    /// The newest parked messages, oldest first: dead-letter sequence, when, the routes
    /// stream sequence it came from, its size and why it could not be read.
    List {
        /// How many of the newest.
        #[arg(long, default_value_t = 50)]
        limit: u64,
    },
    /// One parked message: its headers, then its payload (JSON pretty-printed, sealed keys
    /// blanked).
    Show {
        /// Its dead-letter sequence, as `list` prints it.
        seq: u64,
    },
    /// Ask the running renderer to publish a parked route event again, into the routes stream,
    /// where it is applied in order like any other. The renderer refuses one it still cannot
    /// read, one of a watcher run that is over (its successor restated every Ingress), one
    /// older than the event it last applied for the same object, and anything but a route
    /// event (restart the watcher to restate those). Republish several in their order.
    Republish {
        /// Dead-letter sequences, as `list` prints them; republished in the order given.
        #[arg(required = true)]
        seqs: Vec<u64>,
    },
}

/// One parked message as `list -o json` prints it.
#[derive(Debug, serde::Serialize)]
struct Parked {
    seq: u64,
    time: String,
    subject: String,
    source_seq: Option<u64>,
    bytes: usize,
    error: String,
}

/// Runs `hafleet deadletter …`.
pub async fn deadletter(session: &Session, command: DeadLetterCommand) -> anyhow::Result<()> {
    let bus = session.connect().await?;
    match command {
        DeadLetterCommand::List { limit } => {
            let parked = list(&bus, limit).await?;
            if session.output != Output::Table {
                session.output.print(&parked)?;
            } else if parked.is_empty() {
                println!("no parked messages");
            } else {
                println!("{:>8}  {:<20}  {:>10}  {:>8}  ERROR", "SEQ", "TIME", "SOURCE", "BYTES");
                for p in &parked {
                    let source = p.source_seq.map_or("-".to_owned(), |s| s.to_string());
                    println!(
                        "{:>8}  {:<20}  {:>10}  {:>8}  {}",
                        p.seq, p.time, source, p.bytes, p.error
                    );
                }
            }
            Ok(())
        }
        DeadLetterCommand::Show { seq } => {
            let Some(m) = deadletter_message(&bus, seq).await? else {
                bail!("no parked message at {seq} (see `hafleet deadletter list`)");
            };
            if session.output != Output::Table {
                let headers: BTreeMap<String, Vec<String>> = m
                    .headers
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.iter().map(|v| v.to_string()).collect()))
                    .collect();
                let mut payload = serde_json::from_slice(&m.payload)
                    .unwrap_or_else(|_| serde_json::Value::String(payload_text(&m.payload)));
                blank_sealed_keys(&mut payload);
                return session.output.print(&serde_json::json!({
                    "seq": m.sequence, "subject": m.subject.to_string(),
                    "time": m.time.to_string(), "headers": headers, "payload": payload,
                }));
            }
            println!("seq: {}\nsubject: {}\ntime: {}", m.sequence, m.subject, m.time);
            for (name, values) in m.headers.iter() {
                for v in values {
                    println!("{name}: {v}");
                }
            }
            println!();
            println!("{}", payload_text(&m.payload));
            Ok(())
        }
        DeadLetterCommand::Republish { seqs } => {
            let mut done = Vec::new();
            for seq in seqs {
                let request = RepublishRequest { deadletter_seq: seq };
                let body = serde_json::to_vec(&request)?;
                let subject = DEADLETTER_REPUBLISH_SUBJECT.to_owned();
                let reply = session
                    .request(&bus, subject, body)
                    .await
                    .with_context(|| format!("parked message {seq}"))?;
                let HistoryReply::Republished { stream_seq } = reply else {
                    bail!("unexpected answer {reply:?}");
                };
                if session.output == Output::Table {
                    println!("parked message {seq} republished at routes sequence {stream_seq}");
                }
                done.push(serde_json::json!({"seq": seq, "stream_seq": stream_seq}));
            }
            match session.output {
                Output::Table => Ok(()),
                o => o.print(&done),
            }
        }
    }
}

/// The newest `limit` parked messages, oldest first.
async fn list(bus: &Bus, limit: u64) -> anyhow::Result<Vec<Parked>> {
    let Ok(mut stream) = bus.js.get_stream(DEADLETTER_STREAM).await else {
        return Ok(vec![]);
    };
    let state = stream.info().await.context("cannot read the dead-letter stream")?.state.clone();
    if state.messages == 0 {
        return Ok(vec![]);
    }
    let from = state.first_sequence.max(state.last_sequence.saturating_sub(limit.max(1) - 1));
    let mut out = Vec::new();
    for seq in from..=state.last_sequence {
        // One stream handle for every read (the list's first lookup made it).
        let Some(m) = stream_message(&stream, DEADLETTER_STREAM, seq).await? else {
            continue;
        };
        let header = |name: &str| m.headers.get(name).map(|v| v.as_str().to_owned());
        out.push(Parked {
            seq,
            time: m.time.to_string(),
            subject: m.subject.to_string(),
            source_seq: header(SOURCE_SEQ_HEADER).and_then(|s| s.parse().ok()),
            bytes: m.payload.len(),
            error: header(ERROR_HEADER).unwrap_or_default(),
        });
    }
    Ok(out)
}

/// A payload to print: JSON pretty-printed with every `sealed_key` blanked; anything else as
/// text, with what is not UTF-8 replaced.
fn payload_text(payload: &[u8]) -> String {
    match serde_json::from_slice::<serde_json::Value>(payload) {
        Ok(mut json) => {
            blank_sealed_keys(&mut json);
            serde_json::to_string_pretty(&json).unwrap_or_default()
        }
        Err(_) => String::from_utf8_lossy(payload).into_owned(),
    }
}

/// Blanks every `sealed_key` member, however deep: of no use to a reader, and not shown.
fn blank_sealed_keys(json: &mut serde_json::Value) {
    match json {
        serde_json::Value::Object(map) => {
            for (k, v) in map.iter_mut() {
                match k.as_str() {
                    "sealed_key" => *v = serde_json::Value::String("(sealed, not shown)".into()),
                    _ => blank_sealed_keys(v),
                }
            }
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(blank_sealed_keys),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sealed_keys_are_blanked_at_any_depth_and_other_payloads_print_as_text() {
        let text = payload_text(
            br#"{"kind":"default_cert","cert":{"sealed_key":"AAAA","chain":"x"},"more":[{"sealed_key":"B"}]}"#,
        );
        assert!(!text.contains("AAAA") && !text.contains("\"B\""), "{text}");
        assert_eq!(text.matches("(sealed, not shown)").count(), 2, "{text}");
        assert!(text.contains("\"chain\": \"x\""), "{text}");
        assert_eq!(payload_text(b"not json \xff"), "not json \u{fffd}");
    }
}
