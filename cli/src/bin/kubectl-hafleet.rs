//! `kubectl hafleet …`: kubectl runs a `kubectl-hafleet` on the PATH as its `hafleet` plugin.

#[tokio::main]
async fn main() -> std::process::ExitCode {
    hafleet_runtime::exit_code(hafleet_cli::parse_and_run("kubectl hafleet").await)
}
