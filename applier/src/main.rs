#[tokio::main]
async fn main() -> anyhow::Result<()> {
    hafleet_applier::Cli::parse_and_run().await
}
