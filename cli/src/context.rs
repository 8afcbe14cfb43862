//! The context file: named sets of connection settings and a default fleet, as kubectl's
//! kubeconfig has contexts, so an operator of several installations says `--context prod`
//! (or `HAFLEET_CONTEXT=prod`) instead of four flags.
//!
//! ```yaml
//! current-context: prod
//! contexts:
//!   prod:
//!     nats-url: tls://nats-1.example.net:4222,tls://nats-2.example.net:4222
//!     nats-ca: /etc/hafleet/nats-ca.pem
//!     nats-creds: /home/me/.config/hafleet/operator.creds
//!     fleet: edge
//! ```
//!
//! It holds file names, never a secret: credentials stay in their own files.

use crate::output::Output;
use crate::session::GlobalArgs;
use anyhow::{Context as _, bail};
use hafleet_proto::FleetName;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// One context's settings; each unset one falls to the default.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct Settings {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nats_url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nats_ca: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nats_cert: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nats_key: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nats_creds: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fleet: Option<FleetName>,
}

impl Settings {
    /// These settings, each unset one taken from `base`.
    pub fn over(self, base: &Settings) -> Settings {
        Settings {
            nats_url: self.nats_url.or_else(|| base.nats_url.clone()),
            nats_ca: self.nats_ca.or_else(|| base.nats_ca.clone()),
            nats_cert: self.nats_cert.or_else(|| base.nats_cert.clone()),
            nats_key: self.nats_key.or_else(|| base.nats_key.clone()),
            nats_creds: self.nats_creds.or_else(|| base.nats_creds.clone()),
            fleet: self.fleet.or_else(|| base.fleet.clone()),
        }
    }
}

/// The file's content.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct Contexts {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_context: Option<String>,
    #[serde(default)]
    pub contexts: BTreeMap<String, Settings>,
}

/// The file, where it is, and what it holds (empty when it does not exist).
#[derive(Debug)]
pub struct ContextFile {
    pub path: Option<PathBuf>,
    pub contexts: Contexts,
}

/// `$XDG_CONFIG_HOME/hafleet/config.yaml`, else `~/.config/hafleet/config.yaml`.
fn default_path() -> Option<PathBuf> {
    let non_empty = |v: std::ffi::OsString| (!v.is_empty()).then(|| PathBuf::from(v));
    let config = std::env::var_os("XDG_CONFIG_HOME")
        .and_then(non_empty)
        .or_else(|| std::env::var_os("HOME").and_then(non_empty).map(|h| h.join(".config")))?;
    Some(config.join("hafleet").join("config.yaml"))
}

impl ContextFile {
    /// Reads `path`, else the default file; a missing file holds no contexts, unless it was
    /// given and `given_must_exist` (a command run with a context file it cannot find).
    pub fn load(path: Option<&Path>, given_must_exist: bool) -> anyhow::Result<ContextFile> {
        let (path, must_exist) = match path {
            Some(p) => (Some(p.to_owned()), given_must_exist),
            None => (default_path(), false),
        };
        let Some(file) = &path else {
            return Ok(ContextFile { path, contexts: Contexts::default() });
        };
        let text = match std::fs::read_to_string(file) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !must_exist => {
                return Ok(ContextFile { path, contexts: Contexts::default() });
            }
            Err(e) => return Err(e).with_context(|| format!("cannot read {}", file.display())),
        };
        let contexts =
            parse(&text).with_context(|| format!("{} is not a context file", file.display()))?;
        Ok(ContextFile { path, contexts })
    }

    /// The context `name` names (else the current one), with its settings; `None` when no
    /// context is chosen.
    pub fn chosen(&self, name: Option<&str>) -> anyhow::Result<Option<(&str, &Settings)>> {
        let Some(name) = name.or(self.contexts.current_context.as_deref()) else { return Ok(None) };
        match self.contexts.contexts.get_key_value(name) {
            Some((name, settings)) => Ok(Some((name.as_str(), settings))),
            None => bail!(
                "no context {name:?} in {}; there are: {} (see `hafleet context list`)",
                self.shown_path(),
                self.names()
            ),
        }
    }

    fn names(&self) -> String {
        match self.contexts.contexts.is_empty() {
            true => "none".to_owned(),
            false => self.contexts.contexts.keys().cloned().collect::<Vec<_>>().join(", "),
        }
    }

    fn shown_path(&self) -> String {
        self.path.as_ref().map_or("(no context file)".to_owned(), |p| p.display().to_string())
    }

    /// Writes the file (its folder made if missing; written aside, then renamed over it).
    fn save(&self) -> anyhow::Result<()> {
        let path = self.path.as_ref().context("no context file: give --config FILE")?;
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
        }
        let text = serde_saphyr::to_string(&self.contexts)?;
        let aside = path.with_extension("yaml.new");
        std::fs::write(&aside, text)
            .with_context(|| format!("cannot write {}", aside.display()))?;
        std::fs::rename(&aside, path).with_context(|| format!("cannot write {}", path.display()))
    }
}

/// The file's text as contexts.
pub fn parse(text: &str) -> anyhow::Result<Contexts> {
    if text.trim().is_empty() {
        return Ok(Contexts::default());
    }
    Ok(serde_saphyr::from_str(text)?)
}

#[derive(Debug, clap::Subcommand)]
pub enum ContextCommand {
    /// Every context, the current one marked.
    List,
    /// Make NAME the current context.
    Use { name: String },
    /// Create context NAME or change it: the connection flags given on this command line
    /// (--nats-url, --nats-ca, --nats-cert, --nats-key, --nats-creds, --fleet) replace its
    /// settings; the others stay. The first context made becomes the current one.
    Set { name: String },
    /// Remove context NAME.
    Delete { name: String },
}

/// Runs `hafleet context …`. `given` are the global flags given on the command line itself
/// (not by the environment), which `set` writes.
pub fn run(command: ContextCommand, global: &GlobalArgs, given: &Settings) -> anyhow::Result<()> {
    let mut file = ContextFile::load(global.config.as_deref(), false)?;
    match command {
        ContextCommand::List => {
            let current = file.contexts.current_context.clone();
            if global.output != Output::Table {
                return global.output.print(&file.contexts);
            }
            let mut rows = vec![[
                "CURRENT".to_owned(),
                "NAME".into(),
                "NATS".into(),
                "CREDENTIALS".into(),
                "FLEET".into(),
            ]];
            for (name, s) in &file.contexts.contexts {
                let shown = |p: &Option<PathBuf>| {
                    p.as_ref().map_or("-".into(), |p| p.display().to_string())
                };
                rows.push([
                    if current.as_deref() == Some(name) { "*".into() } else { String::new() },
                    name.clone(),
                    s.nats_url.clone().unwrap_or_else(|| "-".into()),
                    shown(&s.nats_creds),
                    s.fleet.as_ref().map_or("-".into(), |f| f.to_string()),
                ]);
            }
            if rows.len() == 1 {
                println!(
                    "no contexts in {}; make one with `hafleet context set NAME --nats-url URL`",
                    file.shown_path()
                );
                return Ok(());
            }
            print!("{}", hafleet_runtime::table(&rows));
            Ok(())
        }
        ContextCommand::Use { name } => {
            file.chosen(Some(&name))?;
            file.contexts.current_context = Some(name.clone());
            file.save()?;
            println!("current context: {name}");
            Ok(())
        }
        ContextCommand::Set { name } => {
            valid_name(&name)?;
            let mut given = given.clone();
            for path in [
                &mut given.nats_ca,
                &mut given.nats_cert,
                &mut given.nats_key,
                &mut given.nats_creds,
            ]
            .into_iter()
            .flatten()
            {
                *path = std::path::absolute(&*path)?;
            }
            if let Some(url) = &given.nats_url
                && url.contains('@')
            {
                bail!("keep credentials out of the URL: give --nats-creds FILE instead");
            }
            let old = file.contexts.contexts.remove(&name).unwrap_or_default();
            let new = given.over(&old);
            if new.nats_cert.is_some() != new.nats_key.is_some() {
                bail!("--nats-cert and --nats-key go together: give both or neither");
            }
            file.contexts.contexts.insert(name.clone(), new);
            let first = file.contexts.current_context.is_none();
            if first {
                file.contexts.current_context = Some(name.clone());
            }
            file.save()?;
            println!(
                "context {name} saved in {}{}",
                file.shown_path(),
                if first { " (current)" } else { "" }
            );
            Ok(())
        }
        ContextCommand::Delete { name } => {
            file.chosen(Some(&name))?;
            file.contexts.contexts.remove(&name);
            if file.contexts.current_context.as_deref() == Some(&name) {
                file.contexts.current_context = None;
            }
            file.save()?;
            println!("context {name} deleted");
            Ok(())
        }
    }
}

/// A context's name: letters, digits, `-`, `_`, `.`, at most 63.
fn valid_name(name: &str) -> anyhow::Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if !ok {
        bail!("{name:?} is no context name: use letters, digits, '-', '_' and '.', at most 63");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_context_file_reads_back_as_written_and_unknown_keys_are_refused() {
        let text = "current-context: prod\ncontexts:\n  prod:\n    nats-url: tls://n:4222\n    \
                    nats-creds: /c/op.creds\n    fleet: edge\n  lab: {}\n";
        let c = parse(text).unwrap();
        assert_eq!(c.current_context.as_deref(), Some("prod"));
        assert_eq!(c.contexts["prod"].fleet.as_ref().map(|f| f.as_str()), Some("edge"));
        assert_eq!(c.contexts["lab"], Settings::default());
        assert_eq!(parse(&serde_saphyr::to_string(&c).unwrap()).unwrap(), c);
        let e = parse("contexts:\n  prod:\n    nats-password: x\n").unwrap_err();
        assert!(format!("{e:#}").contains("nats-password"), "{e:#}");
        assert!(parse("contexts:\n  prod:\n    fleet: Not_A_Fleet\n").is_err());
        assert_eq!(parse("").unwrap(), Contexts::default());
    }

    #[test]
    fn a_named_context_must_exist_and_the_error_lists_those_that_do() {
        let file = ContextFile {
            path: Some("/x/config.yaml".into()),
            contexts: parse("contexts:\n  prod: {}\n  lab: {}\n").unwrap(),
        };
        assert!(file.chosen(None).unwrap().is_none());
        assert_eq!(file.chosen(Some("lab")).unwrap().map(|(n, _)| n), Some("lab"));
        let e = file.chosen(Some("staging")).unwrap_err().to_string();
        assert!(
            e.contains("no context \"staging\" in /x/config.yaml; there are: lab, prod"),
            "{e}"
        );
        assert!(valid_name("prod-eu.1").is_ok());
        assert!(valid_name("a b").is_err() && valid_name("").is_err());
    }
}
