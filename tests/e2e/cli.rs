//! The operator's CLI, `hafleet`, as an operator runs it: a separate process, as the
//! `hafleet-operator` NATS user, against a running pipeline, every command in table and
//! machine form, and the failures an operator meets, each with a non-zero exit.

use crate::{World, expect_everywhere};
use anyhow::{Context as _, Result};
use hafleet_tests::{bin_path, eventually};
use std::time::Duration;

/// What one run of a CLI said.
struct Said {
    ok: bool,
    out: String,
    err: String,
}

/// Runs `binary ARGS` with exactly `env` (no `NO_COLOR`: output to a pipe must be plain by
/// itself).
async fn run(binary: &str, env: &[(&str, String)], args: &[&str]) -> Result<Said> {
    let out = tokio::process::Command::new(bin_path(binary))
        .args(args)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", "/nonexistent")
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .await
        .with_context(|| format!("running {binary}"))?;
    let said = Said {
        ok: out.status.success(),
        out: String::from_utf8_lossy(&out.stdout).into_owned(),
        err: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    assert!(!said.out.contains('\x1b') && !said.err.contains('\x1b'), "colour to a pipe: {args:?}");
    Ok(said)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_hafleet_command_answers_in_table_json_and_yaml_and_fails_clearly() -> Result<()> {
    let world = World::start().await?;
    let stack = &world.stack;
    world.route("shop", "shop.example.com", "/", "web").await?;
    expect_everywhere(stack, "shop.example.com", "/", 200, "web@").await?;
    let v1 = stack.latest_version().await?.context("a version")?.version;
    world.report("lb-2", v1).await?;
    let env = stack.nats.env_for("hafleet-operator");
    let hafleet = async |args: &[&str]| -> Result<String> {
        let said = run("hafleet", &env, args).await?;
        anyhow::ensure!(said.ok, "hafleet {args:?} failed: {}\n{}", said.err, stack.logs());
        Ok(said.out)
    };
    let json = async |args: &[&str]| -> Result<serde_json::Value> {
        let text = hafleet(&[args, &["-o", "json"]].concat()).await?;
        serde_json::from_str(&text).with_context(|| format!("{args:?}: not JSON: {text}"))
    };

    // fleets: the one fleet, its versions, both hosts on the published one. No --fleet is
    // needed anywhere below: the renderer knows one fleet only.
    let fleets =
        eventually(Duration::from_secs(20), "both hosts on the published version", || async {
            let fleets = json(&["fleets"]).await?;
            anyhow::ensure!(fleets[0]["hosts_on_published"] == 2, "{fleets}");
            Ok(fleets)
        })
        .await?;
    assert_eq!(fleets.as_array().map(Vec::len), Some(1), "{fleets}");
    assert_eq!(
        (fleets[0]["name"].as_str(), fleets[0]["newest"].as_u64()),
        (Some("edge"), Some(v1))
    );
    assert_eq!(fleets[0]["pinned"], serde_json::Value::Null);
    let yaml: serde_json::Value =
        serde_saphyr::from_str(&hafleet(&["fleets", "-o", "yaml"]).await?)?;
    assert_eq!(yaml, fleets, "YAML and JSON carry the same fields");
    let table = hafleet(&["fleets"]).await?;
    assert!(
        table.starts_with("FLEET") && table.contains("edge") && table.contains("2/2"),
        "{table}"
    );

    // status: every host, by name.
    let hosts = json(&["status"]).await?;
    let names: Vec<&str> =
        hosts.as_array().into_iter().flatten().filter_map(|h| h["host"].as_str()).collect();
    assert_eq!(names, ["lb-1", "lb-2"], "{hosts}");
    assert!(hafleet(&["status"]).await?.starts_with("HOST"));

    // history list / show / why / diff.
    world.route("blog", "blog.example.com", "/", "api").await?;
    expect_everywhere(stack, "blog.example.com", "/", 200, "api@").await?;
    let v2 = stack.latest_version().await?.context("a version")?.version;
    let list = json(&["history", "list"]).await?;
    assert_eq!(list[0]["number"], v2, "{list}");
    let yaml: serde_json::Value =
        serde_saphyr::from_str(&hafleet(&["history", "list", "-o", "yaml"]).await?)?;
    assert_eq!(yaml[0]["number"], v2, "{yaml}");
    assert!(hafleet(&["history", "list"]).await?.starts_with("VERSION"));
    let shown = hafleet(&["history", "show", &v2.to_string()]).await?;
    assert!(shown.contains("blog.example.com"), "{shown}");
    let shown = json(&["history", "show", &v2.to_string()]).await?;
    assert_eq!(shown["summary"]["number"], v2, "{shown}");
    let why = json(&["history", "why", &v2.to_string()]).await?;
    assert_eq!(why["causes"][0]["ingress"], "default/blog", "{why}");
    let seq = why["causes"][0]["stream_seq"].as_u64().context("a stream sequence")?;
    assert!(hafleet(&["history", "why", &v2.to_string()]).await?.contains("default/blog"));
    let diff = hafleet(&["history", "diff", &v1.to_string()]).await?;
    assert!(diff.contains("+") && diff.contains("blog.example.com"), "{diff}");
    let diff = json(&["history", "diff", &v1.to_string(), &v2.to_string()]).await?;
    assert!(diff["diff"].as_str().unwrap_or_default().contains("blog.example.com"), "{diff}");

    // replay: the state at the blog's event.
    let replayed = json(&["replay", "--until", &seq.to_string()]).await?;
    assert_eq!(replayed["until_seq"], seq, "{replayed}");
    assert!(replayed["bundle"].to_string().contains("blog.example.com"), "{replayed}");

    // sweep and deadletter: nothing held, nothing parked; both forms say so.
    assert_eq!(json(&["sweep", "status"]).await?, serde_json::json!([]));
    assert!(hafleet(&["sweep", "status"]).await?.contains("no sweep held"));
    assert_eq!(json(&["deadletter", "list"]).await?, serde_json::json!([]));
    assert!(hafleet(&["deadletter", "list"]).await?.contains("no parked messages"));

    // rollback and resume, in JSON.
    let rolled = json(&["rollback", &v1.to_string()]).await?;
    let pinned = rolled["pinned"].as_u64().context("pinned")?;
    assert_eq!(rolled["published"], pinned, "{rolled}");
    expect_everywhere(stack, "blog.example.com", "/", 404, "").await?;
    assert_eq!(json(&["fleets"]).await?[0]["pinned"], pinned);
    let resumed = json(&["resume"]).await?;
    assert_eq!(resumed["pinned"], serde_json::Value::Null, "{resumed}");
    expect_everywhere(stack, "blog.example.com", "/", 200, "api@").await?;

    // What needs no NATS: permissions, keygen, version, completions.
    let perms = hafleet(&["nats-permissions", "--fleet", "edge"]).await?;
    assert!(perms.contains("HAFLEET_APPLIER_EDGE = {"), "{perms}");
    assert!(
        hafleet(&["nats-permissions", "--operator-all"]).await?.contains("HAFLEET_OPERATOR = {")
    );
    let dir = tempfile::tempdir()?;
    let id = dir.path().join("edge.identity");
    let id_arg = id.display().to_string();
    assert!(hafleet(&["keygen", "--out", &id_arg]).await?.starts_with("age1"));
    let again = run("hafleet", &env, &["keygen", "--out", &id_arg]).await?;
    assert!(!again.ok && again.err.contains("never overwritten"), "{}", again.err);
    let version = json(&["version"]).await?;
    assert!(version["commit"].as_str().is_some_and(|c| !c.is_empty()), "{version}");
    assert!(hafleet(&["--version"]).await?.contains("(commit "));
    for shell in ["bash", "zsh", "fish"] {
        let script = hafleet(&["completion", shell]).await?;
        assert!(script.contains("rollback") && script.contains("deadletter"), "{shell}");
    }

    // Contexts: the settings saved once, then nothing but the file and the context's name.
    let config = dir.path().join("config.yaml").display().to_string();
    let mut set = vec!["context", "set", "lab", "--config", &config];
    let given: Vec<(String, String)> = env
        .iter()
        .map(|(k, v)| {
            (k.trim_start_matches("HAFLEET_").to_lowercase().replace('_', "-"), v.clone())
        })
        .collect();
    let flags: Vec<String> =
        given.iter().flat_map(|(k, v)| [format!("--{k}"), v.clone()]).collect();
    set.extend(flags.iter().map(String::as_str));
    set.extend(["--fleet", "edge"]);
    run("hafleet", &[], &set).await.and_then(|s| {
        anyhow::ensure!(s.ok, "{}", s.err);
        Ok(())
    })?;
    let saved = std::fs::read_to_string(&config)?;
    assert!(!saved.contains(&stack.nats.seed_of("hafleet-operator")?), "a seed in the context");
    let by_context =
        run("hafleet", &[("HAFLEET_CONFIG", config.clone())], &["status", "-o", "json"]).await?;
    assert!(by_context.ok, "{}", by_context.err);
    let by_context: serde_json::Value = serde_json::from_str(&by_context.out)?;
    assert_eq!(by_context[1]["host"], "lb-2", "{by_context}");
    let unknown =
        run("hafleet", &[("HAFLEET_CONFIG", config.clone())], &["--context", "prod", "fleets"])
            .await?;
    assert!(
        !unknown.ok && unknown.err.contains("no context \"prod\"") && unknown.err.contains("lab"),
        "{}",
        unknown.err
    );

    // A second context, chosen, listed in both forms, and deleted.
    let with_config = [("HAFLEET_CONFIG", config.clone())];
    for args in [
        &["context", "set", "prod", "--nats-url", "nats://127.0.0.1:1"][..],
        &["context", "use", "prod"],
    ] {
        let said = run("hafleet", &with_config, args).await?;
        assert!(said.ok, "{args:?}: {}", said.err);
    }
    let listed = run("hafleet", &with_config, &["context", "list", "-o", "json"]).await?;
    let listed: serde_json::Value = serde_json::from_str(&listed.out)?;
    assert_eq!(listed["current-context"], "prod", "{listed}");
    assert_eq!(listed["contexts"]["lab"]["fleet"], "edge", "{listed}");
    let table = run("hafleet", &with_config, &["context", "list"]).await?.out;
    assert!(table.lines().any(|l| l.starts_with('*') && l.contains("prod")), "{table}");
    let down = run("hafleet", &with_config, &["fleets"]).await?;
    assert!(!down.ok && down.err.contains("context \"prod\""), "{}", down.err);
    let said = run("hafleet", &with_config, &["context", "delete", "prod"]).await?;
    assert!(said.ok, "{}", said.err);
    let listed = run("hafleet", &with_config, &["context", "list", "-o", "yaml"]).await?.out;
    assert!(!listed.contains("prod") && listed.contains("lab"), "{listed}");

    // As kubectl's plugin, the same program.
    let plugin = run("kubectl-hafleet", &env, &["fleets", "-o", "json"]).await?;
    assert!(plugin.ok && plugin.out.contains("\"edge\""), "{}", plugin.err);
    let help = run("kubectl-hafleet", &env, &["--help"]).await?;
    assert!(help.out.contains("Usage: kubectl hafleet"), "{}", help.out);

    // Failures: a clear word and a non-zero exit.
    let fail = async |env: &[(&str, String)], args: &[&str], says: &[&str]| -> Result<()> {
        let said = run("hafleet", env, args).await?;
        assert!(!said.ok, "{args:?} succeeded: {}", said.out);
        for word in says {
            assert!(said.err.contains(word), "{args:?}: no {word:?} in {}", said.err);
        }
        Ok(())
    };
    fail(&env, &["history", "list", "--fleet", "nowhere"], &["unknown fleet", "(fleets: edge)"])
        .await?;
    fail(&env, &["history", "show", "999"], &["no such version"]).await?;
    fail(&env, &["rollback", "999", "-o", "json"], &["no such version"]).await?;
    fail(&env, &["sweep", "confirm", "--snapshot", "1"], &["no such sweep"]).await?;
    fail(&env, &["deadletter", "show", "7"], &["no parked message at 7"]).await?;
    let nowhere = [("HAFLEET_NATS_URL", "nats://127.0.0.1:1".to_owned())];
    fail(&nowhere, &["fleets"], &["cannot connect to NATS", "--nats-url"]).await?;
    fail(&env, &["nats-permissions"], &["whose permissions?"]).await?;
    let moved = run("hafleet-renderer", &env, &["history", "list"]).await?;
    assert!(!moved.ok && moved.err.contains("run `hafleet history"), "{}", moved.err);
    let moved = run("hafleet-applier", &env, &["status"]).await?;
    assert!(!moved.ok && moved.err.contains("run `hafleet status"), "{}", moved.err);

    // The components log to files here, never to a terminal: no colour codes either.
    for c in [
        hafleet_tests::stack::Component::Watcher,
        hafleet_tests::stack::Component::Renderer,
        hafleet_tests::stack::Component::Applier,
    ] {
        let log = std::fs::read(stack.log_path(c))?;
        assert!(!log.contains(&0x1b), "colour codes in {}'s log", c.binary());
    }
    Ok(())
}
