#[tokio::main]
async fn main() -> std::process::ExitCode {
    hafleet_runtime::exit_code(hafleet_cli::parse_and_run("hafleet").await)
}
