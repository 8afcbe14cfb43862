#[tokio::main]
async fn main() -> std::process::ExitCode {
    hafleet_runtime::exit_code(hafleet_renderer::Cli::parse_and_run().await)
}
