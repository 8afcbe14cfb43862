//! The container image of `deploy/container`: built here with podman from the binaries under
//! test, and each component run from it, as its non-root user, against the test stack.

use crate::{World, expect_everywhere};
use anyhow::{Context, Result, bail};
use hafleet_tests::proc::random_token;
use hafleet_tests::stack::{Component, Stack, workspace_file};
use hafleet_tests::{ChildGuard, bin_path};
use std::os::unix::fs::{PermissionsExt, chown};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The user the image runs as.
const UID: u32 = 65532;

/// podman as these machines run it: runc with cgroupfs (crun refuses their hybrid cgroup
/// mounts), CNI (no netavark), and limits no higher than the test process's own (a container
/// may not raise them).
fn podman(conf: &Path) -> Command {
    let mut cmd = Command::new("podman");
    cmd.env("CONTAINERS_CONF", conf);
    cmd
}

fn run(cmd: &mut Command) -> Result<String> {
    let out = cmd.output().with_context(|| format!("{cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// A container that is removed on drop (killing the `podman run` client would leave it
/// running).
struct Container {
    conf: PathBuf,
    name: String,
    _client: ChildGuard,
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = podman(&self.conf).args(["rm", "--force", "--time", "0", &self.name]).output();
    }
}

/// Environment variables, as (name, value).
type Env = Vec<(String, String)>;

/// The files of a component's settings, copied where its container reads them (`/hafleet`,
/// owned by the image's user) and the setting rewritten to that path.
fn containerize(stack: &Stack, mounted: &Path, c: Component) -> Result<(Env, Vec<String>)> {
    let cmd = stack.command(c);
    let args = cmd.get_args().map(|a| a.to_string_lossy().into_owned()).collect();
    let mut env = Vec::new();
    for (key, value) in cmd.get_envs() {
        let (key, Some(value)) = (key.to_string_lossy().into_owned(), value) else { continue };
        let value = value.to_string_lossy().into_owned();
        let path = Path::new(&value);
        let inside = |name: &str| format!("/hafleet/{}-{name}", c.binary());
        let value = if key == "HAFLEET_DATA_DIR" {
            let dir = mounted.join(format!("{}-data", c.binary()));
            std::fs::create_dir_all(&dir)?;
            chown(&dir, Some(UID), Some(UID))?;
            inside("data")
        } else if key == "KUBECONFIG" {
            // It names the API server's CA by path: the copy names the copy.
            let ca = stack.kube.ca_cert_path();
            let text = std::fs::read_to_string(path)?;
            let text = text.replace(&ca.display().to_string(), &inside("ca.crt"));
            write_owned(&mounted.join(format!("{}-ca.crt", c.binary())), &std::fs::read(&ca)?)?;
            write_owned(&mounted.join(format!("{}-kubeconfig", c.binary())), text.as_bytes())?;
            inside("kubeconfig")
        } else if path.is_absolute() && path.is_file() {
            let name = path.file_name().context("file name")?.to_string_lossy().into_owned();
            write_owned(&mounted.join(format!("{}-{name}", c.binary())), &std::fs::read(path)?)?;
            inside(&name)
        } else {
            value
        };
        env.push((key, value));
    }
    Ok((env, args))
}

fn write_owned(path: &Path, bytes: &[u8]) -> Result<()> {
    std::fs::write(path, bytes)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    chown(path, Some(UID), Some(UID))?;
    Ok(())
}

/// Builds the image from the binaries under test with `deploy/container/build.sh`, then runs
/// the watcher, the renderer and the applier from it in place of the stack's own processes:
/// read-only, with no capabilities, as the manifests run them. A new Ingress is served
/// through every HAProxy host, each component runs as user 65532, and the image holds no
/// shell.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_image_runs_each_component_as_its_own_user_and_traffic_flows() -> Result<()> {
    let mut world = World::start().await?;
    world.route("before", "before.example.com", "/", "web").await?;
    expect_everywhere(&world.stack, "before.example.com", "/", 200, "web@").await?;

    let conf = world.stack.dir().join("containers.conf");
    std::fs::write(
        &conf,
        "[engine]\nruntime = \"runc\"\ncgroup_manager = \"cgroupfs\"\n\n[network]\nnetwork_backend = \"cni\"\n",
    )?;
    let tag = format!("localhost/hafleet-e2e:{}", &random_token()[..12]);
    let binaries = bin_path("hafleet-watcher");
    let binaries = binaries.parent().context("binaries folder")?;
    let mut build = Command::new(workspace_file("deploy/container/build.sh"));
    build.env("CONTAINERS_CONF", &conf).arg("--binaries").arg(binaries).args(["--tag", &tag]);
    let built = tokio::task::spawn_blocking(move || run(&mut build)).await??;
    assert_eq!(built, tag);
    struct Image(PathBuf, String);
    impl Drop for Image {
        fn drop(&mut self) {
            let _ = podman(&self.0).args(["rmi", "--force", &self.1]).output();
        }
    }
    let _image = Image(conf.clone(), tag.clone());

    let mounted = world.stack.dir().join("in-containers");
    std::fs::create_dir_all(&mounted)?;
    std::fs::set_permissions(&mounted, std::fs::Permissions::from_mode(0o755))?;
    let mut containers = Vec::new();
    for c in [Component::Renderer, Component::Applier, Component::Watcher] {
        world.stack.kill(c);
        let (env, args) = containerize(&world.stack, &mounted, c)?;
        let name = format!("hafleet-e2e-{}-{}", c.binary(), &random_token()[..8]);
        let mut cmd = podman(&conf);
        cmd.args(["run", "--rm", "--name", &name, "--network", "host"])
            .args(["--ulimit", "nofile=4096:4096", "--ulimit", "nproc=4096:4096"])
            // As the manifests run it: a read-only root (podman puts a tmpfs on /tmp, where
            // the applier keeps its ssh control sockets, as the applier's emptyDir does), no
            // capabilities, no privilege escalation.
            .args(["--read-only", "--cap-drop", "ALL", "--security-opt", "no-new-privileges"])
            .arg("--volume")
            .arg(format!("{}:/hafleet", mounted.display()));
        for (key, value) in &env {
            cmd.arg("--env").arg(format!("{key}={value}"));
        }
        cmd.arg(&tag).arg(c.binary()).args(args);
        let log = world.stack.dir().join(format!("{}-container.log", c.binary()));
        let client = ChildGuard::spawn(&name, &mut cmd, &log)?;
        containers.push(Container { conf: conf.clone(), name, _client: client });
    }

    world.route("boxed", "boxed.example.com", "/", "api").await?;
    expect_everywhere(&world.stack, "boxed.example.com", "/", 200, "api@").await?;
    expect_everywhere(&world.stack, "before.example.com", "/", 200, "web@").await?;
    for container in &containers {
        let pid =
            run(podman(&conf).args(["inspect", "--format", "{{.State.Pid}}", &container.name]))?;
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
        let uid = status.lines().find(|l| l.starts_with("Uid:")).unwrap_or_default();
        assert_eq!(uid.split_whitespace().nth(1), Some("65532"), "{}: {uid}", container.name);
    }
    let mut shell = podman(&conf);
    shell.args(["run", "--rm", "--network", "host", "--ulimit", "nofile=4096:4096"]);
    shell.args(["--ulimit", "nproc=4096:4096", &tag, "/bin/sh", "-c", "true"]);
    let refused = run(&mut shell).expect_err("the image has a shell").to_string();
    assert!(refused.contains("/bin/sh: no such file or directory"), "{refused}");
    Ok(())
}
