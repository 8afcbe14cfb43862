//! `-o table|json|yaml`: text for people, or every field for programs.

use serde::Serialize;

/// How a command prints what it found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    /// Aligned columns and sentences.
    #[default]
    Table,
    /// Pretty-printed JSON.
    Json,
    /// YAML.
    Yaml,
}

impl Output {
    /// Prints `value` as JSON or YAML (a table is each command's own).
    pub fn print<T: Serialize>(self, value: &T) -> anyhow::Result<()> {
        println!("{}", self.text(value)?.trim_end());
        Ok(())
    }

    /// `value` as JSON or YAML text; as JSON for `Table` too.
    pub fn text<T: Serialize>(self, value: &T) -> anyhow::Result<String> {
        Ok(match self {
            Output::Yaml => serde_saphyr::to_string(value)?,
            Output::Json | Output::Table => serde_json::to_string_pretty(value)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_and_yaml_carry_the_same_fields() {
        let v = serde_json::json!({"fleet": "edge", "hosts": [{"host": "lb-1", "version": 3}], "pinned": null});
        let json: serde_json::Value =
            serde_json::from_str(&Output::Json.text(&v).unwrap()).unwrap();
        let yaml: serde_json::Value =
            serde_saphyr::from_str(&Output::Yaml.text(&v).unwrap()).unwrap();
        assert_eq!(json, v);
        assert_eq!(yaml, v);
    }
}
