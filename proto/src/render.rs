//! What decides how the renderer turns desired state into a config: its template (the text
//! itself) and its render options. The renderer publishes them on
//! [`crate::ROUTES_RENDER_SUBJECT`], into the routes stream, whenever a start finds them
//! changed, and renders with the ones the stream has reached: so a replay to any point of the
//! stream renders with the settings of that point, byte for byte, without being told them.

use serde::{Deserialize, Serialize};

/// The renderer's settings at a point of the routes stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RenderSettings {
    pub schema: u32,
    /// The minijinja template, whole (the built-in one's text when no other was given).
    pub template: String,
    /// Whether it is the built-in template of the renderer that published it.
    pub builtin: bool,
    /// Most nodes in a `Cluster` Service's backend (0: all).
    pub servers_per_backend: usize,
    /// Empty backends kept for new Services while node health checks are on.
    pub spare_backends: usize,
    /// Node health checks: port and path (`None`: every server checks itself).
    pub node_health: Option<(u16, crate::HttpPath)>,
    /// The mass-deletion guard: a percentage of a fleet's routes, and a least number.
    pub sweep_guard_percent: u8,
    pub sweep_guard_min_routes: usize,
}

impl RenderSettings {
    /// The template's sha256, to name it in logs and causes.
    pub fn template_sha256(&self) -> String {
        crate::sha256_hex(self.template.as_bytes())
    }

    /// How these differ from `old`, one line per setting, as a cause lists them.
    pub fn describe(&self) -> Vec<String> {
        let template = match self.builtin {
            true => format!("template built-in {}", &self.template_sha256()[..12]),
            false => format!("template {}", &self.template_sha256()[..12]),
        };
        let health = match &self.node_health {
            Some((port, path)) => format!("node health :{port}{path}"),
            None => "node health off".to_owned(),
        };
        vec![
            template,
            format!("servers per backend {}", self.servers_per_backend),
            format!("spare backends {}", self.spare_backends),
            health,
            format!(
                "sweep guard {}% of at least {} routes",
                self.sweep_guard_percent, self.sweep_guard_min_routes
            ),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_settings_round_trip_on_the_routes_stream_and_describe_themselves() {
        let s = RenderSettings {
            schema: crate::SCHEMA_VERSION,
            template: "global\n".into(),
            builtin: false,
            servers_per_backend: 3,
            spare_backends: 0,
            node_health: Some((10256, crate::HttpPath::new("/healthz").unwrap())),
            sweep_guard_percent: 50,
            sweep_guard_min_routes: 10,
        };
        let msg = crate::RouteMessage::Render(s.clone());
        assert_eq!(crate::RouteMessage::decode(&msg.encode()).unwrap(), msg);
        let lines = s.describe();
        assert!(
            lines[0].starts_with("template ") && lines.contains(&"servers per backend 3".into())
        );
        assert!(lines.contains(&"node health :10256/healthz".to_owned()), "{lines:?}");
        // Only on its own subject: on a fleet's (where a watcher may publish) it is forged.
        assert!(msg.on_its_subject(crate::ROUTES_RENDER_SUBJECT));
        assert!(!msg.on_its_subject("hafleet.routes.edge"));
        assert!(!msg.on_its_subject(crate::ROUTES_CONFIRM_SUBJECT));
    }
}
