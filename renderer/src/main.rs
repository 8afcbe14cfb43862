#[tokio::main]
async fn main() -> anyhow::Result<()> {
    hafleet_renderer::Cli::parse_and_run().await
}
