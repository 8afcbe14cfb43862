#[tokio::main]
async fn main() -> anyhow::Result<()> {
    hafleet_watcher::Cli::parse_and_run().await
}
