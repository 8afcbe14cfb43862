//! The way teams push HAProxy configs today, for `hafleet-bench applier` to measure hafleet
//! against: `ansible-playbook` with a template task that validates with `haproxy -c` and a
//! handler that reloads HAProxy. ansible-core comes from the Python package registry into a
//! virtualenv kept under `target/` (installed on first use).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

use crate::HaproxyHost;

/// The ansible-core release line measured.
pub const ANSIBLE_CORE: &str = "ansible-core>=2.17,<2.19";

/// The playbook: render the config, check it with `haproxy -c` before it replaces the live
/// one (the template module writes a temp file and renames it), reload through the master
/// socket when it changed.
const PLAYBOOK: &str = r#"- hosts: haproxy
  gather_facts: false
  tasks:
    - name: haproxy.cfg
      ansible.builtin.template:
        src: haproxy.cfg.j2
        dest: "{{ config_path }}"
        validate: /usr/sbin/haproxy -c -q -f %s
      notify: reload haproxy
  handlers:
    - name: reload haproxy
      ansible.builtin.shell: echo reload | socat stdio "unix-connect:{{ master_socket }}"
"#;

/// A playbook run against some of the test hosts.
#[derive(Debug)]
pub struct Playbook {
    dir: PathBuf,
    venv: PathBuf,
}

impl Playbook {
    /// Installs ansible-core if needed and writes the inventory of `hosts`, the playbook and
    /// `template` (a Jinja2 template of the config, given `round`) into `dir`.
    pub fn new(dir: &Path, hosts: &[HaproxyHost], template: &str) -> Result<Playbook> {
        let venv = ensure_ansible()?;
        std::fs::create_dir_all(dir)?;
        let mut inventory = String::from("[haproxy]\n");
        for h in hosts {
            let keys = h.keys();
            writeln!(
                inventory,
                "{name} ansible_host=127.0.0.1 ansible_port={port} ansible_user={user} \
                 ansible_ssh_private_key_file={key} config_path={config} \
                 master_socket={socket}",
                name = h.name(),
                port = h.ssh_port(),
                user = h.ssh_user(),
                key = keys.identity.display(),
                config = h.config_path().display(),
                socket = h.master_socket().display(),
            )?;
        }
        let known_hosts = hosts.first().map(|h| h.keys().known_hosts.clone()).unwrap_or_default();
        writeln!(
            inventory,
            "\n[haproxy:vars]\nansible_python_interpreter=/usr/bin/python3\n\
             ansible_ssh_common_args='-F /dev/null -o UserKnownHostsFile={} \
             -o StrictHostKeyChecking=yes -o IdentitiesOnly=yes'",
            known_hosts.display()
        )?;
        std::fs::write(dir.join("inventory.ini"), inventory)?;
        std::fs::write(dir.join("site.yml"), PLAYBOOK)?;
        std::fs::write(dir.join("haproxy.cfg.j2"), template)?;
        Ok(Playbook { dir: dir.to_owned(), venv })
    }

    /// Runs the playbook with `round` and `forks` parallel hosts; fails if any host failed.
    pub fn run(&self, round: u64, forks: usize) -> Result<()> {
        let out = Command::new(self.venv.join("bin/ansible-playbook"))
            .current_dir(&self.dir)
            .args(["-i", "inventory.ini", "site.yml", "-f", &forks.to_string(), "-e"])
            .arg(format!("round={round}"))
            // As a team tuning it would: pipelining and kept-open SSH connections.
            .env("ANSIBLE_PIPELINING", "1")
            .env("ANSIBLE_SSH_ARGS", "-o ControlMaster=auto -o ControlPersist=600s")
            .env("ANSIBLE_CONTROL_PATH_DIR", self.dir.join("cp"))
            .env("ANSIBLE_LOCAL_TEMP", self.dir.join("tmp"))
            .env("ANSIBLE_HOST_KEY_CHECKING", "True")
            .env("ANSIBLE_RETRY_FILES_ENABLED", "False")
            .env("ANSIBLE_NOCOLOR", "1")
            .stdin(Stdio::null())
            .output()
            .context("run ansible-playbook")?;
        if !out.status.success() {
            bail!(
                "ansible-playbook failed ({}):\n{}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(())
    }
}

/// The virtualenv with ansible-core, made on first use under the workspace's `target/`.
fn ensure_ansible() -> Result<PathBuf> {
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/ansible-venv");
    if venv.join("bin/ansible-playbook").is_file() {
        return Ok(venv);
    }
    eprintln!("installing {ANSIBLE_CORE} into {} (once)", venv.display());
    let status = Command::new("python3").arg("-m").arg("venv").arg(&venv).status()?;
    anyhow::ensure!(status.success(), "python3 -m venv {}: {status}", venv.display());
    let status = Command::new(venv.join("bin/pip"))
        .args(["install", "-q", ANSIBLE_CORE])
        .status()
        .context("pip install ansible-core")?;
    anyhow::ensure!(status.success(), "pip install {ANSIBLE_CORE}: {status}");
    Ok(venv)
}
