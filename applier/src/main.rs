#[tokio::main]
async fn main() -> std::process::ExitCode {
    hafleet_runtime::exit_code(hafleet_applier::Cli::parse_and_run().await)
}
